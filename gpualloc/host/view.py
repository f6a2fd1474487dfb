"""What both kinds of host hold and read alike: the topology, what runs on its GPUs, their
faults, and the host's share settings, with the occupancy placement is asked against.

:class:`~gpualloc.host.local.LocalHost` and :class:`~gpualloc.host.brokered.BrokeredHost` are
this view plus the way their ledger changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from msgspec import Struct, field

from gpualloc.config import DEFAULT_MAX_SHARED_JOBS
from gpualloc.discovery.processes import ProcessReport
from gpualloc.ledger.occupancy import Occupancy
from gpualloc.model.topology import GpuFault, Topology

if TYPE_CHECKING:
    from gpualloc.config import Config
    from gpualloc.ledger.schema import Ledger
    from gpualloc.model.share import LeasedShare, ShareMode, ShareRequest
    from gpualloc.slurm.job import SlurmJob


class HostView(Struct, kw_only=True):
    """A topology together with the processes running on its GPUs and their faults."""

    topology: Topology
    processes: ProcessReport = field(default_factory=ProcessReport)
    this_host: bool = False
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
    placement_budget_s: float | None = 1.0
    """How long one placement may search before a greedy answer is used
    (``placement.time_budget``; the broker's ``broker.placement_budget``)."""
    budget_setting: str = "placement.time_budget"
    """The setting :attr:`placement_budget_s` came from, which a cut-short answer names."""

    @property
    def outside(self) -> frozenset[int]:
        """The GPUs this ledger may not place on (those not the Slurm job's)."""
        if self.slurm_job is None:
            return frozenset()
        return frozenset(range(self.topology.gpu_count)) - self.slurm_job.gpus

    def take_share_settings(self, config: Config) -> None:
        """Shared GPUs as the system config says (``share.max_jobs``, ``share.placement``);
        the embedded ledger and the broker both open their host this way."""
        self.max_shared_jobs = config.system_value("share.max_jobs")
        self.share_placement = config.system_value("share.placement")

    def occupancy(
        self,
        ledger: Ledger,
        *,
        allow_unhealthy: bool | None = None,
        ignore_foreign: bool | None = None,
    ) -> Occupancy:
        """Who holds what in ``ledger`` on this host; unhealthy GPUs are left out unless
        ``allow_unhealthy``, foreign processes count unless ``ignore_foreign`` (defaults: this
        host's settings)."""
        if allow_unhealthy is None:
            allow_unhealthy = self.allow_unhealthy
        if ignore_foreign is None:
            ignore_foreign = self.ignore_foreign
        return Occupancy.build(
            self.topology,
            ledger,
            self.processes.processes,
            ignore_foreign=ignore_foreign,
            outside=self.outside,
            memory_used=self.processes.memory_used,
            max_shared_jobs=self.max_shared_jobs,
            faults=() if allow_unhealthy else self.faults,
            share_placement=self.share_placement,
        )

    def leased_share(self, request: ShareRequest, gpu: int, mode: ShareMode) -> LeasedShare:
        """How a shared job for ``request`` holds ``gpu``."""
        return request.leased(self.topology.gpu(gpu).memory_total_bytes, self.max_shared_jobs, mode)
