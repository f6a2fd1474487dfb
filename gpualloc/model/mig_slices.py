"""Where a MIG GPU instance may sit on its GPU: NVIDIA's placement rules, and which profiles
still fit a GPU's free memory slices.

A GPU in MIG mode has memory slices (8 on an A100, H100 or H200; 4 on an A30). A GPU instance
occupies ``size`` consecutive slices from ``start``, and a profile may only start at fixed
slices: what ``nvidia-smi mig -lgipp`` prints and NVML's
``nvmlDeviceGetGpuInstancePossiblePlacements`` returns (NVIDIA MIG User Guide, "Supported MIG
Profiles"; e.g. an H100's ``3g.40gb`` at ``{0,4}:4``). So free slices are not all alike: two
free slices 3 and 4 hold no 2-slice instance (2g starts at 0, 2 or 4 only).

The rules by profile shape, (compute slices, memory slices) -> starts:

- 8-slice GPUs (A100, H100, H200): 1g at 0-6 (size 1); 1g with double memory (``1g.10gb`` of
  an A100 40GB, ``1g.20gb`` of an H100) at 0, 2, 4, 6 (size 2); 2g at 0, 2, 4 (size 2); 3g at 0
  and 4 (size 4); 4g at 0 (size 4); 7g at 0 (size 8);
- 4-slice GPUs (A30): 1g at 0-3 (size 1); 2g at 0 and 2 (size 2); 4g at 0 (size 4).

Which profiles a GPU has is its model's (:mod:`gpualloc.model.mig_profiles`: ``1g.5gb`` is an
A100 40GB's, never an H100's). For a model gpualloc does not know, a profile's memory slices
come from its memory over the GPU's, to the nearest allowed size.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from msgspec import Struct

from gpualloc.model.mig import GIB, MigInstance, parse_mig_profile
from gpualloc.model.mig_profiles import base_profile, mig_model

PLACEMENTS: dict[int, dict[tuple[int, int], tuple[int, ...]]] = {
    8: {
        (1, 1): (0, 1, 2, 3, 4, 5, 6),
        (1, 2): (0, 2, 4, 6),
        (2, 2): (0, 2, 4),
        (3, 4): (0, 4),
        (4, 4): (0,),
        (7, 8): (0,),
    },
    4: {
        (1, 1): (0, 1, 2, 3),
        (2, 2): (0, 2),
        (4, 4): (0,),
    },
}
"""Memory slices of the GPU -> (compute slices, memory slices) of a profile -> its starts."""


class Shape(Struct, frozen=True):
    """What a profile takes on a GPU: compute and memory slices, and where it may start."""

    profile: str
    compute: int
    memory: int
    starts: tuple[int, ...]

    def windows(self) -> list[range]:
        return [range(start, start + self.memory) for start in self.starts]


def gpu_shapes(gpu_name: str) -> list[tuple[int, int]]:
    """Every GPU-instance shape (compute slices, memory slices) of this GPU's MIG mode."""
    return sorted(PLACEMENTS[memory_slice_count(gpu_name)])


def shape_by_size(
    gpu_name: str, compute: int, memory: int, gpu_memory_bytes: int | None = None
) -> Shape:
    """The shape (compute, memory) of this GPU's rules, named as NVIDIA names its profile
    (``3g.40gb``: the memory is the GPU's per slice, rounded) or, when the GPU's memory is
    unknown, ``3g (4 slices)``."""
    slices = memory_slice_count(gpu_name)
    starts = PLACEMENTS[slices][(compute, memory)]
    model = mig_model(gpu_name, gpu_memory_bytes) if gpu_memory_bytes else None
    if model is not None and (named := model.name_of(compute, memory)):
        name = named  # NVIDIA's own name: an H200's 3g is 3g.71gb, not the 70 of 4 x 17.6
    elif gpu_memory_bytes:
        name = f"{compute}g.{round(gpu_memory_bytes / GIB / slices * memory)}gb"
    else:
        name = f"{compute}g ({memory} slice{'s' if memory != 1 else ''})"
    return Shape(name, compute, memory, starts)


def memory_slice_count(gpu_name: str) -> int:
    """8, or 4 for an A30 or an RTX PRO 6000 Blackwell (every size of a model has the same)."""
    model = mig_model(gpu_name, 1)  # any memory: only the count of slices is asked
    return model.memory_slices if model is not None else 8


def shape_of(profile: str, gpu_name: str, gpu_memory_bytes: int | None) -> Shape | None:
    """The profile's shape on this GPU, None when the GPU's model has no such profile (or, for
    a model gpualloc does not know, the GPU's memory, needed to tell 1g.10gb from 1g.20gb, is
    unknown)."""
    parsed = parse_mig_profile(profile)
    slices = memory_slice_count(gpu_name)
    rules = PLACEMENTS[slices]
    if parsed.compute_slices != parsed.slices:
        return None  # a compute instance inside a GPU instance, not a GPU instance
    model = mig_model(gpu_name, gpu_memory_bytes)
    if model is not None:  # the model's own profiles, and no other (1g.5gb is no H100's)
        shape = model.shape(base_profile(parsed))
        return Shape(parsed.name, *shape, rules[shape]) if shape is not None else None
    sizes = sorted({memory for compute, memory in rules if compute == parsed.slices})
    if not sizes:
        return None
    if len(sizes) == 1:
        memory = sizes[0]
    elif not gpu_memory_bytes:
        return None
    else:
        wanted = parsed.nominal_memory_gb * GIB * slices / gpu_memory_bytes
        memory = min(sizes, key=lambda size: abs(size - wanted))
    return Shape(parsed.name, parsed.slices, memory, rules[(parsed.slices, memory)])


def occupied_slices(instances: Iterable[MigInstance]) -> frozenset[int] | None:
    """The memory slices a GPU's instances occupy (one GPU's), None when one of them has no
    known placement (``nvidia-smi -L`` does not show it; NVML and ``mig -lgi`` do)."""
    taken: set[int] = set()
    for instance in instances:
        if instance.placement_start is None or instance.placement_size is None:
            return None
        start = instance.placement_start
        taken.update(range(start, start + instance.placement_size))
    return frozenset(taken)


def free_starts(shape: Shape, occupied: Iterable[int]) -> list[int]:
    """Where an instance of ``shape`` could be created now."""
    taken = set(occupied)
    return [w.start for w in shape.windows() if not taken.intersection(w)]


def still_fit(shapes: Sequence[Shape], occupied: Iterable[int]) -> dict[str, int]:
    """How many instances of each shape the free slices could still hold, each counted alone
    (profile -> count; zero counts left out)."""
    taken = set(occupied)
    counts = {}
    for shape in shapes:
        placed = 0
        room = set(taken)
        for window in shape.windows():
            if not room.intersection(window):
                room.update(window)
                placed += 1
        if placed:
            counts[shape.profile] = placed
    return counts
