"""The GPUs a shared job (``run --share``) could go to, as the share placement rules see them.

A shared job may run on a GPU that a ``--shareable`` lease holds, that only shared jobs use, or
that is free, and that has fewer than ``max_jobs`` shared jobs on it already. Each such GPU is
a :class:`ShareCandidate` with the memory and the part of the GPU still left; :mod:`.rules`
ranks them. Everything here reads the host through
:class:`~gpualloc.model.occupancy_view.OccupancyView` alone. O(GPUs).
"""

from __future__ import annotations

from msgspec import Struct

from gpualloc.model.mig import format_size
from gpualloc.model.occupancy_view import OccupancyView
from gpualloc.model.printable import count_of
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
        return f"GPU {self.gpu} ({self.state}, {count_of(self.jobs, 'shared job')}{used}{memory})"


def free_memory(topology: Topology, occupancy: OccupancyView, gpu: int) -> int | None:
    """Memory a new shared job may still take on ``gpu`` (None: the GPU's size is unknown): the
    GPU's memory less the larger of what the driver reports in use and what the leases on it
    declared."""
    total = topology.gpu(gpu).memory_total_bytes
    if total is None:
        return None
    used = max(occupancy.declared_memory(gpu), occupancy.memory_used.get(gpu, 0))
    return max(0, total - used)


def share_candidates(
    topology: Topology, occupancy: OccupancyView, max_jobs: int
) -> list[ShareCandidate]:
    """Every GPU a shared job may use now, whatever its memory."""
    found = []
    for gpu in usable_gpus(topology, occupancy):
        state = occupancy.state(gpu)
        if state == "held" and not occupancy.shareable(gpu):
            continue
        if state not in ("held", "shared", "free"):
            continue
        jobs = occupancy.shared_jobs(gpu)
        if jobs >= max_jobs:
            continue
        memory = free_memory(topology, occupancy, gpu)
        used = occupancy.shared_fraction(gpu)
        found.append(ShareCandidate(gpu, state, jobs, memory, used))
    return found


def usable_gpus(topology: Topology, occupancy: OccupancyView) -> list[int]:
    """The GPUs a shared job could ever use here: not lost, unhealthy, outside or in MIG mode."""
    barred = occupancy.unusable | occupancy.outside | occupancy.mig
    return [g for g in range(topology.gpu_count) if g not in barred]


def free_capacity(topology: Topology, occupancy: OccupancyView) -> list[float]:
    """Each GPU's free capacity for FGD: 1 when free, one minus its shared jobs' parts when
    only shared jobs use it, 0 when a lease holds it (shared jobs there ride on its idle time)
    or it cannot be used."""
    usable = set(usable_gpus(topology, occupancy))
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
