"""gpualloc itself, declared: its global options, its commands and their one-line summaries.

The top of the command line knows only this module: each command's own declaration (its
options and help, a :class:`~gpualloc.cli.declare.Command` or
:class:`~gpualloc.cli.declare.Group`) lives in its module, which is imported once the command
word is found (:func:`load`), so that ``gpualloc run`` never imports ``simulate``'s.
"""

from __future__ import annotations

from gpualloc.cli.declare import Command, Group, Opt, flag, value

HELP = """Topology-aware GPU allocator and job launcher for a shared multi-GPU host.

Without a GPU, every command works on a bundled or recorded topology:
`gpualloc --topology dgx1-v100 topo show`"""

DEBUG_VARIABLE = "GPUALLOC_DEBUG"
"""--debug's variable, read before the command line (:mod:`gpualloc.cli.main`), so that an
error while reading it shows its traceback too."""


GLOBAL_OPTIONS = (
    value(
        "--topology",
        "-t",
        metavar="NAME|PATH",
        envvar="GPUALLOC_TOPOLOGY",
        completion="topologies",
        help="Work on a bundled topology (see 'topo list') or a topology file (gpualloc JSON or "
        "'nvidia-smi topo -m' text) instead of probing this host.",
    ),
    value(
        "--bandwidth-table",
        kind="path",
        metavar="FILE",
        help="JSON file overriding entries of the link bandwidth table (else "
        "GPUALLOC_BANDWIDTH_TABLE, else bandwidth_table in config.toml).",
    ),
    flag("--refresh", help="Probe the host again instead of using the cache."),
    Opt(("--debug",), "debug", "Show tracebacks on errors.", envvar=DEBUG_VARIABLE),
    flag("--version", help="Print the version and exit."),
    flag(
        "--manual", help="Show the manual page (what 'man gpualloc' shows after a wheel install)."
    ),
    value(
        "--install-completion",
        metavar="SHELL",
        completion="shells",
        help="Install Tab completion for bash, zsh or fish (a static script: no process per Tab).",
    ),
    value(
        "--show-completion",
        metavar="SHELL",
        completion="shells",
        help="Print the completion script for bash, zsh or fish.",
    ),
)


ALONE = ("version", "manual", "install_completion", "show_completion")
"""Global options that gpualloc answers itself, with no command."""


class Entry:
    """A command of gpualloc: its word, where its declaration is (``module:NAME``) and its line
    in ``gpualloc --help``."""

    __slots__ = ("name", "summary", "where")

    def __init__(self, name: str, where: str, summary: str) -> None:
        self.name = name
        self.where = where
        self.summary = summary


COMMANDS = (
    Entry(
        "plan", "gpualloc.cli.plan:PLAN", "Choose GPUs for a job and say why, without running it."
    ),
    Entry(
        "run", "gpualloc.cli.run:RUN", "Run a job on the best free GPUs; free them when it ends."
    ),
    Entry(
        "alloc",
        "gpualloc.cli.leases:ALLOC",
        "Hold GPUs without running anything (scripts, notebooks).",
    ),
    Entry(
        "release", "gpualloc.cli.leases:RELEASE", "Give GPUs back: leases by id, or all of yours."
    ),
    Entry(
        "submit",
        "gpualloc.cli.submit:SUBMIT",
        "Queue a job that runs after you log out; print its id.",
    ),
    Entry("jobs", "gpualloc.cli.batch_jobs:JOBS", "Your submitted jobs and their states."),
    Entry("log", "gpualloc.cli.batch_jobs:LOG", "Print a submitted job's log (-f: follow it)."),
    Entry("cancel", "gpualloc.cli.batch_jobs:CANCEL", "Cancel submitted jobs."),
    Entry("show", "gpualloc.cli.batch_jobs:SHOW", "Everything known of one submitted job."),
    Entry(
        "status", "gpualloc.cli.status:STATUS", "Who holds which GPU, since when, and who waits."
    ),
    Entry("gc", "gpualloc.cli.leases:GC", "Free the GPUs of leases whose jobs are gone, now."),
    Entry(
        "metrics",
        "gpualloc.cli.metrics:METRICS",
        "The GPUs, leases and queue as Prometheus metrics.",
    ),
    Entry(
        "doctor",
        "gpualloc.cli.doctor:DOCTOR",
        "Check links, GPU health and leases; exit 17 if wrong.",
    ),
    Entry(
        "serve", "gpualloc.cli.serve:SERVE", "The broker: own this host's ledger for every user."
    ),
    Entry(
        "simulate",
        "gpualloc.cli.simulate:SIMULATE",
        "Compare placement policies on a stream of jobs.",
    ),
    Entry(
        "calibrate",
        "gpualloc.cli.calibrate:CALIBRATE",
        "Measure this host's GPU bandwidth and place by it.",
    ),
    Entry(
        "topo",
        "gpualloc.cli.topo:TOPO",
        "What a host looks like: GPUs, NVLink/PCIe links, NUMA nodes.",
    ),
    Entry("slurm", "gpualloc.cli.slurm:SLURM", "Slurm node hooks (Prolog, Epilog) and gres.conf."),
    Entry(
        "config",
        "gpualloc.cli.config_show:CONFIG",
        "The settings in effect, and where each comes from.",
    ),
)
"""In the order ``--help``, the manual and the completions list them. Each summary is a whole
sentence that fits 80 columns (tests/test_terminal_output.py)."""

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
    ("XDG_STATE_HOME", "submitted jobs' records and logs: $XDG_STATE_HOME/gpualloc/jobs"),
    ("COLUMNS", "piped tables fit this width (without it a row stays on one line)"),
    ("GPUALLOC_NO_SLURM=1", "inside a Slurm job, use the host's ledger and GPUs"),
    ("GPUALLOC_LEASE_ID, GPUALLOC_GPUS", "set for jobs: their lease id and GPU indices"),
    ("GPUALLOC_JOB_ID, GPUALLOC_JOB_NAME", "set for submitted jobs: their id and name"),
    ("GPUALLOC_ARRAY_JOB_ID, GPUALLOC_ARRAY_TASK_ID", "set for tasks of submit --array"),
)
"""Every variable gpualloc reads or sets, for ``--help``, the manual and the README."""


def entry(name: str) -> Entry | None:
    return next((entry for entry in COMMANDS if entry.name == name), None)


def load(entry: Entry) -> Command | Group:
    """The declaration of ``entry``: its module imported now."""
    import importlib

    module, _, name = entry.where.partition(":")
    declared: Command | Group = getattr(importlib.import_module(module), name)
    return declared


def every_command() -> list[tuple[str, Command]]:
    """Every command (``topo show``, ``run``, ...) with its path, in order: for the manual, the
    completions and the tests that walk them all (each module imported)."""
    found: list[tuple[str, Command]] = []
    for each in COMMANDS:
        declared = load(each)
        if isinstance(declared, Group):
            found += [(f"{each.name} {command.name}", command) for command in declared.commands]
        else:
            found.append((each.name, declared))
    return found
