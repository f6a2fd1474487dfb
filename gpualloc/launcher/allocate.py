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
import pwd
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
from gpualloc.discovery.live import GpusNow, observe
from gpualloc.discovery.processes import ProcessReport, declared_processes, live_processes
from gpualloc.discovery.this_host import describes_this_host
from gpualloc.errors import (
    GpusBusy,
    LedgerError,
    NoFeasiblePlacement,
    NoSuchLease,
    NotPermitted,
    RequestError,
)
from gpualloc.ledger.liveness import lock_held, take_lease_lock
from gpualloc.ledger.occupancy import Occupancy
from gpualloc.ledger.schema import (
    Lease,
    LeasedGpu,
    LeasedMig,
    LeaseSource,
    Ledger,
    QueuedRequest,
    Waiter,
)
from gpualloc.ledger.scope import ledger_scope
from gpualloc.ledger.statedir import StateDirectoryMissing, open_state_directory
from gpualloc.ledger.store import LOCK_TIMEOUT_S, LedgerStore, LedgerTransaction, new_lease_id
from gpualloc.model.cpuset import format_cpulist
from gpualloc.model.mig import MigRequest
from gpualloc.model.request import HostState, JobRequest, Placement
from gpualloc.model.share import DEFAULT_MAX_SHARED_JOBS, LeasedShare, ShareMode, ShareRequest
from gpualloc.model.topology import GpuFault, GpuProcess, Topology
from gpualloc.placement.registry import DEFAULT_POLICY
from gpualloc.placement.scores import EffectiveModel
from gpualloc.placement.utility import UtilityWeights

if TYPE_CHECKING:
    from gpualloc.ledger.idle import Expiry, IdlePolicy
    from gpualloc.placement.context import DecisionContext
    from gpualloc.slurm.job import SlurmJob

EXPLICIT_POLICY = "explicit"
ORPHAN_LOCK_AGE_S = 60.0
"""A lease lock file no lease names is removed only when older than this, so that the lock of a
lease being created right now (file made, ledger not yet written) is never taken for litter."""


class Want(Struct, frozen=True):
    """What the caller wants: the engine's choice for ``request``, or exactly ``explicit``;
    with ``min_utility`` / ``min_bandwidth_gbps``, only a placement at least that good
    (postponement, DRB paper section 4.4)."""

    request: JobRequest
    policy: str = DEFAULT_POLICY
    explicit: tuple[int, ...] | None = None
    effective_model: EffectiveModel = EffectiveModel.AUTO
    weights: UtilityWeights | None = None
    min_utility: float | None = None
    min_bandwidth_gbps: float | None = None
    mig: MigRequest | None = None
    """A MIG device instead of whole GPUs (``request`` then asks for one GPU)."""
    share: ShareRequest | None = None
    """A shared place on one GPU instead of whole GPUs (``request`` then asks for one)."""

    def queued(self) -> QueuedRequest:
        """This request as the queue stores it."""
        weights = self.weights
        return QueuedRequest(
            gpus=self.request.gpus,
            pattern=self.request.pattern.name,
            edges=self.request.pattern.edges,
            sensitive=self.request.sensitive,
            required=tuple(sorted(self.request.required)),
            excluded=tuple(sorted(self.request.excluded)),
            explicit=self.explicit,
            policy=self.policy,
            score=self.effective_model.value,
            drb_weights=(
                (weights.communication, weights.interference, weights.fragmentation)
                if weights
                else None
            ),
            min_utility=self.min_utility,
            min_bandwidth_gbps=self.min_bandwidth_gbps,
            mig=self.mig,
            share=self.share,
        )

    @classmethod
    def from_queued(cls, queued: QueuedRequest) -> Want:
        """The request of a waiting job, as any gpualloc process can place it."""
        from gpualloc.model.request import CommunicationPattern

        return cls(
            request=JobRequest(
                gpus=queued.gpus,
                pattern=CommunicationPattern(queued.pattern, queued.gpus, queued.edges),
                sensitive=queued.sensitive,
                required=frozenset(queued.required),
                excluded=frozenset(queued.excluded),
            ),
            policy=queued.policy,
            explicit=queued.explicit,
            effective_model=EffectiveModel(queued.score),
            weights=UtilityWeights(*queued.drb_weights) if queued.drb_weights else None,
            min_utility=queued.min_utility,
            min_bandwidth_gbps=queued.min_bandwidth_gbps,
            mig=queued.mig,
            share=queued.share,
        )


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
    faults: list[GpuFault] = field(default_factory=list)
    """What is wrong with the GPUs now (see :mod:`gpualloc.discovery.health`)."""
    health_notes: list[str] = field(default_factory=list)
    """What could not be checked of the GPUs' health (``status`` says it)."""
    allow_unhealthy: bool = False
    """Place on unhealthy GPUs too (``--allow-unhealthy``)."""
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
    ) -> HostLedger:
        """The ledger of ``topology`` (the host's, or a recorded topology's own); with
        ``slurm_job``, the job's own ledger, limited to its GPUs. ``state_dir`` is the
        configured state directory (None: read the configuration for it), ``lock_timeout_s``
        how long to wait for the ledger's lock (None: 30 s). ``check_health``: ask NVML and
        the kernel log which GPUs are unhealthy (a recorded topology declares them)."""
        this_host = describes_this_host(topology)
        scope = ledger_scope(topology)
        if slurm_job is not None:
            from gpualloc.slurm.job import job_ledger_scope

            scope = job_ledger_scope(scope, slurm_job.job_id)
        if this_host:
            now = observe(topology, processes=not ignore_foreign, health=check_health)
        else:
            now = GpusNow(declared_processes(topology), list(topology.faults))
        processes = now.processes
        try:
            directory = open_state_directory(state_dir, create=create).scoped(scope)
            store: LedgerStore | None = LedgerStore(
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

    def occupancy(self, ledger: Ledger) -> Occupancy:
        return Occupancy.build(
            self.topology,
            ledger,
            self.processes.processes,
            ignore_foreign=self.ignore_foreign,
            outside=self.outside,
            memory_used=self.processes.memory_used,
            max_shared_jobs=self.max_shared_jobs,
            faults=() if self.allow_unhealthy else self.faults,
        )

    def snapshot(self) -> LedgerTransaction:
        """The ledger now, dead leases left out, without writing anything."""
        if self.store is None:
            return LedgerTransaction(Ledger(host=boot.hostname()))
        return self.store.snapshot()

    def ledger_store(self) -> LedgerStore:
        """The store, which exists unless the ledger was opened without creating it."""
        if self.store is None:  # only when opened with create=False
            raise LedgerError("the state directory does not exist")
        return self.store

    # ---- allocation ------------------------------------------------------------------------

    def allocate(self, want: Want, terms: LeaseTerms) -> Allocation:
        """Choose GPUs and record the lease, in one transaction. Raises GpusBusy when the job
        would fit an idle host but not the GPUs free now (or only below its thresholds),
        NoFeasiblePlacement when it never fits."""
        from gpualloc.launcher.wait import newcomer_passes

        with self.transaction() as txn:
            occupancy = self.occupancy(txn.ledger)
            started = time.perf_counter()
            placement = choose(self.topology, occupancy, want)
            decided = time.perf_counter() - started
            txn.count_passed_over(newcomer_passes(self, txn, occupancy, want, terms))
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
        lease_id = new_lease_id()
        lock_fd = take_lease_lock(store.directory.lease_lock(lease_id)) if terms.lock else None
        if lock_fd is not None:
            self._pending_lock = (lock_fd, lease_id)
        lease = self._lease(lease_id, placement, want, terms)
        txn.add(lease)
        txn.ledger.stats.record(placement.policy, decision_s=decision_s, waited_s=waited_s)
        return Allocation(lease, placement, lock_fd, txn.notes)

    def _lease(self, lease_id: str, placement: Placement, want: Want, terms: LeaseTerms) -> Lease:
        from gpualloc.ledger.liveness import process_start_time

        start_time = None
        if terms.pid is not None:
            start_time = process_start_time(terms.pid)
            if start_time is None:
                raise RequestError(
                    f"no process with pid {terms.pid}", hint="give the pid of a running process"
                )
        uid = os.geteuid()
        mig = [self.topology.mig_device(*key) for key in placement.mig_devices]
        return Lease(
            id=lease_id,
            gpus=tuple(LeasedGpu(index=g, uuid=self.topology.gpu(g).uuid) for g in placement.gpus),
            mig=tuple(
                LeasedMig(gpu=m.gpu, device=m.device, uuid=m.uuid, profile=m.profile) for m in mig
            ),
            uid=uid,
            user=user_name(uid),
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
            creator_pid=os.getpid() if terms.announce else None,
            creator_start_time=process_start_time(os.getpid()) if terms.announce else None,
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
        with self.ledger_store().transaction() as txn:
            lease = txn.ledger.find(lease_id)
            if lease is not None and not lease.announced:
                txn.replace(
                    replace(lease, announced=True, creator_pid=None, creator_start_time=None)
                )

    def release(self, lease_id: str) -> None:
        """Drop one lease of the caller's, quietly (an exec that failed, a lost race)."""
        store = self.ledger_store()
        with store.transaction() as txn:
            txn.remove(lease_id)
        _remove_file(store.directory.lease_lock(lease_id))

    # ---- release and gc --------------------------------------------------------------------

    def release_leases(self, selectors: Iterable[str], *, mine: bool = False) -> ReleaseResult:
        """Release the leases ``selectors`` name (ids or unique id prefixes), or all of the
        caller's with ``mine``. Only the owner or root may release a lease."""
        store = self.ledger_store()
        uid = os.geteuid()
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
        notice and release those whose notice ran out (see :mod:`gpualloc.ledger.idle`)."""
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


# ---- choosing ----------------------------------------------------------------------------------


def choose(topology: Topology, occupancy: Occupancy, want: Want) -> Placement:
    """The placement for ``want`` on the GPUs free in ``occupancy``.

    Raises :class:`GpusBusy` (naming who holds what) when the request would fit the host with
    every usable GPU free, and :class:`NoFeasiblePlacement` when it would not fit even then.
    """
    from gpualloc.placement.engine import decision_context
    from gpualloc.placement.registry import get_policy

    if want.mig is not None:
        return _mig_placement(topology, occupancy, want.mig)
    if want.share is not None:
        return _share_placement(topology, occupancy, want.share)
    if want.explicit is not None:
        return _good_enough(_explicit(topology, occupancy, want), want)
    policy = get_policy(want.policy)
    try:
        ctx = _context_now(topology, occupancy, want)
    except NoFeasiblePlacement as now:
        usable = (
            frozenset(range(topology.gpu_count))
            - occupancy.unusable
            - occupancy.outside
            - occupancy.mig
        )
        try:
            decision_context(topology, want.request, HostState(free=usable))
        except NoFeasiblePlacement as never:
            if occupancy.unhealthy:  # never fits: say that unhealthy GPUs do not count
                raise NoFeasiblePlacement(
                    f"{never.message} (GPU {format_cpulist(occupancy.unhealthy)} unhealthy: "
                    f"{'; '.join(occupancy.unhealthy.values())})",
                    hint="ask for fewer GPUs, have the GPUs reset, or --allow-unhealthy",
                ) from None
            if occupancy.mig:  # never fits: say that the GPUs in MIG mode do not count
                raise NoFeasiblePlacement(
                    f"{never.message} (GPU {format_cpulist(occupancy.mig)} in MIG mode cannot "
                    "be leased whole)",
                    hint="ask for a MIG device with --mig PROFILE or --mem SIZE, or fewer GPUs",
                ) from None
            raise
        raise _busy(occupancy, want.request, now) from None
    return _good_enough(policy.place(ctx), want)


MIG_POLICY = "mig-best-fit"


def _mig_placement(topology: Topology, occupancy: Occupancy, request: MigRequest) -> Placement:
    """The MIG device for ``request`` (see :mod:`gpualloc.placement.mig`) as a placement."""
    from gpualloc.model.request import UNSCORED
    from gpualloc.placement.mig import MigDevicesBusy, choose_mig

    taken = occupancy.mig_taken()
    try:
        unusable = occupancy.unusable | occupancy.outside
        choice = choose_mig(topology, request, taken, unusable=unusable)
    except MigDevicesBusy as busy:
        busy.details = tuple(dict.fromkeys(taken[key] for key in busy.held))
        raise
    instance = choice.instance
    return Placement(
        policy=MIG_POLICY,
        gpus=(),
        scores=UNSCORED,
        objective=choice.reason,
        notes=tuple(f"runner-up: {m.label} ({m.profile})" for m in choice.runners_up[:3]),
        mig_devices=((instance.gpu, instance.device),),
    )


SHARE_POLICY = "share-best-fit"


def _share_placement(topology: Topology, occupancy: Occupancy, request: ShareRequest) -> Placement:
    """The GPU for a shared job (see :mod:`gpualloc.placement.share`) as a placement."""
    from gpualloc.model.request import UNSCORED
    from gpualloc.placement.share import choose_share

    choice = choose_share(topology, occupancy, request, occupancy.max_shared_jobs)
    return Placement(
        policy=SHARE_POLICY,
        gpus=(choice.candidate.gpu,),
        scores=UNSCORED,
        objective=choice.reason,
        notes=tuple(f"runner-up: {c.describe()}" for c in choice.runners_up[:3]),
        shared=True,
    )


class PlacementTooPoor(GpusBusy):
    """Enough GPUs are free, but the placement they allow is below the job's threshold."""


def _good_enough(placement: Placement, want: Want) -> Placement:
    """``placement``, unless it misses ``--min-utility`` or ``--min-bandwidth``."""
    s = placement.scores
    gpus = ",".join(map(str, placement.gpus))
    if want.min_utility is not None and s.utility < want.min_utility:
        raise PlacementTooPoor(
            f"the best placement now (GPU {gpus}) has utility {s.utility:.3f}, below "
            f"--min-utility {want.min_utility:g}",
            hint="wait for better GPUs (--wait), or lower --min-utility",
        )
    effective = s.effective_gbps  # None for one GPU: no link to be slow
    if (
        want.min_bandwidth_gbps is not None
        and effective is not None
        and (effective < want.min_bandwidth_gbps)
    ):
        raise PlacementTooPoor(
            f"the best placement now (GPU {gpus}) predicts {effective:g} GB/s, below "
            f"--min-bandwidth {want.min_bandwidth_gbps:g}",
            hint="wait for better GPUs (--wait), or lower --min-bandwidth",
        )
    return placement


def _context_now(topology: Topology, occupancy: Occupancy, want: Want) -> DecisionContext:
    from gpualloc.placement.engine import decision_context

    return decision_context(
        topology,
        want.request,
        occupancy.host_state(),
        effective_model=want.effective_model,
        weights=want.weights,
    )


def _explicit(topology: Topology, occupancy: Occupancy, want: Want) -> Placement:
    gpus = want.explicit or ()
    n = topology.gpu_count
    outside = [g for g in gpus if not 0 <= g < n]
    if outside:
        raise RequestError(
            f"GPU {outside[0]} does not exist on this host ({n} GPUs: 0..{n - 1})",
            hint="'gpualloc topo show' lists the GPUs",
        )
    if len(set(gpus)) != len(gpus):
        raise RequestError("--gpus names a GPU twice", hint="list each GPU once")
    foreign_to_job = [g for g in gpus if g in occupancy.outside]
    if foreign_to_job:
        mine = sorted(frozenset(range(n)) - occupancy.outside)
        raise RequestError(
            f"GPU {format_cpulist(foreign_to_job)} is not this Slurm job's "
            f"(it has GPU {format_cpulist(mine)})",
            hint="choose among the job's GPUs, or ask Slurm for those GPUs",
        )
    split = [g for g in gpus if g in occupancy.mig]
    if split:
        raise RequestError(
            f"GPU {format_cpulist(split)} is in MIG mode and cannot be leased whole",
            hint="ask for one of its MIG devices with --mig (gpualloc topo show lists them)",
        )
    sick = [g for g in gpus if g in occupancy.unhealthy]
    if sick:
        raise NoFeasiblePlacement(
            f"GPU {sick[0]} of --gpus is unhealthy: {occupancy.unhealthy[sick[0]]}",
            hint="choose other GPUs, have it reset, or --allow-unhealthy",
        )
    taken = [g for g in gpus if g in occupancy.busy]
    if taken:
        raise GpusBusy(
            f"GPU {format_cpulist(taken)} of --gpus {','.join(map(str, gpus))} is not free",
            details=tuple(occupancy.describe(taken)),
            hint="'gpualloc status' shows the host; choose other GPUs or leave out --gpus",
        )
    ctx = _context_now(topology, occupancy, want)
    return ctx.placement(EXPLICIT_POLICY, gpus, "the GPUs given with --gpus, in that order")


def _busy(occupancy: Occupancy, request: JobRequest, why: NoFeasiblePlacement) -> GpusBusy:
    required_busy = sorted(request.required & occupancy.busy)
    free = sorted(occupancy.free - request.excluded)
    if required_busy:
        message = why.message
    else:
        message = f"the job needs {request.gpus} GPU(s) and {len(free)} usable one(s) are free"
        message += f" now ({format_cpulist(free)})" if free else " now"
    return GpusBusy(
        message,
        details=tuple(
            occupancy.describe(required_busy or sorted(occupancy.busy - occupancy.outside))
        ),
        hint="wait for them ('gpualloc status' shows the host), or ask for fewer GPUs",
    )


# ---- helpers -----------------------------------------------------------------------------------


def find_leases(txn: LedgerTransaction, selectors: Iterable[str], problems: list) -> list[Lease]:
    """The leases ``selectors`` name, each once (see :func:`find_lease`); a selector that names
    none adds its :class:`NoSuchLease` to ``problems``."""
    found: list[Lease] = []
    for selector in selectors:
        try:
            lease = find_lease(txn, selector)
        except NoSuchLease as missing:
            problems.append(missing)
            continue
        if lease is not None and lease not in found:
            found.append(lease)
    return found


def find_lease(txn: LedgerTransaction, selector: str) -> Lease | None:
    """The lease ``selector`` names: an id, or a unique prefix of one (4 characters or more).
    A lease this very transaction reaped counts as found and already gone (None)."""
    selector = selector.strip().lower()
    if len(selector) < 4:
        raise NoSuchLease(
            f"lease id {selector!r} is too short", hint="give at least 4 characters of the id"
        )
    matches = [x for x in txn.ledger.leases if x.id.startswith(selector)]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise NoSuchLease(
            f"lease id {selector!r} is ambiguous ({', '.join(x.id for x in matches)})",
            hint="give more characters of the id",
        )
    if any(x.id.startswith(selector) for x in txn.reaped):
        return None
    raise NoSuchLease(
        f"no lease {selector}", hint="'gpualloc status' lists the leases; it may have ended"
    )


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


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
