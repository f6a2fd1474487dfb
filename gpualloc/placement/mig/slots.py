"""Where a new MIG GPU instance should go: the GPU and start slice where the expected MIG
fragmentation grows least.

This is FGD (Weng et al., "Beware of Fragmentation", USENIX ATC'23, sections 4.1-4.3) on
NVIDIA's slice rules (:mod:`gpualloc.model.mig_slices`) instead of fractions of a GPU. For an
instance shape ``m``, a GPU's *fragment* is its free memory slices that no free placement of
``m`` covers (``m`` can never use them as they stand: two free slices 3 and 4 are fragment for
a 2-slice instance, which starts at 0, 2 or 4 only). The expected fragmentation weighs each
shape by its share of the requests; a new instance goes where that expectation grows least,
then onto the GPU with the most slices taken (so that whole GPUs stay free to split otherwise),
then the lowest start and GPU. That order is the ``fgd`` MIG creation rule; ``best-fit`` and
``first-fit`` (:mod:`.rules`) order the same places otherwise.

No trace records MIG requests, so until the ledger has counted enough of this host's
(:meth:`gpualloc.ledger.stats.LedgerStats.recent_mig_mix`) every shape weighs the same.
"""

from __future__ import annotations

from collections.abc import Mapping

from msgspec import Struct

from gpualloc.model.mig_slices import (
    Shape,
    free_starts,
    gpu_shapes,
    memory_slice_count,
    occupied_slices,
    shape_by_size,
    shape_of,
    still_fit,
)
from gpualloc.model.topology import Topology
from gpualloc.placement.mig.rules import Slot, get_mig_rule

__all__ = [
    "MigGpu",
    "Slot",
    "creation_slots",
    "expected_fragment",
    "fragment",
    "free_slices",
    "mig_gpus",
    "rank_slots",
    "weighed_shapes",
]


def fragment(occupied: frozenset[int], shape: Shape, total: int) -> int:
    """Free slices of a GPU that no free placement of ``shape`` covers."""
    covered: set[int] = set()
    for window in shape.windows():
        if not occupied.intersection(window):
            covered.update(window)
    return sum(1 for s in range(total) if s not in occupied and s not in covered)


def expected_fragment(occupied: frozenset[int], shapes: Mapping[Shape, float], total: int) -> float:
    return sum(weight * fragment(occupied, shape, total) for shape, weight in shapes.items())


def weighed_shapes(
    gpu_name: str, gpu_memory: int | None, mix: Mapping[str, float] | None
) -> dict[Shape, float]:
    """Each shape of the GPU with its weight: ``mix`` (profile -> share) mapped onto the GPU's
    shapes, or every shape alike when there is no mix (or none of its profiles exists here)."""
    weights: dict[Shape, float] = {}
    for profile, share in (mix or {}).items():
        shape = shape_of(profile, gpu_name, gpu_memory)
        if shape is not None:
            key = shape_by_size(gpu_name, shape.compute, shape.memory)
            weights[key] = weights.get(key, 0.0) + share
    if not weights:
        shapes = gpu_shapes(gpu_name)
        return {shape_by_size(gpu_name, c, m): 1 / len(shapes) for c, m in shapes}
    total = sum(weights.values())
    return {shape: weight / total for shape, weight in weights.items()}


class MigGpu(Struct, frozen=True):
    """A GPU in MIG mode as placement sees it: its model, memory and occupied slices."""

    index: int
    name: str
    memory_bytes: int | None
    occupied: frozenset[int]


def mig_gpus(topology: Topology) -> list[MigGpu]:
    """The topology's GPUs in MIG mode whose layout (placements) is known."""
    found = []
    for gpu in topology.gpus:
        occupied = occupied_slices(topology.mig_on(gpu.index)) if gpu.mig_enabled else None
        if occupied is not None:
            found.append(MigGpu(gpu.index, gpu.name or "", gpu.memory_total_bytes, occupied))
    return found


def creation_slots(
    topology: Topology, profile: str, mix: Mapping[str, float] | None = None
) -> list[Slot]:
    """Every place on a MIG-mode GPU of known layout where a GPU instance of ``profile`` could
    be created now, best first (see the module)."""
    return rank_slots(mig_gpus(topology), profile, mix)


def rank_slots(
    gpus: list[MigGpu], profile: str, mix: Mapping[str, float] | None, rule: str = "fgd"
) -> list[Slot]:
    """Every free place for ``profile`` on ``gpus``, best first by the MIG creation rule named
    ``rule`` (:mod:`.rules`; an unknown name is a
    :class:`~gpualloc.errors.RequestError`)."""
    ranking = get_mig_rule(rule)
    slots = []
    for gpu in gpus:
        shape = shape_of(profile, gpu.name, gpu.memory_bytes)
        if shape is None:
            continue
        total = memory_slice_count(gpu.name)
        weights = weighed_shapes(gpu.name, gpu.memory_bytes, mix) if ranking.weighs else {}
        before = expected_fragment(gpu.occupied, weights, total)
        for start in free_starts(shape, gpu.occupied):
            after = gpu.occupied | frozenset(range(start, start + shape.memory))
            grown = round(expected_fragment(after, weights, total) - before, 9)
            slots.append(
                Slot(gpu.index, shape.profile, start, shape.memory, grown, len(gpu.occupied))
            )
    return ranking.rank(slots)


def free_slices(topology: Topology, gpu: int) -> tuple[list[int], dict[str, int]] | None:
    """A MIG GPU's free memory slices and how many instances of each profile they could still
    hold (each counted alone); None when its layout is unknown."""
    card = topology.gpu(gpu)
    occupied = occupied_slices(topology.mig_on(gpu))
    if occupied is None or not card.mig_enabled:
        return None
    name = card.name or ""
    shapes = [shape_by_size(name, c, m, card.memory_total_bytes) for c, m in gpu_shapes(name)]
    total = memory_slice_count(name)
    counts = still_fit(shapes, occupied)
    return [s for s in range(total) if s not in occupied], counts
