"""The ledger's on-disk model: which GPUs are held, by whom, since when (validated, versioned).

One JSON document per host. ``schema_version`` says how to read it: a file written by a newer
gpualloc is refused, never half-understood. ``generation`` grows by one with every committed
write, so that the freshest of several copies can be told apart (see :mod:`.store`).
"""

from datetime import datetime, timedelta
from typing import Annotated, Literal

from msgspec import Meta, Struct, field

from gpualloc.ledger.stats import LedgerStats
from gpualloc.model.mig import mig_label
from gpualloc.model.queued import QueuedRequest
from gpualloc.model.share import LeasedShare
from gpualloc.model.validation import NonNegativeInt, PositiveInt

SCHEMA_VERSION = 11
"""2 added the waiting queue (``queue``, ``next_seq``) and ``Lease.sensitive``; 3 added
``writer_uid``, ``root_journal_seq``, ``Lease.process_group`` and the confirmation of a new
lease (``announced``, ``creator_pid``); 4 added ``Lease.mig`` (MIG devices held; such a lease
may hold no whole GPU); 5 added shared GPUs (``Lease.shareable``, ``Lease.memory_bytes``,
``Lease.share``, ``QueuedRequest.share``), ``stats`` and ``Lease.activity``; 6 added
``stats.request_mix`` (what fragmentation-aware placement weighs); 7 added
``Lease.slurm_conflict``; 8 ends the file with its generation again (the trailer of
:mod:`.document`, since the store rewrites its files in place); 9 added ``Lease.time_limit_s``
and ``Lease.signal``; 10 the ``submit`` source; 11 ``Waiter.time_limit_s`` (EASY backfill,
:mod:`gpualloc.host.backfill`) and ``Lease.process_group_start``. Older files read as version
8: every added field has a default that means what the older file meant."""

LeaseSource = Literal["run", "alloc", "slurm", "submit"]
Priority = Literal["high", "normal", "low"]
PRIORITY_RANK: dict[str, int] = {"high": 0, "normal": 1, "low": 2}
ItemId = Annotated[str, Meta(pattern=r"^[0-9a-f]{12}$")]
"""A lease's or waiter's id: 12 hex digits."""


class _Entry(Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """A part of the ledger: unknown fields refused, immutable (change one with ``replace``)."""


class LeasedGpu(_Entry, kw_only=True, frozen=True):
    """One GPU of a lease: its index on this host and, when known, its UUID (indices can move
    when a GPU fails or the driver is reloaded; the UUID does not)."""

    index: NonNegativeInt
    uuid: str | None = None


class LeasedMig(_Entry, kw_only=True, frozen=True):
    """One MIG device of a lease: its parent GPU and MIG device index on this host, and its
    ``MIG-`` UUID (what the job's ``CUDA_VISIBLE_DEVICES`` names)."""

    gpu: NonNegativeInt
    device: NonNegativeInt
    uuid: str | None = None
    profile: str | None = None

    @property
    def key(self) -> tuple[int, int]:
        return (self.gpu, self.device)

    @property
    def label(self) -> str:
        return mig_label(self.gpu, self.device)


class LeaseActivity(_Entry, kw_only=True, frozen=True):
    """Whether a lease's GPUs have been used, as ``gpualloc gc`` observes them (see
    :mod:`gpualloc.ledger.idle`)."""

    observed_at: datetime
    idle_since: datetime | None = None
    """Start of the current idle stretch (every look since then found the GPUs idle, none more
    than ``idle.max_gap`` apart); None when they were busy at the last look."""
    expires_at: datetime | None = None
    """For a ``--hold`` lease under ``idle.expire_holds``: when it is released unless its GPUs
    are used before (its holder was given notice)."""


class LeaseSignal(_Entry, kw_only=True, frozen=True):
    """``--signal``: a signal the job gets before its time limit (Slurm's sbatch(1))."""

    number: PositiveInt
    before_s: Annotated[float, Meta(ge=0)] = 60.0
    leader_only: bool = False
    """``B:``: the job's own process alone (Slurm's batch shell); else its process group."""


class Lease(_Entry, kw_only=True, frozen=True):
    """GPUs held by one job or one allocation.

    A lease is alive while its process is (``pid`` and ``pid_start_time``, so that a reused pid is
    not mistaken for the job), or while some process still holds its lease lock (the exec'd job
    and its children inherit it), or, with ``hold``, until it is released or the machine
    reboots.
    """

    id: ItemId
    gpus: tuple[LeasedGpu, ...] = ()
    """Whole GPUs held. Empty only when ``mig`` is not."""
    mig: tuple[LeasedMig, ...] = ()
    """MIG devices held (a GPU in MIG mode is never leased whole)."""
    uid: NonNegativeInt
    user: str
    pid: PositiveInt | None = None
    pid_start_time: float | None = None
    """The process's start time as psutil's ``create_time`` reports it (seconds since the
    epoch; gpualloc reads it from ``/proc`` the same way)."""
    lock: bool = False
    """True when the job holds the lease lock file (``lease-<id>.lock``)."""
    hold: bool = False
    """Alive until released, whatever happens to ``pid``."""
    command: tuple[str, ...] = ()
    name: str | None = None
    policy: str | None = None
    sensitive: bool | None = None
    """The job's bandwidth sensitivity, for DRB's interference term (None: unknown)."""
    scores: dict[str, float | None] = field(default_factory=dict)
    created: datetime
    source: LeaseSource
    slurm_job: str | None = None
    """The Slurm job id, for leases the Slurm prolog records (the epilog releases them)."""
    boot_id: str | None = None
    """The boot the lease was made in; a lease from an earlier boot is dead, ``hold`` or not."""
    process_group: PositiveInt | None = None
    process_group_start: float | None = None
    """The start time of the process leading :attr:`process_group` where that is not the
    lease's own process (a submitted job its supervisor bound the lease to:
    :meth:`gpualloc.host.protocol.Host.adopt`), so that the job is known for itself."""
    """The job's own process group, recorded when the job leads it (``run`` from a shell with
    job control, a Slurm task, ``setsid``): the lease lives while any process of the group does,
    so a child that closed the inherited lease lock (a daemon's ``closerange``) still holds the
    GPUs. The kernel does not reuse a pid while it names a live group."""
    announced: bool = True
    """False until the gpualloc that made the lease has printed its id: a lease whose creator
    was killed before that is shown as such by ``status`` (``release --mine`` frees it)."""
    creator_pid: PositiveInt | None = None
    """The gpualloc process making a lease that is not ``announced`` yet."""
    creator_start_time: float | None = None
    shareable: bool = False
    """Shared jobs (``run --share``) may run on this lease's GPUs beside its own job."""
    memory_bytes: PositiveInt | None = None
    """GPU memory the job declared (``--mem`` with ``--shareable`` or ``--share``), per GPU."""
    share: LeasedShare | None = None
    """Set for a shared job: it holds its one GPU together with others (a *share*), and the
    GPU is not its alone. Every other lease holds its GPUs whole."""
    activity: LeaseActivity | None = None
    """How long the lease's GPUs have been idle, when ``gc`` has looked (None: never)."""
    slurm_conflict: str | None = None
    """The Slurm job that was given some of this lease's GPUs while it held them. Slurm is
    authoritative on a Slurm node (slurmctld has started the job on them): the job's lease
    records them too, so they are not handed out again until the job ends, whatever this
    lease does; ``status`` and the metrics tell the lease's owner. Cleared when the job's
    Epilog runs."""
    queued: datetime | None = None
    """When its job joined the host's queue (None: it did not wait), for the history."""
    time_limit_s: Annotated[float, Meta(gt=0)] | None = None
    """How long the lease may live from ``created`` (``--time``, as the system configuration's
    ``limits.*`` granted it; None: no limit). At its end the job is signalled (SIGTERM, SIGKILL
    ``limits.kill_wait`` later) and a ``--hold`` lease released (:mod:`gpualloc.broker.overdue`,
    :mod:`gpualloc.launcher.time_limit`)."""

    signal: LeaseSignal | None = None
    """``--signal``: sent ``before_s`` before :attr:`ends`."""

    def __post_init__(self) -> None:
        if not self.gpus and not self.mig:
            raise ValueError(f"lease {self.id} holds neither a GPU nor a MIG device")
        if self.share is not None and (len(self.gpus) != 1 or self.mig or self.shareable):
            raise ValueError(f"shared lease {self.id} must hold exactly one whole GPU")
        if self.shareable and self.mig:
            raise ValueError(f"lease {self.id} holds MIG devices, which cannot be shared")

    @property
    def ends(self) -> datetime | None:
        """When the lease's time limit runs out (None: no limit)."""
        if self.time_limit_s is None:
            return None
        return self.created + timedelta(seconds=self.time_limit_s)

    @property
    def indices(self) -> tuple[int, ...]:
        """The whole GPUs held (not the parents of MIG devices)."""
        return tuple(gpu.index for gpu in self.gpus)

    @property
    def mig_keys(self) -> tuple[tuple[int, int], ...]:
        """(parent GPU, MIG device index) of every MIG device held."""
        return tuple(m.key for m in self.mig)

    @property
    def task_type(self) -> tuple[int, float] | str | None:
        """What the request mix counts the lease as: (GPUs, part of one GPU), or a MIG
        device's profile (None when the layout did not name it)."""
        if self.mig:
            return self.mig[0].profile
        if self.share is not None:
            return (1, self.share.fraction)
        return (len(self.gpus), 1.0)


class Waiter(_Entry, kw_only=True, frozen=True):
    """A job waiting in the host queue (``run --wait``, ``alloc --wait``).

    Alive while its gpualloc process is (pid and start time, as for leases); a dead waiter is
    removed by the next transaction, so a killed waiter leaves no ghost entry.
    """

    id: ItemId
    seq: NonNegativeInt
    """Arrival order on this host (first come, first served within a priority class)."""
    uid: NonNegativeInt
    user: str
    pid: PositiveInt
    pid_start_time: float | None = None
    priority: Priority = "normal"
    passed_over: NonNegativeInt = 0
    """How many later jobs started before this one (backfill) that count against
    ``max_bypass``: not those that started while its own owner's leases kept it from starting
    (:func:`gpualloc.host.queue.blocked_by_own`), which ``status`` says in its reason."""
    max_bypass: NonNegativeInt = 8
    """Once passed over this often, this waiter stops backfill until it starts."""
    backfill_window_s: Annotated[float, Meta(gt=0)] | None = None
    """Once it has waited this long, this waiter stops backfill until it starts (the host's
    ``queue.backfill_window``; None: only ``max_bypass`` bounds it)."""
    request: QueuedRequest
    command: tuple[str, ...] = ()
    name: str | None = None
    source: LeaseSource = "run"
    created: datetime
    time_limit_s: Annotated[float, Meta(gt=0)] | None = None
    """The limit its lease will have (granted at the door; None: none): how long it holds its
    GPUs at most once started, which EASY backfill weighs (:mod:`gpualloc.host.backfill`)."""


class Ledger(Struct, kw_only=True, forbid_unknown_fields=True):
    """The whole state file (changed in place inside a transaction)."""

    schema_version: int = SCHEMA_VERSION
    writer_uid: NonNegativeInt | None = None
    """Who wrote this generation. A good copy is trusted for recovery only when its owner wrote
    it, and a damaged ledger's first bytes name the copy it is recovered from (see
    :mod:`.store`)."""
    generation: NonNegativeInt = 0
    host: str
    leases: list[Lease] = field(default_factory=list)
    queue: list[Waiter] = field(default_factory=list)
    next_seq: NonNegativeInt = 0
    root_journal_seq: NonNegativeInt = 0
    """The last entry of root's journal (:mod:`.journal`) this ledger includes."""
    stats: LedgerStats = field(default_factory=LedgerStats)
    """Placements, decision times and waits so far, for ``gpualloc metrics``."""

    def __post_init__(self) -> None:
        held: dict[int, list[Lease]] = {}
        for lease in self.whole_leases():
            for index in lease.indices:
                held.setdefault(index, []).append(lease)
        held_mig: dict[tuple[int, int], list[Lease]] = {}
        for lease in self.leases:
            for device in lease.mig:
                held_mig.setdefault(device.key, []).append(lease)
        for what, holders in [
            *((f"GPU {index}", found) for index, found in held.items()),
            *((f"MIG device {mig_label(*key)}", found) for key, found in held_mig.items()),
        ]:
            if len(holders) > 1 and not _slurm_over_conflict(holders):
                raise ValueError(f"{what} is held by leases {holders[0].id} and {holders[1].id}")
        ids = [lease.id for lease in self.leases]
        if len(set(ids)) != len(ids):
            raise ValueError("two leases share an id")

    def whole_leases(self) -> list[Lease]:
        """Every lease but the shared jobs'."""
        return [lease for lease in self.leases if lease.share is None]

    def held_gpus(self) -> dict[int, Lease]:
        """GPU index -> the lease holding it (shared jobs aside: see :meth:`shares`); a Slurm
        job's lease, which may list a GPU a conflicting lease holds too, wins."""
        slurm_last = sorted(self.whole_leases(), key=lambda lease: lease.source == "slurm")
        return {index: lease for lease in slurm_last for index in lease.indices}

    def shares(self) -> dict[int, list[Lease]]:
        """GPU index -> the shared jobs on it, oldest first."""
        found: dict[int, list[Lease]] = {}
        for lease in self.leases:
            if lease.share is not None:
                found.setdefault(lease.gpus[0].index, []).append(lease)
        return found

    def held_mig(self) -> dict[tuple[int, int], Lease]:
        """(parent GPU, MIG device index) -> the lease holding that MIG device."""
        return {key: lease for lease in self.leases for key in lease.mig_keys}

    def find(self, lease_id: str) -> Lease | None:
        return next((lease for lease in self.leases if lease.id == lease_id), None)

    def waiter(self, waiter_id: str) -> Waiter | None:
        return next((w for w in self.queue if w.id == waiter_id), None)


def _slurm_over_conflict(holders: list[Lease]) -> bool:
    """Whether two leases of one GPU are a Slurm job's and one it was given over (marked
    :attr:`Lease.slurm_conflict`): the one way a ledger lists a GPU twice
    (tests/test_slurm_hooks.py::test_slurm_is_authoritative_over_a_gpu_held_outside_it)."""
    if len(holders) != 2:
        return False
    first, second = holders
    return any(
        a.slurm_job is not None and b.slurm_conflict == a.slurm_job
        for a, b in ((first, second), (second, first))
    )
