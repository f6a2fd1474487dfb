"""The embedded ledger: decide and record in one locked transaction, in this process.

The race that breaks every small GPU picker (read who is free, then use it, while another job
does the same) is closed here: the placement is computed *inside* the ledger transaction, from
the ledger as it stands under the lock, and the lease is written before the lock is released.
Two gpualloc processes can therefore never be given the same GPU.

:class:`LocalHost` is the :class:`~gpualloc.host.protocol.Host` of one user's ledger (the
default), of a Slurm job's, of a recorded topology's, and of the broker itself (``owner``). What
runs on the GPUs outside gpualloc is read before the transaction (asking NVML takes time, and
holding the ledger lock meanwhile would serialise every user of the host on the driver).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from msgspec.structs import replace

from gpualloc import boot
from gpualloc.discovery.processes import ProcessReport, declared_processes
from gpualloc.discovery.this_host import describes_this_host
from gpualloc.errors import LedgerError, RequestError
from gpualloc.host.ending import remove_file
from gpualloc.host.lease_terms import LeaseTerms
from gpualloc.host.new_lease import new_lease
from gpualloc.host.queue import newcomer_passes
from gpualloc.host.terms import Allocation, GarbageReport, ReleaseResult
from gpualloc.host.time_rules import TimeRules
from gpualloc.host.view import HostView
from gpualloc.ledger.liveness import lock_held, take_lease_lock
from gpualloc.ledger.schema import Lease, Ledger
from gpualloc.ledger.scope import job_ledger_scope, ledger_scope
from gpualloc.ledger.statedir import (
    StateDirectoryMissing,
    open_broker_directory,
    open_state_directory,
)
from gpualloc.ledger.store import LOCK_TIMEOUT_S, LedgerStore, LedgerTransaction, new_lease_id
from gpualloc.model.request import HostState, Placement
from gpualloc.model.topology import GpuProcess, Topology
from gpualloc.placement.choose import PlacementTooPoor, choose, good_enough, searched
from gpualloc.placement.want import Want

if TYPE_CHECKING:
    from gpualloc.config import Config
    from gpualloc.host.grant import Grant
    from gpualloc.host.queue_policy import WaitOptions
    from gpualloc.host.receipt import Receipt
    from gpualloc.host.terms import WaitStatus
    from gpualloc.launcher.verify_terms import VerifyTerms
    from gpualloc.ledger.idle import Expiry, IdlePolicy
    from gpualloc.ledger.occupancy import Occupancy
    from gpualloc.ledger.trust import Trust
    from gpualloc.model.job_fields import JobFields
    from gpualloc.slurm.job import SlurmJob

ORPHAN_LOCK_AGE_S = 60.0
"""A lease lock file no lease names is removed only when older than this, so that the lock of a
lease being created right now (file made, ledger not yet written) is never taken for litter."""


class PlacementPending(Exception):  # a signal to the broker, not an error
    """No answer is remembered for this request on this host state: it waits for the broker's
    placement worker (:mod:`gpualloc.broker.placer`)."""

    def __init__(self, key: tuple[Want, HostState], occupancy: Occupancy, want: Want) -> None:
        super().__init__("placement pending")
        self.key, self.occupancy, self.want = key, occupancy, want


MAX_REMEMBERED_PLACEMENTS = 4096
"""Placements :attr:`LocalHost.placement_memo` keeps before it forgets them all at once."""


class LocalHost(HostView, kw_only=True):
    """A topology together with its ledger, changed in this process under the ledger's lock."""

    store: LedgerStore | None = None
    """None when the state directory does not exist yet (opened without creating it)."""
    _pending_lock: tuple[int, str] | None = None
    """The lease lock taken by :meth:`record` in the current transaction, until it commits."""
    placement_memo: dict[tuple[Want, HostState], Placement] | None = None
    """Placements remembered by request and host state (:meth:`placement`): the broker sets
    one, and answers the same request on the same free GPUs without a search
    (tests/test_broker_throughput.py::test_the_same_request_on_the_same_free_gpus_is_searched_once).
    None: every placement is searched (one request a process)."""
    placer: Any = None
    """The broker's placement worker (:class:`gpualloc.broker.placer.Placer`), which searches
    what the memo does not hold while the broker serves others; None: searched here."""
    time_rules: TimeRules = TimeRules()
    """The system configuration's time limits, granted at :meth:`allocate`'s door."""

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
    ) -> LocalHost:
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
            from gpualloc.discovery.live import observe  # NVML and the kernel log: this host

            now = observe(topology, processes=not ignore_foreign, health=check_health)
            processes, faults, health_notes = now.processes, now.faults, now.health_notes
        else:
            processes, faults, health_notes = (
                declared_processes(topology),
                list(topology.faults),
                [],
            )
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
        return cls(
            topology=topology,
            store=store,
            processes=processes,
            this_host=this_host,
            ignore_foreign=ignore_foreign,
            slurm_job=slurm_job,
            faults=faults,
            health_notes=health_notes,
        )

    @property
    def broker_socket(self) -> Path | None:
        """None: this process changes the ledger itself."""
        return None

    @property
    def opening_notes(self) -> list[str]:
        return list(self.processes.notes)

    def refresh_processes(self) -> None:
        """Ask NVML again who runs on the GPUs, and how healthy they are (a waiting job does
        this now and then)."""
        if not self.this_host:
            return
        from gpualloc.discovery.live import observe

        now = observe(
            self.topology, processes=not self.ignore_foreign, health=not self.allow_unhealthy
        )
        if not self.ignore_foreign:
            self.processes = now.processes
        if not self.allow_unhealthy:
            self.faults, self.health_notes = now.faults, now.health_notes

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

    def allocate(
        self,
        want: Want,
        terms: LeaseTerms,
        *,
        wait: WaitOptions | None = None,
        report: Callable[[WaitStatus], None] | None = None,
        allow_unhealthy: bool | None = None,
    ) -> Allocation:
        """Choose GPUs and record the lease, in one transaction. Raises GpusBusy when the job
        would fit an idle host but not the GPUs free now (or only below its thresholds),
        NoFeasiblePlacement when it never fits. With ``wait``, queue as
        :func:`gpualloc.host.wait.wait_and_allocate` does. ``allow_unhealthy``: whether
        unhealthy GPUs may be chosen (default: this host's setting)."""
        self.time_rules.grant(terms)  # exit 12 before any GPU is taken or place in the queue
        if wait is not None:
            from gpualloc.host.wait import wait_and_allocate

            if report is None:
                return wait_and_allocate(self, want, terms, wait)
            return wait_and_allocate(self, want, terms, wait, report=report)
        if allow_unhealthy is None:
            allow_unhealthy = self.allow_unhealthy
        try:
            with self.transaction() as txn:
                occupancy = self.occupancy(txn.ledger, allow_unhealthy=allow_unhealthy)
                started = time.perf_counter()
                placement = self.placement(occupancy, want)
                decided = time.perf_counter() - started
                passed = newcomer_passes(
                    self.topology, txn, occupancy, want, terms, budget_s=self.placement_budget_s
                )
                txn.count_passed_over(passed)
                return self.record(txn, placement, want, terms, decision_s=decided)
        except PlacementTooPoor:
            from gpualloc.host.wait import never_fits

            never_fits(self, want)  # no placement on this host meets it: exit 9, not "wait"
            raise

    def start(
        self,
        job: JobFields,
        terms: LeaseTerms,
        *,
        config: Config,
        wait: WaitOptions | None = None,
        report: Callable[[WaitStatus], None] | None = None,
        uuid: bool = False,
    ) -> Grant:
        """The job's Want, its checks, allocation (or wait) and grant, as the broker's."""
        from gpualloc.host.grant import grant_of
        from gpualloc.host.launching import check_before_placing
        from gpualloc.model.job import JobOptions
        from gpualloc.placement.options import want_of

        want = want_of(JobOptions(**job), config)
        check_before_placing(self.topology, want, terms.memory_bytes, uuid=uuid)
        allocation = self.allocate(want, terms, wait=wait, report=report)
        return grant_of(self.topology, allocation, want, uuid=uuid, this_host=self.this_host)

    def placement(self, occupancy: Occupancy, want: Want) -> Placement:
        """Where ``want`` goes on the GPUs free in ``occupancy`` (:func:`choose`), from
        :attr:`placement_memo` when it holds the answer. Only the policy's own choices are
        remembered (:func:`searched`): they depend on the request and the host state alone
        (free GPUs, running jobs), where an explicit list, a MIG device or a shared place
        depend on more. With a :attr:`placer`, a search not remembered is left to the
        broker's worker: :class:`PlacementPending`."""
        memo = self.placement_memo
        if memo is None or want.explicit is not None or want.mig or want.share:
            return self._named(
                choose(self.topology, occupancy, want, budget_s=self.placement_budget_s)
            )
        # How the job was typed (``want.options``) is no part of the question: "0-3" and
        # (0, 1, 2, 3) ask the same one, so they share the remembered answer.
        want = replace(want, options=None)
        key = (want, occupancy.host_state())
        found = memo.get(key)
        if found is None:
            placer = self.placer
            if placer is not None and placer.defers(key):
                raise PlacementPending(key, occupancy, want)
            found = self._named(
                searched(self.topology, occupancy, want, budget_s=self.placement_budget_s)
            )
            self.remember(key, found)
        return good_enough(found, want)

    def _named(self, placement: Placement) -> Placement:
        """``placement``, its cut-short note naming the budget this host searched under."""
        note, default = placement.cut_short, "(placement.time_budget)"
        if not note or self.budget_setting == "placement.time_budget" or default not in note:
            return placement
        return replace(placement, cut_short=note.replace(default, f"({self.budget_setting})"))

    def remember(self, key: tuple[Want, HostState], placement: Placement) -> None:
        """Keep ``placement`` in :attr:`placement_memo` (forgotten all at once at its bound)."""
        memo = self.placement_memo
        if memo is None:
            return
        if len(memo) >= MAX_REMEMBERED_PLACEMENTS:
            memo.clear()
        memo[key] = placement

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
        else:
            if self._pending_lock is not None:  # a job's lease lock: gone when the job is
                from gpualloc.launcher.watcher import remove_lock_when_released

                remove_lock_when_released(store.directory.lease_lock(self._pending_lock[1]))
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
        taken_id(txn, lease_id)
        lock_fd = take_lease_lock(store.directory.lease_lock(lease_id)) if terms.lock else None
        if lock_fd is not None:
            self._pending_lock = (lock_fd, lease_id)
        lease = new_lease(self, lease_id, placement, want, terms, waited_s=waited_s)
        txn.add(lease)
        txn.ledger.stats.record(
            placement.policy, decision_s=decision_s, waited_s=waited_s, task=lease.task_type
        )
        cut_short = [placement.cut_short] if placement.cut_short else []
        return Allocation(lease, placement, lock_fd, [*txn.notes, *cut_short])

    def start_time_limit_watch(self, grant: Grant, *, here: bool = False) -> None:
        """Fork the watch that ends the job at its lease's time limit, if it has one and a
        process (``run``'s, or ``alloc --pid``'s): on the file ledger it is the job's user's
        (:mod:`gpualloc.launcher.time_limit`)."""
        lease = grant.record
        if not isinstance(lease, Lease) or lease.pid is None:
            return
        if lease.ends is not None and lease.time_limit_s:
            from gpualloc.launcher.time_limit import start_time_limit_watch

            sent = lease.signal
            warning = None if sent is None else (sent.number, sent.before_s, sent.leader_only)
            kill_wait_s = self.time_rules.kill_wait_s
            job = None if here or lease.pid == os.getpid() else lease.pid  # the job: this process
            store, lease_id = self.ledger_store(), lease.id

            def alive() -> bool:  # in the ledger, and living by its rule
                return store.snapshot().ledger.find(lease_id) is not None

            start_time_limit_watch(
                lease.ends, lease.time_limit_s, kill_wait_s, warning,
                lease_alive=alive, job=job, started=lease.pid_start_time,
            )  # fmt: skip

    def hang_up(self) -> None:
        """Nothing to close: each transaction opens and closes the ledger file."""

    def confirm(self, lease_id: str) -> None:
        """Mark the lease announced: its id has reached its user, so ``status`` no longer
        marks it orphaned."""
        with self.ledger_store().transaction() as txn:
            lease = txn.ledger.find(lease_id)
            if lease is not None and not lease.announced:
                txn.replace(
                    replace(lease, announced=True, creator_pid=None, creator_start_time=None)
                )

    def adopt(self, lease_id: str, pid: int, *, uid: int | None = None) -> None:
        """:meth:`Host.adopt`: the lease records ``pid``'s process group (the job holds the
        lease lock too, which it inherited); ``uid``: the caller, as for :meth:`exited`."""
        from gpualloc.host.ending import adopted

        with self.ledger_store().transaction() as txn:
            lease = adopted(txn.ledger.find(lease_id), lease_id, pid, uid=uid)
            if lease is not None:
                txn.replace(lease)

    def release(self, lease_id: str) -> None:
        """Drop one lease of the caller's, quietly (an exec that failed, a lost race)."""
        store = self.ledger_store()
        with store.transaction() as txn:
            txn.remove(lease_id)
        remove_file(store.directory.lease_lock(lease_id))

    def exited(
        self,
        lease_id: str,
        status: int,
        *,
        cancelled: bool = False,
        uid: int | None = None,
        running: bool | None = None,
    ) -> None:
        """:meth:`Host.exited`; ``uid``: the caller (None: this process's user; the broker
        names its peer), who must own the lease or be root; ``running``: whether processes
        of the job still run (:func:`gpualloc.host.ending.end_exited`)."""
        from gpualloc.host.ending import end_exited

        end_exited(
            self.ledger_store(), lease_id, status, cancelled=cancelled, uid=uid, running=running
        )

    # ---- release and gc --------------------------------------------------------------------

    def release_leases(
        self,
        selectors: Iterable[str],
        *,
        mine: bool = False,
        include_running: bool = False,
        uid: int | None = None,
    ) -> ReleaseResult:
        """Release the leases ``selectors`` name (ids, unique id prefixes, names), or all of
        the caller's with ``mine``: their ``alloc`` leases, and their running jobs' too only
        with ``include_running`` (:func:`keeps_its_job`; those left are ``kept``). Only the
        owner or root may release a lease; ``uid`` is the caller (None: this process's user;
        the broker names its peer). A release that releases nothing and is refused writes
        nothing, not even the reaping (the ledger is as the refusal found it)."""
        from gpualloc.host.ending import release_leases

        return release_leases(
            self.ledger_store(), selectors, mine=mine, include_running=include_running, uid=uid
        )

    def release_receipt(
        self, selectors: Iterable[str], *, mine: bool = False, include_running: bool = False
    ) -> Receipt:
        from gpualloc.host.receipt import receipt_of

        return receipt_of(
            self.release_leases(selectors, mine=mine, include_running=include_running)
        )

    def evict(
        self,
        selectors: Iterable[str],
        *,
        mine: bool = False,
        grace_s: float | None = None,
        uid: int | None = None,
    ) -> ReleaseResult:
        """Mark the shared jobs beside the leases ``selectors`` name (all the caller's with
        ``mine``) for eviction: see :func:`gpualloc.host.eviction.mark_shared_jobs`. ``uid`` is
        the caller (None: this process's user; the broker names its peer)."""
        from gpualloc.host.eviction import mark_shared_jobs

        uid = os.geteuid() if uid is None else uid
        with self.ledger_store().transaction() as txn:
            result = mark_shared_jobs(txn, selectors, mine=mine, grace_s=grace_s, uid=uid)
            if result.problems and not result.released:
                txn.changed = False  # refused: written nowhere (see release_leases)
            return result

    def start_verifier(
        self, grant: Grant, terms: VerifyTerms, look: Callable[[], list[GpuProcess]] | None
    ) -> None:
        """Fork the verifier of this process, about to exec the job (see
        :mod:`gpualloc.launcher.verify`); ``look`` lists the GPUs' processes (None: they never
        change, so there is nothing to verify)."""
        from gpualloc.launcher.verify import start_verifier

        if look is not None and self.store is not None:
            lease = grant.record
            assert isinstance(lease, Lease)  # this host's own grant (Host.start)
            start_verifier(lease, self.store.directory.ledger_file, look, terms)

    def ledger_file(self) -> Path | None:
        return None if self.store is None else self.store.directory.ledger_file

    def ledger_place(self) -> str:
        return "none yet" if self.store is None else str(self.store.directory.ledger_file)

    def trust(self, *, detailed: bool = False) -> Trust:
        from gpualloc.ledger.trust import NO_LEDGER, directory_trust

        return NO_LEDGER if self.store is None else directory_trust(self.store.directory)

    def collect_garbage(self, idle: IdlePolicy | None = None) -> GarbageReport:
        """Reap dead leases now, and remove lease lock files that no lease names and the
        temporary files that killed writers of this scope's ledger left (both once a minute
        old); with ``idle``, record how long each lease's GPUs have been idle, give idle
        ``--hold`` leases notice and release those whose notice ran out (see
        :mod:`gpualloc.ledger.idle`)."""
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
            # Under the ledger lock: this scope's writers rename their files before they let
            # it go, so what is left is the litter of one that was killed.
            litter = [
                path.name
                for path in store.directory.temporary_files()
                if _old(path) and remove_file(path)
            ]
        removed = []
        for path in store.directory.lease_locks():
            lease_id = path.name[len("lease-") : -len(".lock")]
            if lease_id in named or not _old(path) or lock_held(path):
                continue
            if remove_file(path):
                removed.append(path.name)
        return GarbageReport(reaped, dropped, removed, txn.notes, expiries, litter)


# ---- helpers -----------------------------------------------------------------------------------


def taken_id(txn: LedgerTransaction, lease_id: str) -> None:
    """Refuse a new lease or waiter id that names one already in the ledger: the broker's
    clients choose their ids (to find a request again after a lost connection), so one naming
    another's waiter would take its place in the queue
    (tests/test_broker_fairness.py::test_naming_another_users_waiter_is_refused_and_the_queue_keeps_moving)."""
    if txn.ledger.find(lease_id) is not None or txn.ledger.waiter(lease_id) is not None:
        raise RequestError(f"id {lease_id} is in use", hint="let gpualloc choose ids")


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


def live_processes(topology: Topology) -> ProcessReport:
    """Who runs on this host's GPUs now (:func:`gpualloc.discovery.live.live_processes`,
    imported only where the GPUs are this host's)."""
    from gpualloc.discovery.live import live_processes as ask_now

    return ask_now(topology)


def _old(path: Path) -> bool:
    try:
        return time.time() - path.lstat().st_mtime > ORPHAN_LOCK_AGE_S
    except OSError:
        return False


def _drop_lock(fd: int | None, store: LedgerStore, lease_id: str) -> None:
    if fd is not None:
        os.close(fd)
        remove_file(store.directory.lease_lock(lease_id))
