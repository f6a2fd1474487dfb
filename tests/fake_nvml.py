"""A data-driven fake of the pynvml functions gpualloc calls (house style habit 3).

Built from a Topology (usually a bundled one), it answers like NVML would on that host and raises
the real ``pynvml.NVMLError_*`` classes, so the NVML source is tested the way it meets a driver:
NVSwitch links, fields a GPU does not support, a GPU that falls off the bus, no library at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pynvml

from gpualloc.model import PciePath, Topology
from gpualloc.model.paths import NVML_TOPOLOGY_LEVELS

LEVEL_OF = {path: level for level, path in NVML_TOPOLOGY_LEVELS.items()}
GENERATION_TO_VERSION = {1: 1, 2: 2, 3: 4, 4: 6, 5: 7}


def bus_id(index: int) -> str:
    return f"00000000:{0x10 + index:02X}:00.0"


NO_ID = 0xFFFFFFFF
"""NVML's GPU/compute instance id of a process on a GPU not in MIG mode."""


@dataclass
class FakeMig:
    """One MIG device of a fake GPU in MIG mode."""

    slot: int
    uuid: str
    profile: str
    gpu_instance: int
    compute_instance: int
    memory_bytes: int
    slices: int
    compute_slices: int
    placement: tuple[int, int]


@dataclass(frozen=True)
class MigHandle:
    """What the fake returns for nvmlDeviceGetMigDeviceHandleByIndex."""

    gpu: int
    slot: int


@dataclass
class FakeGpu:
    uuid: str
    name: str
    bus_id: str
    memory_bytes: int
    numa_node: int
    cpus: list[int]
    pcie_generation: int = 4
    pcie_width: int = 16
    serial: str | None = None
    """The board serial (None: the GPU has none, NVML says NotSupported)."""
    mig_mode: int = 0
    mig_pending: int | None = None
    """MIG mode after the next reset (None: the same as now)."""
    nvlinks: list[tuple[str, int, int]] = field(default_factory=list)
    """(remote bus id, remote device type, nvmlNvlinkVersion_t) per active link."""
    unsupported: set[str] = field(default_factory=set)
    """NVML function names that raise NotSupported for this GPU."""
    lost_on: set[str] = field(default_factory=set)
    """NVML function names that raise GpuIsLost for this GPU ('*' = all, even the handle)."""
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    """(pid, used GPU memory in bytes or None) of the compute processes running on it."""
    mig: list[FakeMig] = field(default_factory=list)
    max_mig_devices: int = 7
    memory_used_bytes: int | None = None
    """What nvmlDeviceGetMemoryInfo reports in use; None: the processes' memory summed."""
    mig_processes: list[tuple[int, int | None, int, int]] = field(default_factory=list)
    """(pid, used memory, GPU instance id, compute instance id) of processes on MIG devices."""
    ecc_uncorrected: int = 0
    """Volatile uncorrectable ECC errors (nvmlDeviceGetTotalEccErrors)."""
    retired_pages_pending: bool = False
    utilization: int = 0
    """Percent of time a kernel ran (nvmlDeviceGetUtilizationRates().gpu)."""
    nvlinks_down: set[int] = field(default_factory=set)
    """NVLink ports that report inactive (nvmlDeviceGetNvLinkState 0): a link gone down."""
    pcie_width_now: int | None = None
    """The PCIe width the link trained to (None: its maximum)."""
    pcie_generation_now: int | None = None
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)
    """(corrected rows, uncorrected rows, pending, failure), as nvmlDeviceGetRemappedRows."""

    @property
    def used_memory(self) -> int:
        if self.memory_used_bytes is not None:
            return self.memory_used_bytes
        return sum(used or 0 for _pid, used in self.processes)


class FakeNvml(SimpleNamespace):
    """Module-like object: attribute access mirrors ``pynvml``."""

    def __init__(self, gpus: list[FakeGpu], ancestors: dict[tuple[int, int], int]) -> None:
        errors = {
            name: getattr(pynvml, name) for name in dir(pynvml) if name.startswith("NVMLError")
        }
        constants = {
            name: getattr(pynvml, name)
            for name in (
                "NVML_NVLINK_MAX_LINKS",
                "NVML_MEMORY_ERROR_TYPE_UNCORRECTED",
                "NVML_VOLATILE_ECC",
                "NVML_FEATURE_ENABLED",
            )
        }
        super().__init__(**errors, **constants)
        self.gpus = gpus
        self.ancestors = ancestors
        self.init_error: Exception | None = None
        self.calls: dict[str, int] = {}
        self.p2p: dict[tuple[int, int, int], int] = {}
        """(GPU a, GPU b, caps index) -> nvmlGpuP2PStatus_t other than OK (0)."""

    @classmethod
    def from_topology(cls, topology: Topology) -> FakeNvml:
        gpus = []
        for gpu in topology.gpus:
            gpus.append(
                FakeGpu(
                    uuid=gpu.uuid or f"GPU-fake-{gpu.index}",
                    serial=gpu.serial,
                    name=gpu.name or "NVIDIA Fake",
                    bus_id=bus_id(gpu.index),
                    memory_bytes=gpu.memory_total_bytes or 0,
                    numa_node=gpu.numa_node if gpu.numa_node is not None else -1,
                    cpus=gpu.cpu_affinity,
                    pcie_generation=gpu.pcie_generation or 3,
                    mig_mode=1 if gpu.mig_enabled else 0,
                    mig=[
                        FakeMig(
                            slot=m.device,
                            uuid=m.uuid or f"MIG-fake-{gpu.index}-{m.device}",
                            profile=m.profile,
                            gpu_instance=m.gpu_instance or 0,
                            compute_instance=m.compute_instance or 0,
                            memory_bytes=m.memory_bytes,
                            slices=m.slices,
                            compute_slices=m.parsed_profile.compute_slices,
                            placement=(m.placement_start or 0, m.placement_size or m.slices),
                        )
                        for m in topology.mig_on(gpu.index)
                    ],
                )
            )
        switch_links: dict[int, int] = {}
        for link in topology.links:
            version = GENERATION_TO_VERSION[link.nvlink_generation or 2]
            if link.nvswitch:
                for side in (link.a, link.b):
                    switch_links[side] = link.nvlinks
                continue
            for _ in range(link.nvlinks):
                gpus[link.a].nvlinks.append((bus_id(link.b), 0, version))
                gpus[link.b].nvlinks.append((bus_id(link.a), 0, version))
        for index, count in switch_links.items():
            version = GENERATION_TO_VERSION[topology.gpus[index].nvlink_generation or 4]
            gpus[index].nvlinks += [
                (f"00000000:{0xA0 + k % 6:02X}:00.0", 2, version) for k in range(count)
            ]
        ancestors = {
            (link.a, link.b): LEVEL_OF[link.pcie or PciePath.PHB] for link in topology.links
        }
        fake = cls(gpus, ancestors)
        for link in topology.links:
            if link.peer_access is False:  # as a GeForce board answers: GPU not supported
                fake.p2p[(link.a, link.b, 0)] = 2
        return fake

    # ---- helpers --------------------------------------------------------------------------

    def _mig(self, handle: MigHandle, function: str) -> FakeMig:
        self.calls[function] = self.calls.get(function, 0) + 1
        gpu = self.gpus[handle.gpu]
        if function in gpu.unsupported:
            raise pynvml.NVMLError_NotSupported()
        return next(m for m in gpu.mig if m.slot == handle.slot)

    def _gpu(self, handle: int, function: str) -> FakeGpu:
        self.calls[function] = self.calls.get(function, 0) + 1
        gpu = self.gpus[handle]
        if function in gpu.lost_on or "*" in gpu.lost_on:
            raise pynvml.NVMLError_GpuIsLost()
        if function in gpu.unsupported:
            raise pynvml.NVMLError_NotSupported()
        return gpu

    # ---- the NVML API used by gpualloc.discovery.nvml ------------------------------------

    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] = self.calls.get("nvmlInit", 0) + 1
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        pass

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.82.07"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 13000

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if "*" in self.gpus[index].lost_on:
            raise pynvml.NVMLError_GpuIsLost()
        return index

    def nvmlDeviceGetMinorNumber(self, handle: int) -> int:
        self._gpu(handle, "nvmlDeviceGetMinorNumber")
        return handle  # the driver numbers device files in probe order: index order here

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        gpu = self._gpu(handle, "nvmlDeviceGetComputeRunningProcesses")
        found = [
            SimpleNamespace(
                pid=pid, usedGpuMemory=used, gpuInstanceId=NO_ID, computeInstanceId=NO_ID
            )
            for pid, used in gpu.processes
        ]
        found += [
            SimpleNamespace(pid=pid, usedGpuMemory=used, gpuInstanceId=gi, computeInstanceId=ci)
            for pid, used, gi, ci in gpu.mig_processes
        ]
        return found

    def nvmlDeviceGetUUID(self, handle: int | MigHandle) -> str:
        if isinstance(handle, MigHandle):
            return self._mig(handle, "nvmlDeviceGetUUID").uuid
        return self._gpu(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, handle: int | MigHandle) -> str:
        if isinstance(handle, MigHandle):
            mig = self._mig(handle, "nvmlDeviceGetName")
            return f"{self.gpus[handle.gpu].name} MIG {mig.profile}"
        return self._gpu(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetSerial(self, handle: int) -> str:
        serial = self._gpu(handle, "nvmlDeviceGetSerial").serial
        if serial is None:
            raise pynvml.NVMLError_NotSupported()
        return serial

    def nvmlDeviceGetPciInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(busId=self._gpu(handle, "nvmlDeviceGetPciInfo").bus_id)

    def nvmlDeviceGetMemoryInfo(self, handle: int | MigHandle) -> SimpleNamespace:
        if isinstance(handle, MigHandle):
            return SimpleNamespace(total=self._mig(handle, "nvmlDeviceGetMemoryInfo").memory_bytes)
        gpu = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        used = min(gpu.used_memory, gpu.memory_bytes)
        return SimpleNamespace(total=gpu.memory_bytes, used=used, free=gpu.memory_bytes - used)

    # ---- MIG ------------------------------------------------------------------------------

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        gpu = self._gpu(handle, "nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=gpu.utilization, memory=0)

    def nvmlDeviceGetTotalEccErrors(self, handle: int, error_type: int, counter: int) -> int:
        assert (error_type, counter) == (1, 0)  # uncorrected, volatile
        return self._gpu(handle, "nvmlDeviceGetTotalEccErrors").ecc_uncorrected

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetRetiredPagesPendingStatus")
        return int(gpu.retired_pages_pending)

    def nvmlDeviceGetRemappedRows(self, handle: int) -> tuple[int, int, int, int]:
        return self._gpu(handle, "nvmlDeviceGetRemappedRows").remapped_rows

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetMaxMigDeviceCount")
        return gpu.max_mig_devices if gpu.mig_mode else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: int, index: int) -> MigHandle:
        gpu = self._gpu(handle, "nvmlDeviceGetMigDeviceHandleByIndex")
        if not gpu.mig_mode:
            raise pynvml.NVMLError_InvalidArgument()
        if all(m.slot != index for m in gpu.mig):
            raise pynvml.NVMLError_NotFound()
        return MigHandle(handle, index)

    def nvmlDeviceGetGpuInstanceId(self, handle: MigHandle) -> int:
        return self._mig(handle, "nvmlDeviceGetGpuInstanceId").gpu_instance

    def nvmlDeviceGetComputeInstanceId(self, handle: MigHandle) -> int:
        return self._mig(handle, "nvmlDeviceGetComputeInstanceId").compute_instance

    def nvmlDeviceGetAttributes(self, handle: MigHandle) -> SimpleNamespace:
        mig = self._mig(handle, "nvmlDeviceGetAttributes")
        return SimpleNamespace(
            gpuInstanceSliceCount=mig.slices,
            computeInstanceSliceCount=mig.compute_slices,
            memorySizeMB=mig.memory_bytes // (1024 * 1024),
        )

    def nvmlDeviceGetGpuInstanceById(self, handle: int, gpu_instance: int) -> tuple[int, int]:
        gpu = self._gpu(handle, "nvmlDeviceGetGpuInstanceById")
        if not any(m.gpu_instance == gpu_instance for m in gpu.mig):
            raise pynvml.NVMLError_NotFound()
        return handle, gpu_instance

    def nvmlGpuInstanceGetInfo(self, instance: tuple[int, int]) -> SimpleNamespace:
        handle, gpu_instance = instance
        gpu = self._gpu(handle, "nvmlGpuInstanceGetInfo")
        mig = next(m for m in gpu.mig if m.gpu_instance == gpu_instance)
        start, size = mig.placement
        return SimpleNamespace(id=gpu_instance, placement=SimpleNamespace(start=start, size=size))

    def nvmlDeviceGetMigMode(self, handle: int) -> list[int]:
        gpu = self._gpu(handle, "nvmlDeviceGetMigMode")
        return [gpu.mig_mode, gpu.mig_mode if gpu.mig_pending is None else gpu.mig_pending]

    def nvmlDeviceGetNumaNodeId(self, handle: int) -> int:
        return self._gpu(handle, "nvmlDeviceGetNumaNodeId").numa_node

    def nvmlDeviceGetCpuAffinity(self, handle: int, words: int) -> list[int]:
        cpus = self._gpu(handle, "nvmlDeviceGetCpuAffinity").cpus
        mask = [0] * words
        for cpu in cpus:
            if cpu // 64 < words:  # NVML fills only the words it was given
                mask[cpu // 64] |= 1 << (cpu % 64)
        return mask

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: int) -> int:
        return self._gpu(handle, "nvmlDeviceGetMaxPcieLinkGeneration").pcie_generation

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: int) -> int:
        return self._gpu(handle, "nvmlDeviceGetMaxPcieLinkWidth").pcie_width

    def nvmlDeviceGetTopologyCommonAncestor(self, first: int, second: int) -> int:
        self._gpu(first, "nvmlDeviceGetTopologyCommonAncestor")
        self._gpu(second, "nvmlDeviceGetTopologyCommonAncestor")
        return self.ancestors[(min(first, second), max(first, second))]

    def _link(self, handle: int, link: int, function: str) -> tuple[str, int, int]:
        gpu = self._gpu(handle, function)
        if not gpu.nvlinks and function == "nvmlDeviceGetNvLinkState":
            raise pynvml.NVMLError_NotSupported()
        if link >= len(gpu.nvlinks):
            raise pynvml.NVMLError_InvalidArgument()
        return gpu.nvlinks[link]

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:
        self._link(handle, link, "nvmlDeviceGetNvLinkState")
        return 0 if link in self.gpus[handle].nvlinks_down else 1

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetCurrPcieLinkWidth")
        return gpu.pcie_width_now or gpu.pcie_width

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetCurrPcieLinkGeneration")
        return gpu.pcie_generation_now or gpu.pcie_generation

    def nvmlDeviceGetP2PStatus(self, first: int, second: int, index: int) -> int:
        self._gpu(first, "nvmlDeviceGetP2PStatus")
        self._gpu(second, "nvmlDeviceGetP2PStatus")
        return self.p2p.get((min(first, second), max(first, second), index), 0)

    def nvmlDeviceGetNvLinkVersion(self, handle: int, link: int) -> int:
        return self._link(handle, link, "nvmlDeviceGetNvLinkVersion")[2]

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: int, link: int) -> SimpleNamespace:
        return SimpleNamespace(
            busId=self._link(handle, link, "nvmlDeviceGetNvLinkRemotePciInfo")[0]
        )

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: int, link: int) -> int:
        return self._link(handle, link, "nvmlDeviceGetNvLinkRemoteDeviceType")[1]


def probe(fake: FakeNvml) -> Topology:
    """What gpualloc's NVML source finds on ``fake`` (no NUMA nodes, 256 CPUs)."""
    from gpualloc.discovery.nvml import NvmlSession

    with NvmlSession(fake) as session:
        return session.probe(numa_nodes=[], cpu_count=256)
