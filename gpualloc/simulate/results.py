"""What a simulation is asked and what it answers: its options, and each job's result and the
run's (:mod:`gpualloc.simulate.engine` makes them; :mod:`gpualloc.simulate.summary` reads them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpualloc.simulate.profile import DrbProfile
from gpualloc.simulate.trace import SimJob


@dataclass(frozen=True)
class SimOptions:
    policy: str = "mapa"
    queue: str = "fifo"
    runtime: str = "fixed"
    postpone: bool = True
    """Honour each job's ``min_utility`` (TOPO-AWARE-P); False: TOPO-AWARE."""
    profile: DrbProfile | None = None
    sharing: int = 0
    """Shared jobs per GPU (``--sharing``); 0: none, every job holds its GPUs whole."""
    gpu_busy: float = 1.0
    """The share of time a job alone keeps its GPU busy (``--gpu-busy``, with sharing)."""
    share_placement: str = "fgd"
    """How a shared job's GPU is chosen (``--share-placement``; live: ``share.placement``)."""


@dataclass
class JobResult:
    job: SimJob
    start_s: float
    end_s: float
    gpus: tuple[int, ...]
    aggregated_gbps: float | None
    effective_gbps: float | None
    preserved_gbps: float
    bottleneck_gbps: float | None
    utility: float
    ideal_effective_gbps: float | None
    pcie_share: float | None
    """Share of the pattern's edges that run over PCIe (no NVLink)."""
    alone_s: float
    """What the runtime model gives the job alone on these GPUs (before interference)."""
    shared: bool = False
    """It ran as a shared job (``--sharing``)."""

    @property
    def wait_s(self) -> float:
        return self.start_s - self.job.arrival_s

    @property
    def jct_s(self) -> float:
        return self.end_s - self.job.arrival_s

    @property
    def stretch(self) -> float | None:
        """Run time over the trace's duration: what placement and neighbours cost the job."""
        if self.job.duration_s <= 0:
            return None
        return (self.end_s - self.start_s) / self.job.duration_s

    @property
    def relative_score(self) -> float | None:
        """Effective bandwidth over the best a job of its size gets on the empty host."""
        if self.effective_gbps is None or not self.ideal_effective_gbps:
            return None
        return self.effective_gbps / self.ideal_effective_gbps

    def as_dict(self) -> dict[str, object]:
        return {
            "id": self.job.id,
            "arrival_s": self.job.arrival_s,
            "start_s": round(self.start_s, 6),
            "end_s": round(self.end_s, 6),
            "wait_s": round(self.wait_s, 6),
            "alone_s": round(self.alone_s, 6),
            "stretch": _round(self.stretch),
            "gpus": list(self.gpus),
            "gpu_fraction": self.job.gpu_fraction,
            "sensitive": self.job.sensitive,
            "aggregated_gbps": self.aggregated_gbps,
            "effective_gbps": self.effective_gbps,
            "preserved_gbps": self.preserved_gbps,
            "bottleneck_gbps": self.bottleneck_gbps,
            "utility": self.utility,
            "relative_score": _round(self.relative_score),
            "pcie_share": _round(self.pcie_share),
            "shared": self.shared,
        }


@dataclass
class SimResult:
    policy: str
    jobs: list[JobResult]
    gpu_count: int
    """The host's GPUs."""
    timeline: list[tuple[float, int, int]] = field(default_factory=list)
    """(time, free GPUs, waiting jobs) after each event time."""
    decision_ms: list[float] = field(default_factory=list)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)
