"""PCIe path classes between two devices, as NVML and ``nvidia-smi topo -m`` name them."""

from __future__ import annotations

from enum import Enum


class PciePath(str, Enum):
    """How the PCIe path between two GPUs runs, nearest first.

    The values mirror NVML's ``nvmlGpuTopologyLevel_t`` and the legend of ``nvidia-smi topo -m``:

    - ``BOARD``: both GPUs on one board (dual-GPU boards such as the K80; NVML ``INTERNAL``).
    - ``PIX``: at most one PCIe bridge between them (NVML ``SINGLE``).
    - ``PXB``: several PCIe bridges, but not the host bridge (NVML ``MULTIPLE``).
    - ``PHB``: through a PCIe host bridge, typically the CPU (NVML ``HOSTBRIDGE``).
    - ``NODE``: between host bridges within one NUMA node (NVML ``NODE``).
    - ``SYS``: across the SMP interconnect between NUMA nodes, QPI/UPI/Infinity Fabric (NVML
      ``SYSTEM``). Drivers before R384 printed this as ``SOC``; gpualloc reports it as ``SYS``.
    """

    BOARD = "BOARD"
    PIX = "PIX"
    PXB = "PXB"
    PHB = "PHB"
    NODE = "NODE"
    SYS = "SYS"

    @property
    def rank(self) -> int:
        """0 for the nearest class (``BOARD``), 5 for the farthest (``SYS``)."""
        return _ORDER.index(self)

    @classmethod
    def from_token(cls, token: str) -> PciePath:
        """Parse an ``nvidia-smi topo -m`` cell; ``SOC`` (old drivers) becomes ``SYS``."""
        upper = token.strip().upper()
        if upper == "SOC":
            return cls.SYS
        return cls(upper)


_ORDER = list(PciePath)

NVML_TOPOLOGY_LEVELS: dict[int, PciePath] = {
    0: PciePath.BOARD,
    10: PciePath.PIX,
    20: PciePath.PXB,
    30: PciePath.PHB,
    40: PciePath.NODE,
    50: PciePath.SYS,
}
"""``nvmlGpuTopologyLevel_t`` values (nvml.h) to path classes."""
