"""Allocating GPUs through the shared ledger: decide and record in one locked transaction.

The race that breaks every small GPU picker (read who is free, then use it, while another job
does the same) is closed here: the placement is computed *inside* the ledger transaction, from
the ledger as it stands under the lock, and the lease is written before the lock is released.
Two gpualloc processes can therefore never be given the same GPU.

Used by ``run``, ``alloc`` and, later, the waiting queue and the Slurm prolog. What runs on the
GPUs outside gpualloc is read before the transaction (asking NVML takes time, and holding the
ledger lock meanwhile would serialise every user of the host on the driver).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from msgspec import Struct, field
from msgspec.structs import replace

from gpualloc import boot
from gpualloc.boot import boot_id
from gpualloc.config import DEFAULT_MAX_SHARED_JOBS
from gpualloc.discovery.live import GpusNow, live_processes, observe
from gpualloc.discovery.processes import ProcessReport, declared_processes
from gpualloc.discovery.this_host import describes_this_host
from gpualloc.errors import (
    LedgerError,
    NoSuchLease,
    NotPermitted,
    RequestError,
)
from gpualloc.launcher.queue import newcomer_passes
from gpualloc.ledger.liveness import lock_held, take_lease_lock
from gpualloc.ledger.lookup import find_leases
from gpualloc.ledger.occupancy import Occupancy
from gpualloc.ledger.schema import (
    Lease,
    LeasedGpu,
    LeasedMig,
    LeaseSource,
    Ledger,
    Waiter,
)
from gpualloc.ledger.scope import job_ledger_scope, ledger_scope
from gpualloc.ledger.shared_files import owner_name
from gpualloc.ledger.statedir import (
    StateDirectoryMissing,
    open_broker_directory,
    open_state_directory,
)
from gpualloc.ledger.store import LOCK_TIMEOUT_S, LedgerStore, LedgerTransaction, new_lease_id
from gpualloc.model.request import Placement
from gpualloc.model.share import LeasedShare, ShareMode, ShareRequest
from gpualloc.model.topology import GpuFault, GpuProcess, Topology
from gpualloc.placement.choose import choose
from gpualloc.placement.want import Want

if TYPE_CHECKING:
    from gpualloc.broker.remote import RemoteLedger
    from gpualloc.config import Config
    from gpualloc.ledger.idle import Expiry, IdlePolicy
    from gpualloc.slurm.job import SlurmJob

MAX_NAME_CHARS = 128
"""A lease's name is a label in everyone's ``status``, not a document (issue 30, point 5)."""
ORPHAN_LOCK_AGE_S = 60.0
"""A lease lock file no lease names is removed only when older than this, so that the lock of a
lease being created right now (file made, ledger not yet written) is never taken for litter."""


class LeaseTerms(Struct, frozen=True):
    """Who a new lease belongs to and how long it lives (see :class:`Lease`)."""

    source: LeaseSource
    pid: int | None = None
    hold: bool = False
    lock: bool = False
    """Take the lease lock now and keep its descriptor open for the job to inherit."""
    command: tuple[str, ...] = ()
    name: str | None = None
    process_group: int | None = None
    """The job's own process group, when it leads one (see ``Lease.process_group``)."""
    announce: bool = False
    """The lease is unconfirmed until :meth:`HostLedger.confirm` (after its id was printed)."""
    shareable: bool = False
    """Shared jobs may join the lease's GPUs (``--shareable``)."""
    memory_bytes: int | None = None
    """GPU memory the job declares it uses (``--shareable --mem``)."""
    share_mode: ShareMode = "time-sliced"
    """How a shared job shares its GPU (CUDA MPS when its daemon runs)."""
    uid: int | None = None
    """Whose lease it is: the broker names its peer; None: this process's user."""
    pid_start_time: float | None = None
    """``pid``'s start time when the caller read it already (the broker, checking the pid)."""
    creator: tuple[int, float | None] | None = None
    """The process announcing the lease (pid, start time); None: this process."""
    lease_id: str | None = None
    """The id the new lease gets; None: a new random one (the broker's clients choose theirs,
    so that a request sent again after a lost connection finds the lease it made)."""

    def __post_init__(self) -> None:
        if self.name is not None and len(self.name) > MAX_NAME_CHARS:
            raise RequestError(
                f"--name is {len(self.name)} characters long; a lease name has at most "
                f"{MAX_NAME_CHARS}",
                hint="give a shorter name (status shows the command beside it)",
            )


class Allocation(Struct):
    lease: Lease
    placement: Placement
    lock_fd: int | None = None
    notes: list[str] = field(default_factory=list)


class HostLedger(Struct):
    """A topology together with its ledger and the processes running on its GPUs."""

    topology: Topology
    store: LedgerStore | None
    """None when the state directory does not exist yet (opened without creating it)."""
    processes: ProcessReport
    this_host: bool
    ignore_foreign: bool = False
    slurm_job: SlurmJob | None = None
    """Inside a Slurm job: only the job's GPUs, in a ledger of the job's own."""
    max_shared_jobs: int = DEFAULT_MAX_SHARED_JOBS
    """Shared jobs a GPU may run at once (the system config's ``share.max_jobs``)."""
    share_placement: str = "fgd"
    """How a shared job's GPU is chosen (the system config's ``share.placement``)."""
    faults: list[GpuFault] = field(default_factory=list)
    """What is wrong with the GPUs now (see :mod:`gpualloc.discovery.health`)."""
    health_notes: list[str] = field(default_factory=list)
    """What could not be checked of the GPUs' health (``status`` says it)."""
    allow_unhealthy: bool = False
    """Place on unhealthy GPUs too (``--allow-unhealthy``)."""
    remote: RemoteLedger | None = None
    """Broker mode: the broker makes every change (:mod:`gpualloc.broker.remote`)."""
    served: LedgerTransaction | None = None
    """Broker mode: the ledger as the broker's snapshot showed it."""
    _pending_lock: tuple[int, str] | None = None
    """The lease lock taken by :meth:`record` in the current transaction, until it commits."""

    @classmethod
    def open(
        cls,
        topology: Topology,
        *,
        ignore_foreign: bool = False,
        create: bool = True,
        slurm_job: SlurmJob | None = None,
        state_dir: Path | None = None,
        lock_timeout_s: float | None = None,
        check_health: bool = True,
        owner: bool = False,
    ) -> HostLedger:
        """The ledger of ``topology`` (the host's, or a recorded topology's own); with
        ``slurm_job``, the job's own ledger, limited to its GPUs. ``state_dir`` is the
        configured state directory (None: read the configuration for it), ``lock_timeout_s``
        how long to wait for the ledger's lock (None: 30 s). ``check_health``: ask NVML and
        the kernel log which GPUs are unhealthy (a recorded topology declares them).
        ``owner``: the broker's store of its own directory (:mod:`gpualloc.ledger.store`)."""
        this_host = describes_this_host(topology)
        scope = ledger_scope(topology)
        if slurm_job is not None:
            scope = job_ledger_scope(scope, slurm_job.job_id)
        if this_host:
            now = observe(topology, processes=not ignore_foreign, health=check_health)
        else:
            now = GpusNow(declared_processes(topology), list(topology.faults))
        processes = now.processes
        try:
            if owner:
                assert state_dir is not None
                directory = open_broker_directory(state_dir).scoped(scope)
            else:
                directory = open_state_directory(state_dir, create=create).scoped(scope)
            kind = LedgerStore
            if owner:
                from gpualloc.ledger.owned_store import OwnedLedgerStore as kind
            store: LedgerStore | None = kind(
                directory,
                gpu_processes=_processes_for_reaping(topology, processes, this_host),
                lock_timeout_s=lock_timeout_s or LOCK_TIMEOUT_S,
            )
        except StateDirectoryMissing:
            store = None
        host = cls(topology, store, processes, this_host, ignore_foreign, slurm_job)
        host.faults, host.health_notes = now.faults, now.health_notes
        return host

    @property
    def outside(self) -> frozenset[int]:
        """The GPUs this ledger may not place on (those not the Slurm job's)."""
        if self.slurm_job is None:
            return frozenset()
        return frozenset(range(self.topology.gpu_count)) - self.slurm_job.gpus

    def refresh_processes(self) -> None:
        """Ask NVML again who runs on the GPUs, and how healthy they are (a waiting job does
        this now and then)."""
        if not self.this_host:
            return
        now = observe(
            self.topology, processes=not self.ignore_foreign, health=not self.allow_unhealthy
        )
        if not self.ignore_foreign:
            self.processes = now.processes
        if not self.allow_unhealthy:
            self.faults, self.health_notes = now.faults, now.health_notes

    def take_share_settings(self, config: Config) -> None:
        """Shared GPUs as the system config says (``share.max_jobs``, ``share.placement``);
        the embedded ledger and the broker both open their host this way."""
        self.max_shared_jobs = config.system_value("share.max_jobs")
        self.share_placement = config.system_value("share.placement")

    def occupancy(self, ledger: Ledger, *, allow_unhealthy: bool | None = None) -> Occupancy:
        """Who holds what in ``ledger`` on this host; unhealthy GPUs are left out unless
        ``allow_unhealthy`` (default: this host's setting)."""
        if allow_unhealthy is None:
            allow_unhealthy = self.allow_unhealthy
        return Occupancy.build(
            self.topology,
            ledger,
            self.processes.processes,
            ignore_foreign=self.ignore_foreign,
            outside=self.outside,
            memory_used=self.processes.memory_used,
            max_shared_jobs=self.max_shared_jobs,
            faults=() if allow_unhealthy else self.faults,
            share_placement=self.share_placement,
        )

    def snapshot(self) -> LedgerTransaction:
        """The ledger now, dead leases left out, without writing anything."""
        if self.served is not None:
            return self.served
        if self.remote is not None:
            return self.remote.snapshot()
        if self.store is None:
            return LedgerTransaction(Ledger(host=boot.hostname()))
        return self.store.snapshot()

    def ledger_store(self) -> LedgerStore:
        """The store, which exists unless the ledger was opened without creating it."""
        if self.remote is not None:
            raise LedgerError(
                f"this host's ledger is kept by its broker ({self.remote.path}), and this "
                "command does not go through the broker yet",
                hint="ask root to run it, or see 'gpualloc doctor'",
            )
        if self.store is None:  # only when opened with create=False
            raise LedgerError("the state directory does not exist")
        return self.store

    # ---- allocation ------------------------------------------------------------------------

    def allocate(
        self, want: Want, terms: LeaseTerms, *, allow_unhealthy: bool | None = None
    ) -> Allocation:
        """Choose GPUs and record the lease, in one transaction. Raises GpusBusy when the job
        would fit an idle host but not the GPUs free now (or only below its thresholds),
        NoFeasiblePlacement when it never fits. ``allow_unhealthy``: whether unhealthy GPUs may
        be chosen (default: this host's setting)."""
        if allow_unhealthy is None:
            allow_unhealthy = self.allow_unhealthy
        if self.remote is not None:
            return self.remote.allocate(want, terms, allow_unhealthy=allow_unhealthy)
        with self.transaction() as txn:
            occupancy = self.occupancy(txn.ledger, allow_unhealthy=allow_unhealthy)
            started = time.perf_counter()
            placement = choose(self.topology, occupancy, want)
            decided = time.perf_counter() - started
            txn.count_passed_over(newcomer_passes(self.topology, txn, occupancy, want, terms))
            return self.record(txn, placement, want, terms, decision_s=decided)

    @contextmanager
    def transaction(self, *, lock_timeout_s: float | None = None) -> Iterator[LedgerTransaction]:
        """A ledger transaction; a lease lock taken in it is dropped again if it fails."""
        store = self.ledger_store()
        self._pending_lock = None
        try:
            with store.transaction(lock_timeout_s=lock_timeout_s) as txn:
                yield txn
        except BaseException:
            if self._pending_lock is not None:
                _drop_lock(self._pending_lock[0], store, self._pending_lock[1])
            raise
        finally:
            self._pending_lock = None

    def record(
        self,
        txn: LedgerTransaction,
        placement: Placement,
        want: Want,
        terms: LeaseTerms,
        *,
        decision_s: float | None = None,
        waited_s: float = 0.0,
    ) -> Allocation:
        """Add the lease for ``placement`` to ``txn`` (taking its lease lock if asked), and
        count it in the ledger's statistics (how long deciding took, how long it waited)."""
        store = self.ledger_store()
        lease_id = terms.lease_id or new_lease_id()
        lock_fd = take_lease_lock(store.directory.lease_lock(lease_id)) if terms.lock else None
        if lock_fd is not None:
            self._pending_lock = (lock_fd, lease_id)
        lease = self._lease(lease_id, placement, want, terms)
        txn.add(lease)
        txn.ledger.stats.record(
            placement.policy, decision_s=decision_s, waited_s=waited_s, task=_task_type(lease)
        )
        return Allocation(lease, placement, lock_fd, txn.notes)

    def _lease(self, lease_id: str, placement: Placement, want: Want, terms: LeaseTerms) -> Lease:
        from gpualloc.ledger.liveness import process_start_time

        start_time = terms.pid_start_time
        if terms.pid is not None and start_time is None:
            start_time = process_start_time(terms.pid)
            if start_time is None:
                raise RequestError(
                    f"no process with pid {terms.pid}", hint="give the pid of a running process"
                )
        uid = os.geteuid() if terms.uid is None else terms.uid
        creator_pid, creator_start = terms.creator or (os.getpid(), None)
        if terms.announce and creator_start is None:
            creator_start = process_start_time(creator_pid)
        mig = [self.topology.mig_device(*key) for key in placement.mig_devices]
        return Lease(
            id=lease_id,
            gpus=tuple(LeasedGpu(index=g, uuid=self.topology.gpu(g).uuid) for g in placement.gpus),
            mig=tuple(
                LeasedMig(gpu=m.gpu, device=m.device, uuid=m.uuid, profile=m.profile) for m in mig
            ),
            uid=uid,
            user=owner_name(uid),
            pid=terms.pid,
            pid_start_time=start_time,
            lock=terms.lock,
            hold=terms.hold,
            command=terms.command,
            name=terms.name,
            policy=placement.policy,
            sensitive=want.request.sensitive,
            scores=placement.score_values(),
            created=datetime.now(timezone.utc),
            source=terms.source,
            boot_id=boot_id(),
            process_group=terms.process_group,
            announced=not terms.announce,
            creator_pid=creator_pid if terms.announce else None,
            creator_start_time=creator_start if terms.announce else None,
            shareable=terms.shareable,
            memory_bytes=want.share.memory_bytes if want.share else terms.memory_bytes,
            share=(
                self.leased_share(want.share, placement.gpus[0], terms.share_mode)
                if want.share is not None
                else None
            ),
        )

    def leased_share(self, request: ShareRequest, gpu: int, mode: ShareMode) -> LeasedShare:
        """How a shared job for ``request`` holds ``gpu``."""
        return request.leased(self.topology.gpu(gpu).memory_total_bytes, self.max_shared_jobs, mode)

    def confirm(self, lease_id: str) -> None:
        """Mark the lease announced: its id has reached its user (issue 18, point 6)."""
        if self.remote is not None:
            self.remote.confirm(lease_id)
            return
        with self.ledger_store().transaction() as txn:
            lease = txn.ledger.find(lease_id)
            if lease is not None and not lease.announced:
                txn.replace(
                    replace(lease, announced=True, creator_pid=None, creator_start_time=None)
                )

    def release(self, lease_id: str) -> None:
        """Drop one lease of the caller's, quietly (an exec that failed, a lost race)."""
        if self.remote is not None:
            self.remote.release(lease_id)
            return
        store = self.ledger_store()
        with store.transaction() as txn:
            txn.remove(lease_id)
        _remove_file(store.directory.lease_lock(lease_id))

    # ---- release and gc --------------------------------------------------------------------

    def release_leases(
        self, selectors: Iterable[str], *, mine: bool = False, uid: int | None = None
    ) -> ReleaseResult:
        """Release the leases ``selectors`` name (ids or unique id prefixes), or all of the
        caller's with ``mine``. Only the owner or root may release a lease; ``uid`` is the
        caller (None: this process's user; the broker names its peer)."""
        if self.remote is not None:
            return self.remote.release_leases(selectors, mine=mine)
        store = self.ledger_store()
        uid = os.geteuid() if uid is None else uid
        result = ReleaseResult()
        with store.transaction() as txn:
            targets = find_leases(txn, selectors, result.problems)
            if mine:
                targets += [x for x in txn.ledger.leases if x.uid == uid and x not in targets]
            for lease in targets:
                if lease.uid != uid and uid != 0:
                    result.problems.append(
                        NotPermitted(
                            f"lease {lease.id} belongs to {lease.user} (uid {lease.uid})",
                            hint="only its owner or root may release it",
                        )
                    )
                    continue
                txn.remove(lease.id)
                result.released.append(lease)
        for lease in result.released:
            _remove_file(store.directory.lease_lock(lease.id))
        return result

    def collect_garbage(self, idle: IdlePolicy | None = None) -> GarbageReport:
        """Reap dead leases now, and remove lease lock files that no lease names; with
        ``idle``, record how long each lease's GPUs have been idle, give idle ``--hold`` leases
        notice and release those whose notice ran out (see :mod:`gpualloc.ledger.idle`).
        Through a broker, the broker's own idle policy applies."""
        if self.remote is not None:
            return self.remote.collect_garbage()
        store = self.ledger_store()
        expiries: list[Expiry] = []
        with store.transaction() as txn:
            reaped = list(txn.reaped)
            dropped = list(txn.reaped_waiters)
            if idle is not None:
                from gpualloc.ledger.idle import record_look

                now = datetime.now(timezone.utc)
                expiries = record_look(txn, self.processes.utilization, idle, now)
            named = {lease.id for lease in txn.ledger.leases}
        removed = []
        for path in store.directory.lease_locks():
            lease_id = path.name[len("lease-") : -len(".lock")]
            if lease_id in named or not _old(path) or lock_held(path):
                continue
            if _remove_file(path):
                removed.append(path.name)
        return GarbageReport(reaped, dropped, removed, txn.notes, expiries)


class ReleaseResult(Struct):
    released: list[Lease] = field(default_factory=list)
    problems: list[RequestError | NoSuchLease | NotPermitted] = field(default_factory=list)


class GarbageReport(Struct):
    reaped: list[Lease]
    dropped_waiters: list[Waiter]
    """Queue entries of waiting gpualloc processes that are gone."""
    removed_lock_files: list[str]
    notes: list[str]
    expiries: list[Expiry] = field(default_factory=list)
    """Idle ``--hold`` leases given notice, or released (``idle.expire_holds``)."""


# ---- helpers -----------------------------------------------------------------------------------


def _processes_for_reaping(
    topology: Topology, seen: ProcessReport, this_host: bool
) -> Callable[[], list[GpuProcess]]:
    """What runs on the GPUs, for deciding whether a lease lives: whoever reaps must decide
    the same, so a command that ignores foreign processes (``--ignore-foreign``, the Slurm
    hooks) still asks NVML, but only once a lease looks dead, and once."""
    found: list[list[GpuProcess]] = []

    def processes() -> list[GpuProcess]:
        if not found:
            needs_asking = this_host and seen.source == "none"
            found.append(live_processes(topology).processes if needs_asking else seen.processes)
        return found[0]

    return processes


def _old(path: Path) -> bool:
    import time

    try:
        return time.time() - path.lstat().st_mtime > ORPHAN_LOCK_AGE_S
    except OSError:
        return False


def _remove_file(path: Path) -> bool:
    """Remove ``path`` whoever holds it (the lease is gone); False if it could not be."""
    try:
        path.unlink()
    except OSError:
        return False  # gone already, or another user's file in a sticky directory
    return True


def _drop_lock(fd: int | None, store: LedgerStore, lease_id: str) -> None:
    if fd is not None:
        os.close(fd)
        _remove_file(store.directory.lease_lock(lease_id))


def _task_type(lease: Lease) -> tuple[int, float] | str | None:
    """What the request mix counts a lease as: (GPUs, part of one GPU), or a MIG device's
    profile."""
    if lease.mig:
        return lease.mig[0].profile  # None when the layout did not name it
    if lease.share is not None:
        return (1, lease.share.fraction)
    return (len(lease.gpus), 1.0)
