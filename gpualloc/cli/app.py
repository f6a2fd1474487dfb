"""The ``gpualloc`` command as typer declares it: global options, commands, help.

Start-up is a feature (house style habit 9): this module imports typer and nothing heavy;
pydantic (through typer), networkx, pynvml and psutil load inside the commands that need them,
and a test checks what ``gpualloc --help`` loaded. The command modules import no typer at all:
they write typer's declarations down as :mod:`gpualloc.cli.declare` records, which
:func:`typer_parameters` and :func:`typer_group` turn into typer's own here, so that the
command-line fast path (:mod:`gpualloc.cli.fastpath`) can import them and call the commands
without typer. :func:`gpualloc.cli.main.run` is the entry point and the error boundary of both.
"""

from __future__ import annotations

import inspect
import os
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Optional, TypeVar

import typer

from gpualloc import __version__
from gpualloc.cli import (
    calibrate,
    complete,
    config_show,
    doctor,
    leases,
    metrics,
    plan,
    run,
    serve,
    simulate,
    slurm,
    status,
    topo,
)
from gpualloc.cli.declare import Declared, Group
from gpualloc.cli.output import write_stdout
from gpualloc.cli.request_options import add_job_options
from gpualloc.cli.state import STATE
from gpualloc.errors import ExitCode

ENVIRONMENT_VARIABLES = (
    ("GPUALLOC_TOPOLOGY", "as --topology"),
    ("GPUALLOC_BANDWIDTH_TABLE", "as --bandwidth-table"),
    ("GPUALLOC_CACHE_DIR", "where discovered topologies are cached (default ~/.cache/gpualloc)"),
    ("GPUALLOC_STATE_DIR", "the shared ledger's directory (default /var/tmp/gpualloc)"),
    ("GPUALLOC_BROKER", "the broker's socket (gpualloc serve; /run/gpualloc/gpualloc.sock)"),
    ("GPUALLOC_BROKER_TIMEOUT", "how long to wait for the broker's answer (default 10s)"),
    ("GPUALLOC_DEBUG=1", "as --debug"),
    ("GPUALLOC_POLICY", "as --policy (default mapa)"),
    ("GPUALLOC_NUMA", "as run --numa (default auto)"),
    ("GPUALLOC_IGNORE_FOREIGN=1", "as --ignore-foreign"),
    ("GPUALLOC_PRIORITY, GPUALLOC_MAX_BYPASS", "as --priority and --max-bypass of --wait"),
    ("GPUALLOC_VERIFY_GRACE, GPUALLOC_VERIFY_ACTION", "run: check the job's GPUs (60s; warn)"),
    ("GPUALLOC_SYSTEM_CONFIG", "the system config file (default /etc/gpualloc/config.toml)"),
    ("GPUALLOC_LOCK_TIMEOUT", "how long to wait for the ledger's lock (default 30s)"),
    ("GPUALLOC_PLACEMENT_BUDGET", "one placement's search, then a greedy answer (default 1s)"),
    ("XDG_CONFIG_HOME", "the user's config file is $XDG_CONFIG_HOME/gpualloc/config.toml"),
    ("COLUMNS", "piped tables fit this width (without it a row stays on one line)"),
    ("GPUALLOC_NO_SLURM=1", "inside a Slurm job, use the host's ledger and GPUs"),
    ("GPUALLOC_LEASE_ID, GPUALLOC_GPUS", "set for jobs: their lease id and GPU indices"),
)
ENVIRONMENT_HELP = (
    "Environment variables:\n\n\b\n"  # \b: click keeps the lines of the next paragraph as they are
    + "\n".join(f"  {name}: {meaning}" for name, meaning in ENVIRONMENT_VARIABLES)
    + "\n\nExit codes:\n\n\b\n"
    + "\n".join(
        "  " + ", ".join(f"{int(code)} {code.name.lower().replace('_', '-')}" for code in row)
        for row in (list(ExitCode)[i : i + 5] for i in range(0, len(ExitCode), 5))
    )
)

F = TypeVar("F", bound=Callable[..., Any])


def typer_parameters(function: F) -> F:
    """``function`` with its parameters as typer reads them: each annotation evaluated (the
    command modules' annotations are text, PEP 563) and each :mod:`~gpualloc.cli.declare` record
    in it made ``typer.Option`` or ``typer.Argument``; typer takes ``__signature__`` and
    ``__annotations__``, with the job options of
    :func:`~gpualloc.cli.request_options.with_job_options` added first."""
    add_job_options(function)
    hints = typing.get_type_hints(function, include_extras=True)
    signature = inspect.signature(function)
    parameters = [
        parameter.replace(annotation=_typer_annotation(hints[parameter.name]))
        if parameter.name in hints
        else parameter
        for parameter in signature.parameters.values()
    ]
    function.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    function.__annotations__ = {
        p.name: p.annotation for p in parameters if p.annotation is not p.empty
    }
    return function


def _typer_annotation(hint: Any) -> Any:
    if typing.get_origin(hint) is not Annotated:
        return hint
    made = {"option": typer.Option, "argument": typer.Argument}
    path = _names_paths(hint.__origin__)
    metadata = [
        made[item.kind](*item.args, **_path_settings(item.settings, path))
        if isinstance(item, Declared)
        else item
        for item in hint.__metadata__
    ]
    return Annotated[(hint.__origin__, *metadata)]


def _path_settings(settings: dict[str, Any], path: bool) -> dict[str, Any]:
    """A path option's settings with click's checks of the file left out: gpualloc's reader
    and writers say why a file cannot be used, in one message and exit 8 for every option
    (:mod:`gpualloc.user_files`); click's ``readable`` check (typer's default) made a file
    another user owns a usage error, exit 2, worded by click (tests/test_user_files.py)."""
    return {"readable": False, **settings} if path else settings


def _names_paths(annotation: Any) -> bool:
    """Whether ``annotation`` is ``Path``, ``Optional[Path]`` or ``list[Path]``."""
    return annotation is Path or any(_names_paths(arg) for arg in typing.get_args(annotation))


def typer_group(group: Group | typer.Typer) -> typer.Typer:
    """The typer group that ``group`` declares, its commands in the order declared."""
    if isinstance(group, typer.Typer):
        return group
    made = typer.Typer(**group.settings)
    for name, function, settings in group.commands:
        made.command(name, **settings)(typer_parameters(function))
    return made


app = typer.Typer(
    name="gpualloc",
    help=(
        "Topology-aware GPU allocator and job launcher for a shared multi-GPU host.\n\n"
        "Without a GPU, every command works on a bundled or recorded topology: "
        "`gpualloc --topology dgx1-v100 topo show`"
    ),
    epilog=ENVIRONMENT_HELP,
    rich_markup_mode=None,
    no_args_is_help=True,
    add_completion=False,  # static scripts instead (--install-completion, below)
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
SUMMARIES = {
    "topo": "What a host looks like: GPUs, NVLink/PCIe links, NUMA nodes.",
    "plan": "Choose GPUs for a job and say why, without running it.",
    "run": "Run a job on the best free GPUs; free them when it ends.",
    "alloc": "Hold GPUs without running anything (scripts, notebooks).",
    "release": "Give GPUs back: leases by id, or all of yours.",
    "status": "Who holds which GPU, since when, and who waits.",
    "gc": "Free the GPUs of leases whose jobs are gone, now.",
    "metrics": "The GPUs, leases and queue as Prometheus metrics.",
    "doctor": "Check links, GPU health and leases; exit 17 if wrong.",
    "serve": "The broker: own this host's ledger for every user.",
    "simulate": "Compare placement policies on a stream of jobs.",
    "calibrate": "Measure this host's GPU bandwidth and place by it.",
    "slurm": "Slurm node hooks (Prolog, Epilog) and gres.conf.",
    "config": "The settings in effect, and where each comes from.",
}
"""Each command's line in ``gpualloc --help``: whole sentences that fit 80 columns (click cut
the first sentence of each help text mid-word; session 21 noted it)."""

app.add_typer(typer_group(topo.app), name="topo", short_help=SUMMARIES["topo"])
for name, function, settings in (
    ("plan", plan.plan_command, {}),
    ("run", run.run_command, {"context_settings": {"allow_interspersed_args": False}}),
    ("alloc", leases.alloc_command, {}),
    ("release", leases.release_command, {}),
    ("status", status.status_command, {}),
    ("gc", leases.gc_command, {}),
    ("metrics", metrics.metrics_command, {}),
    ("doctor", doctor.doctor_command, {}),
    ("serve", serve.serve_command, {}),
    ("simulate", simulate.simulate_command, {}),
    ("calibrate", calibrate.calibrate_command, {}),
):
    app.command(name, short_help=SUMMARIES[name], **settings)(typer_parameters(function))
app.add_typer(typer_group(slurm.app), name="slurm", short_help=SUMMARIES["slurm"])
app.add_typer(typer_group(config_show.app), name="config", short_help=SUMMARIES["config"])


SHELLS = tuple(name for name, _ in complete.SHELLS)


def completion_script(shell: str) -> str:
    from gpualloc.cli import completion_scripts as scripts

    if shell not in SHELLS:
        raise typer.BadParameter(f"{shell!r}: choose bash, zsh or fish")
    specs = scripts.command_specs(typer.main.get_command(app))
    build = {"bash": scripts.bash_script, "zsh": scripts.zsh_script, "fish": scripts.fish_script}
    return build[shell](specs)


def _show_completion(shell: str | None) -> None:
    if shell is not None:
        write_stdout(completion_script(shell))
        raise typer.Exit()


def _install_completion(shell: str | None) -> None:
    """Write the static script where the shell looks for completions of its own accord."""
    if shell is None:
        return
    from gpualloc.cli.output import say

    script = completion_script(shell)
    home = Path.home()
    data = Path(os.environ.get("XDG_DATA_HOME") or home / ".local" / "share")
    config = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config")
    target = {
        "bash": data / "bash-completion" / "completions" / "gpualloc",
        "zsh": home / ".zfunc" / "_gpualloc",
        "fish": config / "fish" / "completions" / "gpualloc.fish",
    }[shell]
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(script)
    say(f"wrote {target}")
    if shell == "zsh":
        say("add to ~/.zshrc, before compinit: fpath=(~/.zfunc $fpath)")
    say("open a new shell to use it")
    raise typer.Exit()


def _manual(value: bool) -> None:
    """Show the manual page, rendered from the commands as the installed one is: an editable
    install (pip install -e) installs no data files, so 'man gpualloc' finds nothing there."""
    if not value:
        return
    import shutil
    import subprocess

    from gpualloc.cli.manpage import render
    from gpualloc.errors import FileAccessError

    page = render(typer.main.get_command(app), ENVIRONMENT_VARIABLES)
    man = shutil.which("man")
    if man is None:
        raise FileAccessError(
            "man is not installed", hint="install it (apt-get install man-db), or read --help"
        )
    raise typer.Exit(
        subprocess.run([man, "-l", "-"], input=page, text=True, check=False).returncode
    )


def _version(value: bool) -> None:
    if value:
        write_stdout(f"gpualloc {__version__}\n")
        raise typer.Exit()


@app.callback()
def main(
    topology: Annotated[
        Optional[str],  # noqa: UP045 - typer needs Optional on Python 3.10
        typer.Option(
            "--topology",
            "-t",
            envvar="GPUALLOC_TOPOLOGY",
            metavar="NAME|PATH",
            help="Work on a bundled topology (see 'topo list') or a topology file (gpualloc "
            "JSON or 'nvidia-smi topo -m' text) instead of probing this host.",
            autocompletion=complete.topologies,
        ),
    ] = None,
    bandwidth_table: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(
            "--bandwidth-table",
            metavar="FILE",
            readable=False,  # the reader says why it cannot be read (_path_settings)
            help="JSON file overriding entries of the link bandwidth table (else "
            "GPUALLOC_BANDWIDTH_TABLE, else bandwidth_table in config.toml).",
        ),
    ] = None,
    refresh: Annotated[
        bool, typer.Option("--refresh", help="Probe the host again instead of using the cache.")
    ] = False,
    debug: Annotated[
        bool,
        typer.Option("--debug", envvar="GPUALLOC_DEBUG", help="Show tracebacks on errors."),
    ] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
    manual: Annotated[
        bool,
        typer.Option(
            "--manual",
            callback=_manual,
            is_eager=True,
            help="Show the manual page (what 'man gpualloc' shows after a wheel install).",
        ),
    ] = False,
    install_completion: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--install-completion",
            metavar="SHELL",
            callback=_install_completion,
            is_eager=True,
            autocompletion=complete.shells,
            help="Install Tab completion for bash, zsh or fish (a static script: no process "
            "per Tab).",
        ),
    ] = None,
    show_completion: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--show-completion",
            metavar="SHELL",
            callback=_show_completion,
            is_eager=True,
            autocompletion=complete.shells,
            help="Print the completion script for bash, zsh or fish.",
        ),
    ] = None,
) -> None:
    """Global options, shared by every command."""
    STATE.apply_global_options(
        topology=topology, bandwidth_table=bandwidth_table, refresh=refresh, debug=debug
    )
