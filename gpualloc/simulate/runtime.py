"""How long a simulated job runs on the GPUs it got: the runtime models of ``--runtime``.

A model answers two questions: how long the job would take alone on these GPUs
(:meth:`RuntimeModel.solo_s`), and how much the jobs running beside it stretch that now
(:meth:`RuntimeModel.slowdown`). The simulator asks the second again whenever a job starts or
ends, and a running job's remaining work goes at the new pace.

- ``fixed``: the trace's duration wherever the job runs (the MAPA paper's simulator).
- ``bandwidth``: compute plus ring all-reduce (:mod:`gpualloc.simulate.networks`): a job of
  communication intensity ``v`` whose ring runs at ``B`` GB/s takes
  ``duration * (1 + v/B) / (1 + v/B_best)``, where ``B`` is the slowest link its pattern's edges
  use in the order it got, ``B_best`` the best the empty host offers a job of its size and
  pattern, and ``duration`` the trace's (the time on that best placement). Link bandwidths are
  the topology's: measured where the host was calibrated, else estimated. ``v`` comes from
  published measurements per network (MAPA's Fig. 2(b), the DRB profile). No interference.
- ``profile``: the DRB paper's measured times (``--profile``): the solo time within a socket,
  or across sockets when the job's GPUs span both, stretched by the worst co-location slowdown
  among the jobs sharing a socket with it now (Eq. 4's measurements).
- ``auto``: ``profile`` for the jobs the profile covers (network, batch and size measured),
  ``bandwidth`` for the others; co-location slows only profiled jobs beside profiled jobs
  (nothing else was measured).
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

from gpualloc.model.rings import best_ring_gbps
from gpualloc.model.topology import Topology
from gpualloc.simulate.networks import intensity_gb
from gpualloc.simulate.profile import DrbProfile
from gpualloc.simulate.trace import SimJob

RUNTIMES = ("fixed", "bandwidth", "profile", "auto")


class Neighbour(NamedTuple):
    """A job running now, and its GPUs."""

    job: SimJob
    gpus: tuple[int, ...]


class RuntimeModel:
    """``fixed``: the trace's duration, never stretched; the base of the others."""

    name = "fixed"
    dynamic = False
    """Whether :meth:`slowdown` can change while a job runs."""

    def solo_s(self, job: SimJob, gpus: tuple[int, ...]) -> float:
        """Seconds the job takes alone on ``gpus`` (rank ``i`` on ``gpus[i]``)."""
        return job.duration_s

    def slowdown(self, job: SimJob, gpus: tuple[int, ...], beside: list[Neighbour]) -> float:
        """How much slower than alone it runs beside ``beside`` (at least 1)."""
        return 1.0

    def looks_at_neighbours(self, job: SimJob) -> bool:
        """Whether :meth:`slowdown` of ``job`` reads its neighbours (else they need not be
        listed: a trace's jobs that no profile covers, at every event)."""
        return self.dynamic


class BandwidthRuntime(RuntimeModel):
    """Compute plus ring all-reduce at the speed of the slowest link the job's pattern uses."""

    name = "bandwidth"

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self._best: dict[tuple[int, str], float | None] = {}
        self._rings: dict[tuple[bool, frozenset[int]], float] = {}
        """The collective's bandwidth by set (NCCL orders its rings itself: any order of a set
        runs alike), computed once per set: a simulation meets the same sets again and again."""

    def solo_s(self, job: SimJob, gpus: tuple[int, ...]) -> float:
        got, best = self.ring_gbps(job, gpus), self.best_gbps(job)
        intensity = intensity_gb(job.workload, job.sensitive, job.gpus)
        if not got or not best or intensity == 0:
            return job.duration_s
        return job.duration_s * (1 + intensity / got) / (1 + intensity / best)

    def ring_gbps(self, job: SimJob, gpus: tuple[int, ...]) -> float | None:
        """The bandwidth the job's collective runs at on these GPUs (None: one GPU).

        Collectives are NCCL's, which orders the GPUs of its rings itself (the order of
        ``CUDA_VISIBLE_DEVICES`` does not bind it): the best ring over the set. An ``all``
        pattern (every pair talks) runs at the slowest pair of the set.
        """
        if len(gpus) < 2:
            return None
        key = (job.pattern == "all", frozenset(gpus))
        if key not in self._rings:
            if job.pattern == "all":
                pairs = itertools.combinations(gpus, 2)
                self._rings[key] = min(self._bandwidth(a, b) for a, b in pairs)
            else:
                self._rings[key] = best_ring_gbps(sorted(gpus), self._bandwidth)
        return self._rings[key]

    def best_gbps(self, job: SimJob) -> float | None:
        """The best :meth:`ring_gbps` a job of this size and pattern gets on the empty host."""
        key = (job.gpus, job.pattern)
        if key not in self._best:
            from gpualloc.model.request import HostState, JobRequest
            from gpualloc.placement.decide import plan
            from gpualloc.placement.mapa.patterns import build_pattern
            from gpualloc.placement.mapa.scores import EffectiveModel

            # What ring_gbps measures: the slowest pair for "all", else the best ring.
            shape = "all" if job.pattern == "all" else "ring"
            request = JobRequest(job.gpus, build_pattern(shape, job.gpus), True)
            best = plan(
                self.topology,
                request,
                HostState.all_free(self.topology.gpu_count),
                policy="mapa",
                effective_model=EffectiveModel.BOTTLENECK,
            )
            self._best[key] = self.ring_gbps(job, best.gpus)
        return self._best[key]

    def _bandwidth(self, a: int, b: int) -> float:
        return self.topology.link(a, b).bandwidth_gbps


class ProfileRuntime(RuntimeModel):
    """The DRB paper's measured solo and co-location times (seed 000, sections 3.3 and 5)."""

    name = "profile"
    dynamic = True

    def __init__(self, topology: Topology, profile: DrbProfile) -> None:
        self.topology = topology
        self.profile = profile

    def covers(self, job: SimJob) -> bool:
        return (
            job.workload is not None
            and job.batch is not None
            and self.profile.has(job.workload, job.batch, job.gpus)
        )

    def solo_s(self, job: SimJob, gpus: tuple[int, ...]) -> float:
        assert job.workload is not None and job.batch is not None
        return self.profile.solo_s(
            job.workload, job.batch, job.gpus, cross_socket=len(self._sockets(gpus)) > 1
        )

    def slowdown(self, job: SimJob, gpus: tuple[int, ...], beside: list[Neighbour]) -> float:
        assert job.workload is not None and job.batch is not None
        sockets = self._sockets(gpus)
        worst = 1.0
        for other, other_gpus in beside:
            if other.workload and other.batch and sockets & self._sockets(other_gpus):
                worst = max(
                    worst,
                    self.profile.slowdown(
                        job.workload, job.batch, job.gpus, (other.workload, other.batch, other.gpus)
                    ),
                )
        return worst

    def _sockets(self, gpus: tuple[int, ...]) -> set[int | None]:
        return {self.topology.gpu(g).numa_node for g in gpus}


class AutoRuntime(RuntimeModel):
    """``profile`` where the profile covers the job, ``bandwidth`` elsewhere."""

    name = "auto"
    dynamic = True

    def __init__(self, topology: Topology, profile: DrbProfile) -> None:
        self.measured = ProfileRuntime(topology, profile)
        self.modelled = BandwidthRuntime(topology)

    def solo_s(self, job: SimJob, gpus: tuple[int, ...]) -> float:
        model = self.measured if self.measured.covers(job) else self.modelled
        return model.solo_s(job, gpus)

    def looks_at_neighbours(self, job: SimJob) -> bool:
        return self.measured.covers(job)

    def slowdown(self, job: SimJob, gpus: tuple[int, ...], beside: list[Neighbour]) -> float:
        if not self.measured.covers(job):
            return 1.0
        profiled = [n for n in beside if self.measured.covers(n.job)]
        return self.measured.slowdown(job, gpus, profiled)


def runtime_model(name: str, topology: Topology, profile: DrbProfile | None) -> RuntimeModel:
    """The model ``--runtime name`` means (``profile`` None: the DRB paper's)."""
    if name == "fixed":
        return RuntimeModel()
    if name == "bandwidth":
        return BandwidthRuntime(topology)
    profile = profile or DrbProfile.bundled()
    if name == "profile":
        return ProfileRuntime(topology, profile)
    return AutoRuntime(topology, profile)
