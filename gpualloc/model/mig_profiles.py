"""Which MIG profiles each GPU model has.

A profile's name carries the memory of its GPU model (``1g.5gb`` on an A100 40GB is ``1g.10gb``
on an A100 80GB or an H100 80GB, ``1g.18gb`` on an H200), so a profile of one model is no
profile of another: ``nvidia-smi mig -cgi 1g.5gb`` fails on an H100. The table is NVIDIA's
MIG User Guide, "Supported MIG Profiles" (A30, A100 40GB and, by its note, A100 80GB; H100,
H200, B200) and the profiles NVIDIA's own MIG partition editor configures by model
(NVIDIA/mig-parted, ``deployments/systemd/config-default.yaml``: H100 94GB "H100 NVL", H100
96GB "GH200 / H20", GH200 144GB, GB200, RTX PRO 6000 Blackwell).

Each model lists its GPU-instance profiles in the order of its slice shapes
(:data:`SHAPES`): on an 8-memory-slice GPU 1g (1 slice), 1g with twice the memory (2 slices),
2g, 3g, 4g, 7g; on a 4-slice GPU 1g, 2g, 4g. A model is told by its NVML name and, where one
name covers several memory sizes (an ``NVIDIA H100`` of 80, 94 or 96 GB), by the memory the GPU
reports, nearest to the size it is sold with.
"""

from __future__ import annotations

import re

from msgspec import Struct

from gpualloc.model.mig import GIB, MigProfile

SHAPES: dict[int, tuple[tuple[int, int], ...]] = {
    8: ((1, 1), (1, 2), (2, 2), (3, 4), (4, 4), (7, 8)),
    4: ((1, 1), (2, 2), (4, 4)),
}
"""Memory slices of the GPU -> its GPU-instance shapes (compute slices, memory slices), in the
order each model lists its profiles."""

USABLE_SHARE = 0.95
"""What a profile holds, at least, of its nominal size read as GiB: NVIDIA's listings
(``nvidia-smi mig -lgip``) show 4.75 GiB for a ``1g.5gb``, 9.75 for a ``1g.10gb``, 19.5-19.62
for a ``2g.20gb``, 79.0-79.25 for a ``7g.80gb``; 95 % is under every one of them."""


class MigModel(Struct, frozen=True):
    """The MIG profiles of one GPU model."""

    label: str
    """How the guide names it: ``H100 80GB``."""
    pattern: str
    """Matches the NVML names of the GPUs of this model (and of its siblings of other
    memory sizes, which :attr:`memory_gb` tells apart)."""
    memory_gb: int
    """The memory it is sold with."""
    profiles: tuple[str, ...]
    """Its GPU-instance profiles, one per shape of :data:`SHAPES`."""

    @property
    def memory_slices(self) -> int:
        return 8 if len(self.profiles) == len(SHAPES[8]) else 4

    def shape(self, profile: str) -> tuple[int, int] | None:
        """(compute slices, memory slices) of ``profile`` (a base name: ``3g.40gb``) here."""
        if profile not in self.profiles:
            return None
        return SHAPES[self.memory_slices][self.profiles.index(profile)]

    def name_of(self, compute: int, memory: int) -> str | None:
        """The profile of shape (compute slices, memory slices), None when there is none."""
        shapes = SHAPES[self.memory_slices]
        if (compute, memory) not in shapes:
            return None
        return self.profiles[shapes.index((compute, memory))]


def _profiles(slices: int, *memory_gb: int) -> tuple[str, ...]:
    """A model's profile names from the memory of each of its shapes: ``_profiles(4, 6, 12,
    24)`` is ``1g.6gb``, ``2g.12gb``, ``4g.24gb``."""
    return tuple(f"{c}g.{gb}gb" for (c, _), gb in zip(SHAPES[slices], memory_gb, strict=True))


_A100 = r"\bA[18]00\b"
_H100 = r"\bH[18]00\b"
MODELS: tuple[MigModel, ...] = (
    MigModel("A100 40GB", _A100, 40, _profiles(8, 5, 10, 10, 20, 20, 40)),
    MigModel("A100 80GB", _A100, 80, _profiles(8, 10, 20, 20, 40, 40, 80)),
    MigModel("H100 80GB", _H100, 80, _profiles(8, 10, 20, 20, 40, 40, 80)),
    MigModel("H100 94GB", _H100, 94, _profiles(8, 12, 24, 24, 47, 47, 94)),
    MigModel("H100 96GB", rf"{_H100}|\bGH200\b|\bH20\b", 96, _profiles(8, 12, 24, 24, 48, 48, 96)),
    MigModel("H200 141GB", r"\bH200\b", 141, _profiles(8, 18, 35, 35, 71, 71, 141)),
    MigModel("GH200 144GB", r"\bGH200\b", 144, _profiles(8, 18, 36, 36, 72, 72, 144)),
    MigModel("B200", r"\bB200\b", 180, _profiles(8, 23, 45, 45, 90, 90, 180)),
    MigModel("GB200", r"\bGB200\b", 186, _profiles(8, 23, 47, 47, 93, 93, 186)),
    MigModel("A30", r"\bA30\b", 24, _profiles(4, 6, 12, 24)),
    MigModel("RTX PRO 6000 Blackwell", r"RTX PRO 6000 Blackwell", 96, _profiles(4, 24, 48, 96)),
)
"""Every GPU model whose MIG profiles gpualloc knows."""


def mig_model(gpu_name: str | None, memory_bytes: int | None) -> MigModel | None:
    """The model of a GPU by its NVML name and reported memory; None when gpualloc does not
    know its MIG profiles (not a MIG GPU, a newer one, or a name that fits several models of
    different memory while the memory is unknown)."""
    if not gpu_name:
        return None
    found = [m for m in MODELS if re.search(m.pattern, gpu_name, re.IGNORECASE)]
    if len(found) <= 1:
        return found[0] if found else None
    size = memory_bytes / GIB if memory_bytes else _size_in_name(gpu_name)
    if size is None:
        return None
    return min(found, key=lambda m: abs(m.memory_gb - size))


def _size_in_name(gpu_name: str) -> float | None:
    """The ``80`` of ``NVIDIA A100-SXM4-80GB`` / ``NVIDIA H100 80GB HBM3``."""
    match = re.search(r"(\d+)\s*GB\b", gpu_name, re.IGNORECASE)
    return float(match[1]) if match else None


def base_profile(profile: MigProfile) -> str:
    """The GPU-instance profile a profile name is of: ``3g.20gb`` for ``3g.20gb``,
    ``1c.3g.20gb`` (one of its compute instances) or ``3g.20gb+me``."""
    return f"{profile.slices}g.{profile.nominal_memory_gb}gb"


def usable_bytes(profile: str) -> int:
    """The memory a GPU instance of ``profile`` holds at least (:data:`USABLE_SHARE`)."""
    nominal = int(profile.split("g.", 1)[1].removesuffix("gb"))
    return int(nominal * USABLE_SHARE * GIB)
