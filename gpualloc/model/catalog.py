"""What a GPU's marketing name tells about its links: NVLink generation, link rate, PCIe generation.

Used when a source names the GPUs (NVML, ``nvidia-smi nvlink -s``, ``--query-gpu``) but does not
report link versions or PCIe links. The architecture label keys per-link rates that differ from
their generation's in :class:`~gpualloc.model.bandwidth.BandwidthTable` (GA102 bridges run NVLink 3
at 14.06 GB/s per link, not 25). Sources are the vendor documents named on each entry.
"""

from __future__ import annotations

import re

from msgspec import Struct


class GpuFamily(Struct, frozen=True):
    """Link facts shared by every GPU whose name matches ``pattern``."""

    pattern: str
    architecture: str
    nvlink_generation: int | None
    max_nvlinks: int | None
    pcie_generation: int | None
    source: str


FAMILIES: tuple[GpuFamily, ...] = (
    GpuFamily(r"\bG?B[123]00\b", "blackwell", 5, 18, 5, "HGX B200 datasheet: 18 links, 1.8 TB/s"),
    GpuFamily(
        r"\bGH200|\bH[12]00\b|\bH800\b|\bH20\b",
        "hopper",
        4,
        18,
        5,
        "H100 whitepaper: 18 NVLink 4 links, 900 GB/s bidirectional",
    ),
    GpuFamily(
        r"\bA100\b|\bA800\b|\bA30\b",
        "ampere",
        3,
        12,
        4,
        "A100 whitepaper: 12 NVLink 3 links, 600 GB/s bidirectional",
    ),
    GpuFamily(
        r"RTX A6000|RTX A5500|RTX A5000|RTX A4500|\bA40\b|RTX 3090",
        "ampere-ga102",
        3,
        4,
        4,
        "RTX A6000 datasheet: NVLink bridge 112.5 GB/s bidirectional over 4 links",
    ),
    GpuFamily(
        r"V100|TITAN V\b|Quadro GV100",
        "volta",
        2,
        6,
        3,
        "Tesla V100 whitepaper: 6 NVLink 2 links, 300 GB/s bidirectional",
    ),
    GpuFamily(
        r"P100|Quadro GP100",
        "pascal",
        1,
        4,
        3,
        "Tesla P100 whitepaper: 4 NVLink 1 links, 160 GB/s bidirectional",
    ),
    GpuFamily(
        r"Quadro RTX [68]000|RTX 2080 Ti|TITAN RTX",
        "turing",
        2,
        2,
        3,
        "Quadro RTX 8000 datasheet: NVLink 100 GB/s bidirectional over 2 links",
    ),
    GpuFamily(
        r"RTX PRO 6000|RTX 50[6-9]0|GB10\b",
        "blackwell",
        None,
        None,
        5,
        "RTX PRO 6000 / GeForce RTX 50 datasheets: PCIe Gen 5, no NVLink",
    ),
    GpuFamily(
        r"\bL40S?\b|\bL4\b|RTX 40[6-9]0|RTX [0-9]+ Ada",
        "ada",
        None,
        None,
        4,
        "L40S / RTX 6000 Ada datasheets: PCIe Gen 4, no NVLink",
    ),
    GpuFamily(
        r"\bT4\b|Quadro RTX [45]000|RTX 20[6-8]0\b",
        "turing",
        None,
        None,
        3,
        "T4 datasheet: PCIe Gen 3",
    ),
    GpuFamily(r"\bK(80|40|20)\b", "kepler", None, None, 3, "Tesla K80 datasheet: PCIe Gen 3"),
)


def family_of(name: str | None) -> GpuFamily | None:
    """The first family whose pattern matches ``name`` (case-insensitive), or None."""
    if not name:
        return None
    for family in FAMILIES:
        if re.search(family.pattern, name, flags=re.IGNORECASE):
            return family
    return None
