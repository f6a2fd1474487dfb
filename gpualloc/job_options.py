"""Every option of a job request, declared once.

One row per option: its parameter name, spellings, kind and bounds, help, default, the
environment variable and configuration key that default it, its completion, the commands that
take it. The rest is made from this table,
never written again by hand, but for the typed fields of ``JobOptions``:

- the options of ``run``, ``alloc`` and ``plan`` (:func:`gpualloc.cli.declare.job_options`),
  and so their parser, ``--help``, manual page and completion scripts;
- the bounds :class:`gpualloc.model.job.JobOptions` checks when it is made, the one
  struct the command line, the Python API and the broker build a job from (its fields are the
  ``job`` rows, written there with their types so that a checker reads them; a test holds the
  two equal);
- the job's one encoding on the broker's socket: every ``job`` row, as
  :class:`~gpualloc.host.brokered.BrokeredHost` sends a ``JobOptions`` and the broker decodes
  it (:func:`gpualloc.broker.requests.options_want`).

A new option is one row here, its typed field in ``JobOptions`` and its use
(``tests/test_job_options.py`` adds a row and finds it everywhere else). A leaf module: every
command line's parser reads it, so it imports nothing.
"""

from typing import Literal, NamedTuple

Kind = Literal["flag", "int", "float", "str"]
Group = Literal["job", "lease", "wait"]
"""``job``: what describes the job (:class:`~gpualloc.model.job.JobOptions`);
``lease``: how its lease is held; ``wait``: how it queues (``--wait`` and its options)."""

COMMANDS = ("run", "alloc", "plan", "submit")
PATTERN_NAMES = ("ring", "all", "tree", "star")
"""The built-in patterns (``placement.patterns.BUILTIN_PATTERNS``; a test holds them equal):
any other ``--pattern`` names a file, which the client reads with its user's rights and sends
as edges; the root broker opens no file a user names, which it could read with root's
rights (tests/test_broker_user_files.py)."""

MAX_GPUS = 256
"""The most GPUs a job may ask for (``-n``), and the bound of a GPU index typed in a list
(``--gpus``, ``--exclude``, ...: indices below it), checked before any pattern is built or list
expanded, so that no number a user types grows the work. NVIDIA's driver supports at most 32 GPUs in
one system (``NV_MAX_DEVICES`` in open-gpu-kernel-modules' ``nvlimits.h``); 256 leaves 8x room for
recorded and synthetic topologies while the largest built-in pattern (``all``) stays at 32,640
edges. The host's own GPU count is the real bound, checked (exit 9) where the topology is known."""


class JobOption(NamedTuple):
    """One option of a job request (module docstring)."""

    dest: str
    """The parameter, struct field and wire key."""
    kind: Kind
    help: str
    flags: tuple[str, ...] = ()
    """Spellings (default: ``--dest`` with ``-`` for ``_``)."""
    negative: tuple[str, ...] = ()
    """A flag's spellings that set it to False (``--insensitive``)."""
    default: object = None
    metavar: str | None = None
    minimum: float | None = None
    maximum: float | None = None
    completion: str | None = None
    """The function of :mod:`gpualloc.cli.complete` that completes its value."""
    commands: tuple[str, ...] = COMMANDS
    group: Group = "job"
    plan_help: str | None = None
    """``plan``'s help where it differs (plan runs nothing, so some defaults differ)."""

    @property
    def spellings(self) -> tuple[str, ...]:
        return self.flags or (f"--{self.dest.replace('_', '-')}",)

    def help_for(self, command: str) -> str:
        return self.plan_help if command == "plan" and self.plan_help else self.help


POLICY_HELP = (
    "Placement policy: mapa (default; MAPA Preserve), mapa-greedy, drb, pack, spread, "
    "besteffort (NVIDIA go-gpuallocator), slurm (Slurm 22.05), baseline (lowest indices). "
    "Else GPUALLOC_POLICY, else policy in config.toml."
)
RUN_ALLOC = ("run", "alloc")
LAUNCHING = ("run", "alloc", "submit")
"""The commands that make a lease (``plan`` makes none; ``submit`` always waits)."""

JOB_OPTIONS: tuple[JobOption, ...] = (
    JobOption(
        "count", "int", "Number of GPUs the job needs (default 1).",
        flags=("-n", "--num-gpus"), metavar="N", minimum=1, maximum=MAX_GPUS,
        plan_help="Number of GPUs the job needs (required, unless --mig or --mem asks for a "
        "MIG device).",
    ),
    JobOption(
        "pattern", "str",
        "How the job's ranks talk: ring (NCCL's collectives), all, tree, star, or a JSON edge "
        "list file over ranks 0..n-1.",
        default="ring", metavar="PATTERN", completion="patterns",
    ),
    JobOption(
        "sensitive", "flag", "Bandwidth-sensitive job (MAPA 2.3). Default: sensitive for 2+ GPUs.",
        flags=("--sensitive",), negative=("--insensitive",),
    ),
    JobOption(
        "exclude", "str", "GPUs the job must not get, e.g. a GPU you know is flaky.",
        metavar="LIST",
    ),
    JobOption("require", "str", "GPUs that must be part of the answer.", metavar="LIST"),
    JobOption("policy", "str", POLICY_HELP, metavar="POLICY", completion="policies"),
    JobOption(
        "score", "str",
        "Effective-bandwidth model for sensitive jobs: auto (MAPA Table 2 on hosts with the "
        "DGX-1's NV1/NV2/PCIe links, else the slowest pattern link), mapa (Table 2 on any "
        "host), bottleneck. Table 2 scores only patterns of 2 to 5 edges, the range it was "
        "fitted on; others are scored by their slowest link.",
        default="auto", metavar="MODEL", completion="scores",
    ),
    JobOption(
        "drb_weights", "str",
        "DRB utility weights communication,interference,fragmentation (default 1,1,1: a third "
        "each).",
        metavar="C,I,F",
    ),
    JobOption(
        "gpus", "str",
        "Take exactly these GPUs, in this order (e.g. 3,1); -n is then their number.",
        metavar="LIST", commands=LAUNCHING,
    ),
    JobOption(
        "min_utility", "float",
        "Only start on a placement whose DRB utility (Eq. 2, 0..1; the DRB paper uses 0.3 for "
        "1-GPU and 0.5 for 2-GPU jobs) is at least this; with --wait, keep waiting for a "
        "better one even when enough GPUs are free (DRB's postponement).",
        metavar="U", minimum=0.0, maximum=1.0, commands=LAUNCHING,
    ),
    JobOption(
        "min_bandwidth", "float",
        "Only start on a placement whose predicted effective bandwidth is at least this many "
        "GB/s (e.g. wait for an NVLinked pair); with --wait, keep waiting.",
        metavar="GBPS", minimum=0.0, commands=LAUNCHING,
    ),
    JobOption(
        "mig", "str",
        "Take one MIG device instead of whole GPUs: the smallest free one of this profile "
        "(e.g. 1g.5gb, 3g.20gb), or exactly this one (GPU0/MIG3, or its MIG- UUID). 'gpualloc "
        "topo show' lists them.",
        metavar="PROFILE|DEVICE", completion="mig_profiles",
    ),
    JobOption(
        "mem", "str",
        "Take the smallest free MIG device with at least this much memory (e.g. 10G, 4.5G, "
        "512M; G = GiB); with --mig, a device of that profile with that much. With --share: "
        "the GPU memory the shared job needs; with --shareable: what this job uses, so that "
        "shared jobs leave it room.",
        metavar="SIZE",
    ),
    JobOption(
        "share", "flag",
        "Run on a GPU together with other jobs: one a --shareable lease holds, one only shared "
        "jobs use, else a free one; the memory asked for with --mem must be free there and the "
        "GPU must run fewer shared jobs than the host allows (share.max_jobs, default 4). Under "
        "CUDA MPS when its daemon runs, else time-sliced.",
        default=False, commands=("run",),
    ),
    JobOption(
        "shareable", "flag",
        "Let shared jobs (run --share) run on these GPUs beside this job, as long as their "
        "memory fits; you may evict them (release --evict-shared).",
        default=False, commands=LAUNCHING,
    ),
    JobOption(
        "background", "flag",
        "With --share: a low-priority job (DeepPool's background job): its CPU priority is "
        "lowered (nice 10) and status marks it so.",
        default=False, commands=("run",),
    ),
    JobOption(
        "sm_share", "int",
        "With --share: the part of one GPU the job asks for; a GPU takes shared jobs while "
        "these parts sum to at most 100. Under CUDA MPS it also caps the job's multiprocessors "
        "(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE).",
        metavar="PERCENT", minimum=1, maximum=100, commands=("run",),
    ),
    JobOption(
        "name", "str", "A name for the lease (a submitted job's name), shown by 'status', 'jobs'.",
        metavar="NAME", commands=LAUNCHING, group="lease",
    ),
    JobOption(
        "time", "str",
        "The lease's time limit, as Slurm's --time writes it (30 is 30 minutes, MM:SS, "
        "HH:MM:SS, D-HH[:MM[:SS]]) or with units (2h, 90m); 0: none. At the limit the process "
        "the lease lives with (run's job; alloc's --pid, else its shell) gets SIGTERM, and "
        "SIGKILL limits.kill_wait (30 s) later; a --hold lease is released. "
        "Default and maximum: limits.default_time and limits.max_time (limits.max_hold for "
        "--hold) in the system configuration (none unless set).",
        metavar="LIMIT", commands=LAUNCHING, group="lease",
    ),
    JobOption(
        "signal", "str",
        "Send the job SIG (USR1, SIGUSR1, 10) SECONDS (default 60) before its time limit, as "
        "Slurm's --signal: to its process group, or with B: to its own process alone (the "
        "batch script); needs a time limit.",
        metavar="[B:]SIG[@SECONDS]", commands=LAUNCHING, group="lease",
    ),
    JobOption(
        "uuid", "flag", "Export CUDA_VISIBLE_DEVICES as GPU UUIDs instead of indices.",
        default=False, commands=LAUNCHING, group="lease",
    ),
    JobOption(
        "ignore_foreign", "flag",
        "Treat GPUs as free even when processes that did not come through gpualloc run on them "
        "(NVML's process list). Default: heed them (GPUALLOC_IGNORE_FOREIGN, ignore_foreign in "
        "config.toml).",
        flags=("--ignore-foreign",), negative=("--heed-foreign",), commands=LAUNCHING,
        group="lease",
    ),
    JobOption(
        "allow_unhealthy", "flag",
        "Place on GPUs gpualloc found unhealthy too (uncorrectable ECC errors, pages or rows "
        "waiting for a reset, a critical Xid error; 'gpualloc status' says which).",
        default=False, group="lease",
    ),
    JobOption(
        "wait", "flag",
        "When the GPUs are taken, join the host's queue and start as soon as it is this job's "
        "turn (first come, first served; backfill; priorities).",
        default=False, commands=RUN_ALLOC, group="wait",
    ),
    JobOption(
        "timeout", "str",
        "With --wait: give up after this long (90, 30s, 5m, 2h, 1h30m) with exit 124.",
        metavar="DURATION", commands=RUN_ALLOC, group="wait",
    ),
    JobOption(
        "priority", "str",
        "With --wait: queue class high, normal or low; arrival order within. Default: normal "
        "(GPUALLOC_PRIORITY, queue.priority in config.toml).",
        metavar="CLASS", completion="priorities", commands=LAUNCHING, group="wait",
    ),
    JobOption(
        "max_bypass", "int",
        "With --wait: how many later jobs may start before this one (backfill) before backfill "
        "past it stops until it starts. Default: 8 (GPUALLOC_MAX_BYPASS, queue.max_bypass in "
        "config.toml).",
        metavar="N", minimum=0, commands=LAUNCHING, group="wait",
    ),
)  # fmt: skip


Table = tuple[JobOption, ...]


def table_or_default(table: Table | None) -> Table:
    """``table``, or :data:`JOB_OPTIONS` as it is when asked (not when a caller was defined:
    a test may add a row before anything reads it)."""
    return JOB_OPTIONS if table is None else table


def options_of(command: str, table: Table | None = None) -> Table:
    """The rows ``command`` (``run``, ``alloc`` or ``plan``) takes, in table order."""
    return tuple(row for row in table_or_default(table) if command in row.commands)


def job_fields(table: Table | None = None) -> Table:
    """The rows that describe the job (the fields of ``JobOptions``)."""
    return tuple(row for row in table_or_default(table) if row.group == "job")
