"""Where a shared job goes (issue 20, point 3): best fit among the GPUs it may share.

A shared job (``run --share``) may run on a GPU that

- a ``--shareable`` lease holds, or that only shared jobs use, or that is free;
- has fewer than ``max_jobs`` shared jobs on it already;
- has the memory the job declares (``--mem``) free: the GPU's memory less the larger of what
  the driver reports in use (NVML, else its processes' memory) and what the leases on it
  declared. A job that declares no memory asks for none, and a GPU whose size is unknown fits
  only such a job.

Among those, GPUs someone already uses come first, so that sharing fills used GPUs before it
takes a free one (the free ones stay whole for whole-GPU jobs); then best fit: the least memory
left after the job, then the fewest shared jobs, then the index. This is DeepPool's placement
of background jobs onto the GPUs of foreground jobs (seed 004, section 3), with memory as the
constraint that decides whether two jobs can be co-located at all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from msgspec import Struct

from gpualloc.errors import GpusBusy, NoFeasiblePlacement
from gpualloc.ledger.occupancy import Occupancy
from gpualloc.model.cpuset import format_cpulist
from gpualloc.model.mig import format_size
from gpualloc.model.share import ShareRequest
from gpualloc.model.topology import Topology


class ShareCandidate(Struct, frozen=True):
    """One GPU a shared job could go to."""

    gpu: int
    state: str
    """``held`` (by a shareable lease), ``shared`` or ``free``."""
    jobs: int
    """Shared jobs already on it."""
    free_bytes: int | None
    """Memory left for the job (None: the GPU's size is unknown)."""
    used_fraction: float = 0.0
    """The parts of the GPU its shared jobs hold (:attr:`LeasedShare.fraction`), summed."""

    def describe(self) -> str:
        memory = f", {format_size(self.free_bytes)} free" if self.free_bytes is not None else ""
        used = f", {self.used_fraction:.0%} of it shared" if self.used_fraction else ""
        return f"GPU {self.gpu} ({self.state}, {self.jobs} shared job(s){used}{memory})"


class ShareChoice(Struct, frozen=True):
    candidate: ShareCandidate
    reason: str
    runners_up: tuple[ShareCandidate, ...]


def free_memory(topology: Topology, occupancy: Occupancy, gpu: int) -> int | None:
    """Memory a new shared job may still take on ``gpu`` (None: the GPU's size is unknown)."""
    total = topology.gpu(gpu).memory_total_bytes
    if total is None:
        return None
    holders = [occupancy.leases.get(gpu), *occupancy.shares.get(gpu, ())]
    declared = sum(lease.memory_bytes or 0 for lease in holders if lease is not None)
    used = max(declared, occupancy.memory_used.get(gpu, 0))
    return max(0, total - used)


def share_candidates(
    topology: Topology, occupancy: Occupancy, max_jobs: int
) -> list[ShareCandidate]:
    """Every GPU a shared job may use now, whatever its memory."""
    found = []
    for gpu in _usable(topology, occupancy):
        state = occupancy.state(gpu)
        holder = occupancy.leases.get(gpu)
        if state == "held" and not (holder is not None and holder.shareable):
            continue
        if state not in ("held", "shared", "free"):
            continue
        shares = occupancy.shares.get(gpu, ())
        if len(shares) >= max_jobs:
            continue
        memory = free_memory(topology, occupancy, gpu)
        used = occupancy.shared_fraction(gpu)
        found.append(ShareCandidate(gpu, state, len(shares), memory, used))
    return found


SHARE_PLACEMENTS = ("fgd", "best-fit", "first-fit", "spread")
"""How a shared job's GPU is chosen among those that fit: ``fgd`` (the default) where the
workload's expected fragmentation grows least (:mod:`gpualloc.placement.fragmentation`);
``best-fit`` a GPU in use first, then the least of the GPU left (for a job that names its part
with ``--sm-share``), then the least memory left (gpualloc's rule before FGD);
``first-fit`` the lowest index; ``spread`` the most free capacity."""


def choose_share(
    topology: Topology,
    occupancy: Occupancy,
    request: ShareRequest,
    max_jobs: int,
    *,
    strategy: str = "fgd",
    mix: dict[tuple[int, float], float] | None = None,
    mix_source: str = "the default mix",
) -> ShareChoice:
    """The GPU for ``request`` by ``strategy`` (:data:`SHARE_PLACEMENTS`). Raises
    :class:`NoFeasiblePlacement` when no GPU of the host could ever take it, :class:`GpusBusy`
    when none can now."""
    _check_feasible(topology, occupancy, request, max_jobs)
    candidates = share_candidates(topology, occupancy, max_jobs)
    if request.gpu is not None:
        candidates = [c for c in candidates if c.gpu == request.gpu]
    fitting = [c for c in candidates if _fits(c, request)]
    if not fitting:
        raise _busy(topology, occupancy, request, candidates, max_jobs)
    need = request.memory_bytes or 0
    part = request.fraction or 1 / max(1, max_jobs)
    free = _free_capacity(topology, occupancy)

    def best_fit(c: ShareCandidate) -> tuple:
        left = (c.free_bytes - need) if c.free_bytes is not None else float("inf")
        room = 1 - c.used_fraction - part if request.fraction is not None else 0.0
        return (c.state == "free", room, left, c.jobs, c.gpu)

    if strategy == "fgd":
        from gpualloc.placement.fragmentation import DEFAULT_MIX, expected_fragmentation, growth

        weights = mix or DEFAULT_MIX
        now = expected_fragmentation(free, weights)
        grown = {c.gpu: round(growth(free, c.gpu, part, weights, now), 9) for c in fitting}
        ranked = sorted(fitting, key=lambda c: (grown[c.gpu], free[c.gpu] - part, *best_fit(c)))
        best = ranked[0]
        why = (
            f"the workload's expected fragmentation grows least there ({grown[best.gpu]:+.3f} "
            f"GPU, weighed by {mix_source}; FGD, Weng et al. ATC'23)"
        )
        if sum(grown[c.gpu] == grown[best.gpu] for c in fitting) > 1:
            why += "; among the GPUs that tie, the best fit"
    elif strategy == "first-fit":
        ranked = sorted(fitting, key=lambda c: c.gpu)
        best, why = ranked[0], "the lowest-numbered GPU that fits (first fit)"
    elif strategy == "spread":
        ranked = sorted(fitting, key=lambda c: (-free[c.gpu], c.jobs, c.gpu))
        best, why = ranked[0], "the GPU with the most free capacity (spread)"
    else:
        ranked = sorted(fitting, key=best_fit)
        best = ranked[0]
        if best.state == "free":
            why = "no GPU in use has room, so a free one"
        else:
            left = "of it" if request.fraction is not None else "memory"
            why = f"the GPU in use with the least {left} left after it (best fit)"
    return ShareChoice(best, f"{best.describe()}: {why}", tuple(ranked[1:]))


def _free_capacity(topology: Topology, occupancy: Occupancy) -> list[float]:
    """Each GPU's free capacity for FGD: 1 when free, one minus its shared jobs' parts when
    only shared jobs use it, 0 when a lease holds it (shared jobs there ride on its idle time)
    or it cannot be used."""
    usable = set(_usable(topology, occupancy))
    free = []
    for gpu in range(topology.gpu_count):
        state = occupancy.state(gpu) if gpu in usable else "unusable"
        if state == "free":
            free.append(1.0)
        elif state == "shared":
            free.append(max(0.0, 1.0 - occupancy.shared_fraction(gpu)))
        else:
            free.append(0.0)
    return free


def _fits(candidate: ShareCandidate, request: ShareRequest) -> bool:
    """Its memory fits, and the part of the GPU it asks for (``--sm-share``) is still free."""
    asked = request.fraction
    if asked is not None and candidate.used_fraction + asked > 1 + 1e-9:
        return False
    if request.memory_bytes is None:
        return True
    return candidate.free_bytes is not None and candidate.free_bytes >= request.memory_bytes


def _usable(topology: Topology, occupancy: Occupancy) -> list[int]:
    return [
        g
        for g in range(topology.gpu_count)
        if g not in occupancy.unusable | occupancy.outside | occupancy.mig
    ]


def _check_feasible(
    topology: Topology, occupancy: Occupancy, request: ShareRequest, max_jobs: int
) -> None:
    usable = _usable(topology, occupancy)
    if max_jobs < 1:
        raise NoFeasiblePlacement(
            "this host allows no shared jobs (share.max_jobs = 0 in the system config)",
            hint="ask for whole GPUs (leave out --share)",
        )
    if request.gpu is not None:
        if request.gpu >= topology.gpu_count:
            raise NoFeasiblePlacement(
                f"GPU {request.gpu} does not exist on this host ({topology.gpu_count} GPUs)",
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
    occupancy: Occupancy,
    request: ShareRequest,
    candidates: Iterable[ShareCandidate],
    max_jobs: int,
) -> GpusBusy:
    listed = list(candidates)

    def write() -> tuple[str, tuple[str, ...]]:
        where = [request.gpu] if request.gpu is not None else _usable(topology, occupancy)
        closed = [g for g in where if g not in {c.gpu for c in listed}]
        parts = []
        if listed:
            short = "memory" if request.fraction is None else "memory or GPU share"
            parts.append(f"too little {short} on " + "; ".join(c.describe() for c in listed))
        if closed:
            parts.append(
                f"GPU {format_cpulist(closed)} held by leases that do not share, or running "
                f"{max_jobs} shared job(s) already"
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

    @property  # type: ignore[override]
    def message(self) -> str:
        return self._text()[0]

    @property  # type: ignore[override]
    def details(self) -> tuple[str, ...]:
        return self._text()[1]
