"""The front door of a host: :class:`Host`, what every command, the Python API and the broker ask.

Two implementations, side by side as the Kubernetes device plugin keeps its NVML and Tegra
resource managers: :class:`~gpualloc.host.local.LocalHost`, the embedded ledger (a file under
``flock``, changed in this process), and :class:`~gpualloc.host.brokered.BrokeredHost`, whose
changes the host's broker (``gpualloc serve``) makes. :func:`gpualloc.host.open.open_host` is the
one place that decides which a command gets. Callers never ask which they hold: the same
request gives the same results, errors and exit codes from either.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gpualloc.config import Config
    from gpualloc.discovery.processes import ProcessReport
    from gpualloc.host.grant import Grant
    from gpualloc.host.lease_terms import LeaseTerms
    from gpualloc.host.queue_policy import WaitOptions
    from gpualloc.host.receipt import Receipt
    from gpualloc.host.terms import Allocation, GarbageReport, ReleaseResult, WaitStatus
    from gpualloc.launcher.verify_terms import VerifyTerms
    from gpualloc.ledger.idle import IdlePolicy
    from gpualloc.ledger.occupancy import Occupancy
    from gpualloc.ledger.schema import Ledger
    from gpualloc.ledger.store import LedgerTransaction
    from gpualloc.ledger.trust import Trust
    from gpualloc.model.job_fields import JobFields
    from gpualloc.model.request import Placement
    from gpualloc.model.share import LeasedShare, ShareMode, ShareRequest
    from gpualloc.model.topology import GpuFault, GpuProcess, Topology
    from gpualloc.placement.want import Want
    from gpualloc.slurm.job import SlurmJob


class Host(Protocol):
    """A host's GPUs, who uses them, and the ledger of who holds them."""

    @property
    def topology(self) -> Topology: ...

    @property
    def processes(self) -> ProcessReport:
        """What runs on the GPUs (NVML, nvidia-smi, or a recorded topology's list)."""
        ...

    @property
    def this_host(self) -> bool:
        """Whether the topology is the machine this runs on (then jobs are bound and watched)."""
        ...

    @property
    def faults(self) -> list[GpuFault]: ...

    @property
    def health_notes(self) -> list[str]: ...

    @property
    def opening_notes(self) -> list[str]:
        """What opening the host found to say (how the GPUs' processes were read)."""
        ...

    allow_unhealthy: bool
    placement_budget_s: float | None
    slurm_job: SlurmJob | None

    @property
    def broker_socket(self) -> Path | None:
        """The broker that keeps the ledger, or None for the embedded ledger."""
        ...

    def snapshot(self) -> LedgerTransaction:
        """The ledger now, dead leases left out, without writing anything."""
        ...

    def occupancy(
        self,
        ledger: Ledger,
        *,
        allow_unhealthy: bool | None = None,
        ignore_foreign: bool | None = None,
    ) -> Occupancy:
        """Who holds what in ``ledger``; unhealthy GPUs are left out unless ``allow_unhealthy``,
        GPUs used outside gpualloc count as free with ``ignore_foreign`` (defaults: the host's
        settings; ``plan``'s what-ifs count no foreign process)."""
        ...

    def allocate(
        self,
        want: Want,
        terms: LeaseTerms,
        *,
        wait: WaitOptions | None = None,
        report: Callable[[WaitStatus], None] | None = None,
        allow_unhealthy: bool | None = None,
    ) -> Allocation:
        """Choose GPUs for ``want`` and record the lease, in one transaction; with ``wait``,
        queue until it is this job's turn (``report`` hears how the wait goes). Raises GpusBusy
        when the GPUs are taken (without ``wait``), NoFeasiblePlacement when it never fits,
        WaitTimedOut when the wait runs out."""
        ...

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
        """Allocate for ``job`` as :meth:`allocate` does (``job``: the options of
        :class:`~gpualloc.model.job.JobOptions` by name, made one at the host's door, their
        bounds checked there; ``config``: the caller's settings, which the job's defaults come
        from; ``uuid``: the job names its GPUs by UUID) and say what its launch and its
        printout need (:mod:`gpualloc.host.grant`)."""
        ...

    def confirm(self, lease_id: str) -> None:
        """Mark the lease announced: its id has reached its user."""
        ...

    def hang_up(self) -> None:
        """Close what this process holds open to the ledger, before it becomes the job (a lease
        lives with its job's process, never with a connection)."""
        ...

    def release(self, lease_id: str) -> None:
        """Drop one lease of the caller's, quietly (an exec that failed, a lost race)."""
        ...

    def adopt(self, lease_id: str, pid: int) -> None:
        """Bind the lease to ``pid``, the job its holder has just forked as the leader of a
        process group of its own: the lease lives with that group from now on, even once
        the holder has gone (a broker's watch would find the child only at its next pass).
        Only the lease's owner or root, for a process of theirs."""
        ...

    def exited(self, lease_id: str, status: int, *, cancelled: bool = False) -> None:
        """End the lease whose job has exited with ``status`` (its exit code, or minus the
        signal that ended it, as ``os.waitstatus_to_exitcode`` gives it; ``cancelled``: ended
        by ``cancel``): the history record keeps both. Only the lease's owner or root; a lease
        gone already is left so."""
        ...

    def release_leases(
        self, selectors: Iterable[str], *, mine: bool = False, include_running: bool = False
    ) -> ReleaseResult:
        """Release the leases ``selectors`` name (ids, unique prefixes or names), or the
        caller's ``alloc`` leases with ``mine`` (their running jobs' too with
        ``include_running``; the others are ``kept``); only the owner or root may."""
        ...

    def release_receipt(
        self, selectors: Iterable[str], *, mine: bool = False, include_running: bool = False
    ) -> Receipt:
        """:meth:`release_leases`, as the command line prints it (:mod:`gpualloc.host.receipt`)."""
        ...

    def evict(
        self, selectors: Iterable[str], *, mine: bool = False, grace_s: float | None = None
    ) -> ReleaseResult:
        """Ask the shared jobs beside the leases named to leave (``release --evict-shared``)."""
        ...

    def collect_garbage(self, idle: IdlePolicy | None = None) -> GarbageReport:
        """Reap dead leases and stale lock files now; with ``idle``, apply the idle policy."""
        ...

    def leased_share(self, request: ShareRequest, gpu: int, mode: ShareMode) -> LeasedShare:
        """How a shared job for ``request`` would hold ``gpu``."""
        ...

    def start_time_limit_watch(self, grant: Grant, *, here: bool = False) -> None:
        """Have the job about to exec on ``grant``'s lease ended at its time limit: a watch of
        the job's own user on the file ledger; nothing through a broker, which keeps every
        limit itself. ``here``: this process becomes the job though it is not the lease's
        process (a submitted job, forked by its supervisor, which holds the lease)."""
        ...

    def start_verifier(
        self, grant: Grant, terms: VerifyTerms, look: Callable[[], list[GpuProcess]] | None
    ) -> None:
        """Fork the verifier of this process, about to exec the job on ``grant``'s GPUs: it
        checks for ``terms.grace_s`` that the job keeps to them (:mod:`gpualloc.launcher.verify`);
        ``look`` lists the GPUs' processes where this process must ask itself."""
        ...

    def ledger_file(self) -> Path | None:
        """The ledger file every user may read (the shared jobs' watchers read it); None
        before there is one."""
        ...

    def ledger_place(self) -> str:
        """Where the ledger is, in words: the broker that keeps it, or its file."""
        ...

    def trust(self, *, detailed: bool = False) -> Trust:
        """How far the ledger can be trusted (:mod:`gpualloc.ledger.trust`); ``detailed``:
        with the broker's set-up as a client sees it (``doctor``)."""
        ...


class LedgerHost(Host, Protocol):
    """A host whose ledger this process changes itself (the embedded ledger, or the broker's
    own): what the queue's waiting loop (:mod:`gpualloc.host.wait`) and the Slurm hooks need
    beyond :class:`Host`."""

    @property
    def outside(self) -> frozenset[int]:
        """The GPUs this ledger may not place on (those not the Slurm job's)."""
        ...

    def transaction(
        self, *, lock_timeout_s: float | None = None
    ) -> AbstractContextManager[LedgerTransaction]:
        """A ledger transaction under the ledger's lock."""
        ...

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
        """Add the lease for ``placement`` to ``txn``."""
        ...

    def refresh_processes(self) -> None:
        """Ask NVML again who runs on the GPUs and how healthy they are."""
        ...
