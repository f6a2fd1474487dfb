"""``man/gpualloc.1`` from the declarations, so the manual never drifts from ``--help``.

Every command and option comes from the declarations ``--help`` is rendered from
(:mod:`gpualloc.cli.declare`: help texts, option names, metavars, defaults and environment
variables); ENVIRONMENT and EXIT STATUS come from the same tables ``--help`` and the README
use. ``scripts/build_docs.py`` writes the file and a test
fails when the committed one is stale. The output is plain man(7) roff: ``man -l`` renders it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from gpualloc import __version__
from gpualloc.errors import EXIT_CODE_DESCRIPTIONS, ExitCode

if TYPE_CHECKING:
    from gpualloc.cli.declare import Opt

SUMMARY = "topology-aware GPU allocator and job launcher for a shared multi-GPU host"

FILES = (
    (
        "/var/tmp/gpualloc/ledger.json",
        "The host ledger: who holds which GPUs, and the waiting queue (directory set by "
        "GPUALLOC_STATE_DIR or state_dir). Recorded topologies keep theirs beside it, as "
        "ledger@NAME-DIGEST.json; a Slurm job's sub-jobs in ledger@...+slurm-job-ID.json.",
    ),
    (
        "/var/tmp/gpualloc/ledger.lock",
        "Held (flock) by every change of the ledger, for milliseconds; a process holding it "
        "longer than lock_timeout is named, and the command exits 16.",
    ),
    (
        "/var/tmp/gpualloc/ledger.UID.good.json",
        "Each user's copy of the last ledger they wrote, to recover a damaged ledger.json from.",
    ),
    (
        "/var/tmp/gpualloc/ledger.root-journal.json",
        "Root's journal: what the Slurm Prolog and Epilog recorded while another process held "
        "the lock; every gpualloc applies it.",
    ),
    (
        "/var/tmp/gpualloc/slurm-hooks.log",
        "What the Slurm Prolog, Epilog and TaskProlog did, and what went wrong.",
    ),
    (
        "/etc/gpualloc/config.toml",
        "System-wide defaults (see gpualloc config show).",
    ),
    (
        "$XDG_CONFIG_HOME/gpualloc/config.toml",
        "A user's defaults (~/.config/gpualloc/config.toml), over the system file.",
    ),
    ("~/.cache/gpualloc/", "Discovered topologies (GPUALLOC_CACHE_DIR); --refresh probes again."),
)

EXAMPLES = (
    (
        "Run a bandwidth-hungry 2-GPU job on the best free pair, and free it when it ends:",
        "gpualloc run -n 2 --sensitive -- python train.py",
    ),
    ("What this host looks like:", "gpualloc topo show"),
    ("What gpualloc would pick for 3 GPUs, and why:", "gpualloc plan -n 3 --explain"),
    ("Try it without a GPU, on a bundled DGX-1:", "gpualloc -t dgx1-v100 plan -n 2 --compare"),
    (
        "Queue until the GPUs are free, for at most an hour:",
        "gpualloc run -n 4 --wait --timeout 1h -- ./job",
    ),
    ("Who holds what:", "gpualloc status"),
    (
        "Compare policies on the MAPA paper's workload:",
        "gpualloc -t dgx1-v100 simulate --generate mapa",
    ),
)

_CODE = re.compile(r"`([^`]+)`")
SEE_ALSO = "nvidia-smi(1), numactl(8), slurm.conf(5), gres.conf(5)"


def escape(text: str) -> str:
    """Text safe in roff: backslashes, hyphens (as minus signs, so that options and commands
    copy as typed), and lines starting with . or '."""
    text = text.replace("\\", "\\e")
    text = text.replace("-", "\\-")  # every hyphen: commands stay copy-pastable
    return "\n".join(
        "\\&" + line if line.startswith((".", "'")) else line for line in text.splitlines()
    )


def _paragraphs(text: str) -> str:
    """Help text (blank-line separated paragraphs, wrapped lines) as roff paragraphs."""
    parts = [" ".join(part.split()) for part in re.split(r"\n\s*\n", text.strip()) if part.strip()]
    return "\n.PP\n".join(_CODE.sub(r"\\fB\1\\fR", escape(part)) for part in parts)


def _option_lines(options: Iterable[Opt]) -> list[str]:
    """Each option as ``--help`` shows it (names, what it takes, help, default, variable)."""
    from gpualloc.cli.help import described, spelled

    lines = []
    for opt in options:
        lines += [".TP", f"\\fB{escape(spelled(opt))}\\fR", _paragraphs(described(opt))]
    return lines


def render() -> str:
    """The manual page of gpualloc, from its declarations (every command module imported)."""
    from gpualloc.cli.commands import ENVIRONMENT_VARIABLES, GLOBAL_OPTIONS, HELP, every_command
    from gpualloc.cli.declare import usage
    from gpualloc.cli.help import clean

    lines = [
        f'.TH GPUALLOC 1 "" "gpualloc {__version__}" "User Commands"',
        ".SH NAME",
        f"gpualloc \\- {SUMMARY}",
        ".SH SYNOPSIS",
        ".B gpualloc",
        "[\\fIGLOBAL OPTIONS\\fR] \\fICOMMAND\\fR [\\fIOPTIONS\\fR] [\\fIARGS\\fR]",
        ".SH DESCRIPTION",
        _paragraphs(HELP),
        ".SH COMMANDS",
    ]
    for path, command in every_command():
        lines += [f'.SS "{escape(usage(path, command))}"', _paragraphs(clean(command.help))]
        lines += _option_lines(command.options)
    lines += [".SH OPTIONS", "Global options come before the command."]
    lines += _option_lines(GLOBAL_OPTIONS)
    lines.append(".SH ENVIRONMENT")
    for name, meaning in ENVIRONMENT_VARIABLES:
        lines += [".TP", f"\\fB{escape(name)}\\fR", _paragraphs(meaning)]
    lines.append(".SH EXIT STATUS")
    lines.append("A job run by gpualloc run exits with its own status. gpualloc itself exits:")
    for code in ExitCode:
        name = code.name.lower().replace("_", "-")
        lines += [".TP", f"\\fB{int(code)}\\fR ({name})", escape(EXIT_CODE_DESCRIPTIONS[code])]
    lines.append(".SH FILES")
    for name, meaning in FILES:
        lines += [".TP", f"\\fI{escape(name)}\\fR", _paragraphs(meaning)]
    lines.append(".SH EXAMPLES")
    for about, command_line in EXAMPLES:
        lines += [".PP", escape(about), ".PP", ".RS", ".nf", escape(command_line), ".fi", ".RE"]
    lines += [".SH SEE ALSO", escape(SEE_ALSO)]
    return "\n".join(lines) + "\n"
