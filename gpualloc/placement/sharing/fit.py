"""Where a shared job goes: the GPU the host's share placement rule picks among those it may
share (``tests/test_shared_gpus.py``, ``tests/test_shared_gpu_fractions.py``).

A shared job (``run --share``) may run on a GPU that

- a ``--shareable`` lease holds, or that only shared jobs use, or that is free;
- has fewer than ``max_jobs`` shared jobs on it already;
- has the memory the job declares (``--mem``) free: the GPU's memory less the larger of what
  the driver reports in use (NVML, else its processes' memory) and what the leases on it
  declared. A job that declares no memory asks for none, and a GPU whose size is unknown fits
  only such a job;
- has the part of it the job names (``--sm-share``) not held by other shared jobs.

Those GPUs (:mod:`.candidates`) go to the rule the system config's
``share.placement`` names (:mod:`.rules`: ``fgd`` by default, or
DeepPool's best fit, seed 004, section 3, with memory as the constraint that decides whether
two jobs can be co-located at all). This module checks that the job could ever fit the host,
and says who holds what when it cannot fit now. It reads the host through
:class:`~gpualloc.model.occupancy_view.OccupancyView` alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from gpualloc.errors import GpusBusy, NoFeasiblePlacement
from gpualloc.model.cpuset import format_cpulist
from gpualloc.model.mig import format_size
from gpualloc.model.occupancy_view import OccupancyView
from gpualloc.model.printable import count_of
from gpualloc.model.share import ShareRequest
from gpualloc.model.topology import Topology
from gpualloc.placement.sharing.candidates import (
    ShareCandidate,
    free_capacity,
    free_memory,
    share_candidates,
    usable_gpus,
)
from gpualloc.placement.sharing.rules import ShareChoice, ShareContext, get_share_policy

__all__ = [
    "ShareBusy",
    "ShareCandidate",
    "ShareChoice",
    "choose_share",
    "free_memory",
    "share_candidates",
]


def choose_share(
    topology: Topology,
    occupancy: OccupancyView,
    request: ShareRequest,
    max_jobs: int,
    *,
    strategy: str = "fgd",
    mix: Mapping[tuple[int, float], float] | None = None,
    mix_source: str = "the default mix",
) -> ShareChoice:
    """The GPU for ``request`` by the share placement rule named ``strategy``
    (:mod:`.rules`). Raises :class:`NoFeasiblePlacement` when no GPU of
    the host could ever take it, :class:`GpusBusy` when none can now, :class:`RequestError` for
    a rule that does not exist."""
    policy = get_share_policy(strategy)
    _check_feasible(topology, occupancy, request, max_jobs)
    candidates = share_candidates(topology, occupancy, max_jobs)
    if request.gpu is not None:
        candidates = [c for c in candidates if c.gpu == request.gpu]
    fitting = [c for c in candidates if _fits(c, request)]
    if not fitting:
        raise _busy(topology, occupancy, request, candidates, max_jobs)
    ctx = ShareContext(
        request=request,
        fitting=fitting,
        part=request.fraction or 1 / max(1, max_jobs),
        free=free_capacity(topology, occupancy),
        mix=mix,
        mix_source=mix_source,
    )
    return policy.choose(ctx)


def _fits(candidate: ShareCandidate, request: ShareRequest) -> bool:
    """Its memory fits, and the part of the GPU it asks for (``--sm-share``) is still free."""
    asked = request.fraction
    if asked is not None and candidate.used_fraction + asked > 1 + 1e-9:
        return False
    if request.memory_bytes is None:
        return True
    return candidate.free_bytes is not None and candidate.free_bytes >= request.memory_bytes


def _check_feasible(
    topology: Topology, occupancy: OccupancyView, request: ShareRequest, max_jobs: int
) -> None:
    usable = usable_gpus(topology, occupancy)
    if max_jobs < 1:
        raise NoFeasiblePlacement(
            "this host allows no shared jobs (share.max_jobs = 0 in the system config)",
            hint="ask for whole GPUs (leave out --share)",
        )
    if request.gpu is not None:
        if request.gpu >= topology.gpu_count:
            raise NoFeasiblePlacement(
                f"GPU {request.gpu} does not exist on this host "
                f"({count_of(topology.gpu_count, 'GPU')})",
                hint="'gpualloc topo show' lists the GPUs",
            )
        if request.gpu not in usable:
            raise NoFeasiblePlacement(
                f"GPU {request.gpu} cannot be shared ({occupancy.state(request.gpu)})",
                hint="leave out --gpus to let gpualloc choose",
            )
        usable = [request.gpu]
    if not usable:
        raise NoFeasiblePlacement("no GPU of this host can be shared", hint="check 'status'")
    if request.memory_bytes is None:
        return
    sizes = [topology.gpu(g).memory_total_bytes for g in usable]
    known = [size for size in sizes if size is not None]
    if not known:
        raise NoFeasiblePlacement(
            "the topology does not say how much memory its GPUs have, so --mem cannot be checked",
            hint="leave out --mem, or use a topology with GPU memory (NVML discovery has it)",
        )
    if max(known) < request.memory_bytes:
        raise NoFeasiblePlacement(
            f"--mem {format_size(request.memory_bytes)} is more than any GPU here has "
            f"({format_size(max(known))})",
            hint="ask for less memory, or for whole GPUs",
        )


def _busy(
    topology: Topology,
    occupancy: OccupancyView,
    request: ShareRequest,
    candidates: Iterable[ShareCandidate],
    max_jobs: int,
) -> GpusBusy:
    listed = list(candidates)

    def write() -> tuple[str, tuple[str, ...]]:
        where = [request.gpu] if request.gpu is not None else usable_gpus(topology, occupancy)
        closed = [g for g in where if g not in {c.gpu for c in listed}]
        parts = []
        if listed:
            short = "memory" if request.fraction is None else "memory or GPU share"
            parts.append(f"too little {short} on " + "; ".join(c.describe() for c in listed))
        if closed:
            parts.append(
                f"GPU {format_cpulist(closed)} held by leases that do not share, or running "
                f"{count_of(max_jobs, 'shared job')} already"
            )
        message = f"no GPU can take {request.describe()} now: " + "; ".join(parts)
        return message, tuple(occupancy.describe(where))

    return ShareBusy(
        write, hint="wait (--wait), ask for less --mem, or ask the holders for --shareable leases"
    )


class ShareBusy(GpusBusy):
    """No GPU can take a shared job now; the message, which describes every holder, is
    written when read: the queue and the simulator try many shares that do not fit, and
    describing the holders each time was most of a trace replay's time."""

    def __init__(self, write: Callable[[], tuple[str, tuple[str, ...]]], *, hint: str) -> None:
        Exception.__init__(self)
        self._write = write
        self._written: tuple[str, tuple[str, ...]] | None = None
        self.hint = hint

    def _text(self) -> tuple[str, tuple[str, ...]]:
        if self._written is None:
            self._written = self._write()
        return self._written

    # Read-only where the base's are plain (``message``) or settable (``details``): written
    # when read, as the class docstring says, and never set (nothing re-words a ShareBusy).
    @property
    def message(self) -> str:  # type: ignore[override]
        return self._text()[0]

    @property  # type: ignore[misc]
    def details(self) -> tuple[str, ...]:
        return self._text()[1]
