"""The NVML source: the only module of gpualloc that imports ``pynvml`` (from nvidia-ml-py).

It degrades per field and per GPU (house style habit 2, after nvitop and gpustat): a query NVML
does not support becomes "unknown" plus a provenance note; a GPU that fell off the bus is marked
``lost`` and kept out of every link; NVML absent or the driver not loaded raises
:class:`~gpualloc.errors.DiscoveryUnavailable`, and the resolver falls back to nvidia-smi.

Each GPU's NVLinks are queried once per link index, not once per GPU pair: link state, version,
the remote end's PCI bus id and the remote device type. Links whose remote end is an NVSwitch make
the GPU part of a switch fabric, so that DGX A100/H100 pairs are seen as NVLinked (NVIDIA's own
go-gpuallocator only matches remote bus ids against GPUs and so sees no NVLink there).

The module object is injected (``nvml=``) so that tests run against a data-driven fake that raises
the real ``pynvml.NVMLError_*`` classes.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from msgspec import Struct, field
from msgspec.structs import replace

from gpualloc import boot
from gpualloc.discovery.assemble import PairFacts, assemble_topology
from gpualloc.discovery.p2p_codes import NVML_P2P_CODE, P2P_READ, peer_access_of
from gpualloc.discovery.running_process import RunningProcess
from gpualloc.discovery.text import text_of
from gpualloc.errors import DiscoveryError, DiscoveryUnavailable, NoGpuFound
from gpualloc.model.bandwidth import DEFAULT_BANDWIDTH_TABLE, BandwidthTable
from gpualloc.model.paths import NVML_TOPOLOGY_LEVELS
from gpualloc.model.topology import Gpu, Health, NumaNode, Provenance, Topology

T = TypeVar("T")

NVLINK_VERSION_TO_GENERATION = {1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 5, 8: 6}
"""``nvmlNvlinkVersion_t`` (1.0, 2.0, 2.2, 3.0, 3.1, 4.0, 5.0, 6.0) to NVLink generation."""

REMOTE_GPU, REMOTE_CPU, REMOTE_SWITCH = 0, 1, 2
"""``NVML_NVLINK_DEVICE_TYPE_GPU / _IBMNPU / _SWITCH``."""

SYSFS_PCI_DEVICES = Path("/sys/bus/pci/devices")


def load_pynvml() -> ModuleType:
    """Import pynvml from nvidia-ml-py."""
    try:
        import pynvml
    except ImportError as exc:
        raise DiscoveryUnavailable(
            "the nvidia-ml-py package is not installed", hint="pip install nvidia-ml-py"
        ) from exc
    return pynvml


def normalise_bus_id(bus_id: str | bytes) -> str:
    """One canonical form for PCI bus ids: ``00000000:07:00.0``, upper case.

    NVML prints an 8-digit domain, sysfs and lspci a 4-digit one; either compares equal after this.
    """
    text = (bus_id.decode() if isinstance(bus_id, bytes) else bus_id).strip()
    parts = text.split(":")
    if len(parts) == 2:
        parts.insert(0, "0")
    if len(parts) != 3:
        return text.upper()
    domain, bus, devfn = parts
    return f"{int(domain, 16):08X}:{bus}:{devfn}".upper()


class _GpuLost(Exception):
    """Internal: a GPU stopped answering while it was being queried."""


class _Probe(Struct):
    """Per-GPU results collected while probing."""

    handle: Any
    gpu: Gpu
    nvlinks: list[tuple[int, str, int | None]] = field(default_factory=list)
    """(remote type, remote bus id, NVLink generation) per active link."""


class NvmlSession:
    """``with NvmlSession(nvml) as s:`` initialises NVML and always shuts it down."""

    def __init__(self, nvml: ModuleType | None = None) -> None:
        self.nvml = nvml or load_pynvml()
        self._numa: list[NumaNode] | None = None

    def __enter__(self) -> NvmlSession:
        nvml = self.nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError_LibraryNotFound as exc:
            raise DiscoveryUnavailable(
                "NVML (libnvidia-ml.so.1) not found: no NVIDIA driver is installed"
            ) from exc
        except nvml.NVMLError_DriverNotLoaded as exc:
            raise DiscoveryUnavailable("the NVIDIA kernel driver is not loaded") from exc
        except nvml.NVMLError as exc:
            raise DiscoveryUnavailable(f"NVML failed to initialise: {exc}") from exc
        return self

    def __exit__(self, *exc_info: object) -> None:
        with contextlib.suppress(self.nvml.NVMLError):
            self.nvml.nvmlShutdown()

    # ---- cheap identity, for the cache key ---------------------------------------------------

    def driver_version(self) -> str | None:
        try:
            return text_of(self.nvml.nvmlSystemGetDriverVersion())
        except self.nvml.NVMLError:
            return None

    def gpu_uuids(self) -> list[str | None]:
        nvml = self.nvml
        uuids: list[str | None] = []
        for index in range(self.device_count()):
            try:
                uuids.append(
                    text_of(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(index)))
                )
            except nvml.NVMLError:
                uuids.append(None)
        return uuids

    def mig_uuids(self) -> tuple[str | None, ...]:
        """The UUIDs of every MIG device, GPU by GPU (empty without MIG)."""
        from gpualloc.discovery.nvml_mig import mig_device_uuids

        nvml = self.nvml
        uuids: list[str | None] = []
        for index in range(self.device_count()):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            except nvml.NVMLError:
                continue
            uuids.extend(mig_device_uuids(nvml, handle))
        return tuple(uuids)

    def device_count(self) -> int:
        try:
            return int(self.nvml.nvmlDeviceGetCount())
        except self.nvml.NVMLError as exc:
            raise DiscoveryError(f"NVML cannot count the GPUs: {exc}") from exc

    # ---- who runs on the GPUs now -------------------------------------------------------------

    def compute_processes(self) -> list[RunningProcess]:
        """Every compute process on every GPU (``nvmlDeviceGetComputeRunningProcesses``).

        A GPU that cannot be asked (lost, or the call unsupported) is skipped: its processes are
        unknown, which the caller reports; the others are still listed.
        """
        nvml = self.nvml
        found: list[RunningProcess] = []
        for index in range(self.device_count()):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = text_of(nvml.nvmlDeviceGetUUID(handle))
                processes = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except nvml.NVMLError:
                continue
            for process in processes:
                memory = getattr(process, "usedGpuMemory", None)
                found.append(
                    RunningProcess(
                        nvml_index=index,
                        uuid=uuid,
                        pid=int(process.pid),
                        used_memory_bytes=int(memory) if isinstance(memory, int) else None,
                        gpu_instance=_instance_id(getattr(process, "gpuInstanceId", None)),
                        compute_instance=_instance_id(getattr(process, "computeInstanceId", None)),
                    )
                )
        return found

    def gpu_usage(self) -> dict[str, tuple[int | None, int | None]]:
        """GPU UUID -> (bytes of memory in use, ``nvmlDeviceGetMemoryInfo``; percent of the
        last sample period a kernel ran, ``nvmlDeviceGetUtilizationRates``), in one pass over
        the GPUs; None where a GPU cannot say (in MIG mode there is no utilisation)."""
        nvml = self.nvml

        def number(read: Callable[[Any], Any], handle: Any) -> int | None:
            try:
                return int(read(handle))
            except (nvml.NVMLError, AttributeError, TypeError, ValueError):
                return None

        usage: dict[str, tuple[int | None, int | None]] = {}
        for index in range(self.device_count()):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = text_of(nvml.nvmlDeviceGetUUID(handle))
            except nvml.NVMLError:
                continue
            if uuid is None:  # the GPUs are matched by UUID: one without could not be
                continue
            usage[uuid] = (
                number(lambda h: nvml.nvmlDeviceGetMemoryInfo(h).used, handle),
                number(lambda h: nvml.nvmlDeviceGetUtilizationRates(h).gpu, handle),
            )
        return usage

    # ---- the full probe --------------------------------------------------------------------

    def probe(
        self,
        *,
        numa_nodes: list[NumaNode],
        table: BandwidthTable = DEFAULT_BANDWIDTH_TABLE,
        cpu_count: int | None = None,
    ) -> Topology:
        count = self.device_count()
        if count == 0:
            raise NoGpuFound(
                "NVML sees no GPU on this host",
                hint="try a bundled topology: gpualloc topo show --topology dgx1-v100",
            )
        notes: list[str] = []
        probes = [
            self._probe_gpu(index, notes, cpu_count or os.cpu_count() or 1)
            for index in range(count)
        ]
        pairs = self._pairs(probes, notes)
        from gpualloc.discovery.nvml_mig import probe_mig_devices

        mig = [
            instance
            for probe in probes
            if probe.handle is not None and probe.gpu.mig_enabled
            for instance in probe_mig_devices(self.nvml, probe.gpu.index, probe.handle, notes)
        ]
        provenance = Provenance(
            source="nvml",
            origin="NVML",
            hostname=boot.hostname(),
            machine_id=boot.machine_id(),
            captured_at=datetime.now(timezone.utc),
            driver_version=self.driver_version(),
            cuda_version=self._cuda_version(),
            notes=notes,
        )
        return assemble_topology(
            gpus=[p.gpu for p in probes],
            pairs=pairs,
            numa_nodes=numa_nodes,
            provenance=provenance,
            table=table,
            mig_instances=mig,
        )

    def _query(self, notes: list[str], what: str, call: Callable[[], T]) -> T | None:
        nvml = self.nvml
        try:
            return call()
        except nvml.NVMLError_GpuIsLost as exc:
            raise _GpuLost(what) from exc
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
            notes.append(f"{what}: not supported by this GPU or driver")
        except nvml.NVMLError as exc:
            notes.append(f"{what}: {exc}")
        return None

    def _probe_gpu(self, index: int, notes: list[str], cpu_count: int) -> _Probe:
        nvml = self.nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except nvml.NVMLError as exc:
            notes.append(f"GPU{index}: lost or inaccessible ({exc}); excluded from placement")
            return _Probe(handle=None, gpu=Gpu(index=index, health=Health.LOST))
        probe = _Probe(handle=handle, gpu=Gpu(index=index))
        try:
            probe.gpu = self._identity(index, handle, notes)
            probe.gpu = self._details(probe.gpu, handle, notes, cpu_count)
            probe.nvlinks = self._nvlinks(index, handle, notes)
        except _GpuLost as lost:
            notes.append(f"GPU{index}: fell off the bus while reading {lost}; marked lost")
            probe.gpu = replace(probe.gpu, health=Health.LOST)
            probe.handle = None
        return probe

    def _host_numa(self) -> list[NumaNode]:
        """This machine's NUMA nodes (sysfs), read once a session."""
        if self._numa is None:
            from gpualloc.discovery.numa import read_sysfs_numa

            self._numa = read_sysfs_numa()
        return self._numa

    def _identity(self, index: int, handle: Any, notes: list[str]) -> Gpu:
        """What names the card, asked before anything else: a GPU that falls off the bus while
        it is read (the first memory or ECC query trips a failing one) is still named by it."""
        nvml = self.nvml
        q = self._query
        label = f"GPU{index}"
        pci = q(notes, f"{label} PCI info", lambda: nvml.nvmlDeviceGetPciInfo(handle))
        try:  # quietly: consumer boards have no serial, and that is no news
            serial = text_of(nvml.nvmlDeviceGetSerial(handle)) or None
        except (nvml.NVMLError, AttributeError):
            serial = None
        return Gpu(
            index=index,
            uuid=text_of(q(notes, f"{label} UUID", lambda: nvml.nvmlDeviceGetUUID(handle))),
            pci_bus_id=normalise_bus_id(pci.busId) if pci is not None else None,
            name=text_of(q(notes, f"{label} name", lambda: nvml.nvmlDeviceGetName(handle))),
            serial=serial,
            minor_number=q(
                notes, f"{label} minor number", lambda: nvml.nvmlDeviceGetMinorNumber(handle)
            ),
        )

    def _details(self, gpu: Gpu, handle: Any, notes: list[str], cpu_count: int) -> Gpu:
        nvml = self.nvml
        q = self._query
        label = f"GPU{gpu.index}"
        memory = q(notes, f"{label} memory", lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        mig = q(notes, f"{label} MIG mode", lambda: nvml.nvmlDeviceGetMigMode(handle))
        numa_notes: list[str] = []
        reported = q(numa_notes, f"{label} NUMA node", lambda: nvml.nvmlDeviceGetNumaNodeId(handle))
        words = (cpu_count + 63) // 64
        mask = q(
            notes, f"{label} CPU affinity", lambda: nvml.nvmlDeviceGetCpuAffinity(handle, words)
        )
        cpus = _cpus_from_mask(mask) if mask is not None else []
        known = reported if reported is not None and reported >= 0 else None
        numa, gpu_numa = _numa_nodes(gpu.pci_bus_id, cpus, known, self._host_numa)
        if numa is None:  # said only when nothing else told it (it read 'not supported' after
            notes += numa_notes  # sysfs had answered, on a real H200)
        return replace(
            gpu,
            memory_total_bytes=int(memory.total) if memory is not None else None,
            numa_node=numa,
            numa_affinity=[numa] if numa is not None else [],
            gpu_numa_node=gpu_numa,
            cpu_affinity=cpus,
            mig_enabled=bool(mig[0]) if mig is not None else None,
            mig_pending=bool(mig[1]) if mig is not None else None,
            health=Health.OK,
            pcie_generation=q(
                notes,
                f"{label} PCIe generation",
                lambda: nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle),
            ),
            pcie_width=q(
                notes, f"{label} PCIe width", lambda: nvml.nvmlDeviceGetMaxPcieLinkWidth(handle)
            ),
        )

    def _nvlinks(
        self, index: int, handle: Any, notes: list[str]
    ) -> list[tuple[int, str, int | None]]:
        nvml = self.nvml
        links: list[tuple[int, str, int | None]] = []
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            try:
                if not nvml.nvmlDeviceGetNvLinkState(handle, link):
                    continue
            except nvml.NVMLError_GpuIsLost as exc:
                raise _GpuLost(f"NVLink {link}") from exc
            except nvml.NVMLError:
                # NotSupported / InvalidArgument: no NVLink, or past this GPU's last link.
                break
            version = self._query(
                notes,
                f"GPU{index} NVLink {link} version",
                partial(nvml.nvmlDeviceGetNvLinkVersion, handle, link),
            )
            remote = self._query(
                notes,
                f"GPU{index} NVLink {link} remote",
                partial(nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link),
            )
            if remote is None:
                continue
            remote_type = self._remote_type(handle, link)
            links.append(
                (
                    remote_type,
                    normalise_bus_id(remote.busId),
                    NVLINK_VERSION_TO_GENERATION.get(version) if version else None,
                )
            )
        return links

    def _nvlink_rate(self, handle: Any) -> float | None:
        """The per-link NVLink rate the driver reports (``NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON``,
        MB/s, one direction, as ``nvidia-smi nvlink -s`` prints it: 26.562 GB/s on H100 where the
        whitepaper's 25 GB/s is the table's); None where NVML has no such field or reads 0. The
        NVLink version alone does not give the rate
        (tests/test_nvml_mock.py::test_discovery_through_nvml_matches_the_profile)."""
        nvml = self.nvml
        field_id = getattr(nvml, "NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON", None)
        if handle is None or field_id is None or not hasattr(nvml, "nvmlDeviceGetFieldValues"):
            return None
        try:
            (found,) = nvml.nvmlDeviceGetFieldValues(handle, [field_id])
        except (nvml.NVMLError, ValueError, TypeError):
            return None
        if found.nvmlReturn != 0:
            return None
        union = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal")
        kind = union[found.valueType] if 0 <= found.valueType < len(union) else "uiVal"
        mbps = float(getattr(found.value, kind))
        return round(mbps / 1000, 3) if mbps > 0 else None

    def _remote_type(self, handle: Any, link: int) -> int:
        nvml = self.nvml
        try:
            return int(nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link))
        except nvml.NVMLError_GpuIsLost as exc:
            raise _GpuLost(f"NVLink {link} remote type") from exc
        except nvml.NVMLError:
            return -1  # decided from the bus id in _pairs (older drivers lack this call)

    def _pairs(self, probes: list[_Probe], notes: list[str]) -> dict[tuple[int, int], PairFacts]:
        nvml = self.nvml
        bus_to_index = {p.gpu.pci_bus_id: p.gpu.index for p in probes if p.gpu.pci_bus_id}
        switch_links: dict[int, int] = {}
        # (a, b) -> {reporting side: generations of its links to the other}
        direct: dict[tuple[int, int], dict[int, list[int | None]]] = {}
        for probe in probes:
            me = probe.gpu.index
            for remote_type, bus, generation in probe.nvlinks:
                peer = bus_to_index.get(bus)
                is_gpu = remote_type == REMOTE_GPU or (remote_type == -1 and peer is not None)
                if is_gpu and peer is not None and peer != me:
                    sides = direct.setdefault((min(me, peer), max(me, peer)), {})
                    sides.setdefault(me, []).append(generation)
                elif remote_type == REMOTE_SWITCH:
                    switch_links[me] = switch_links.get(me, 0) + 1
            generations = [g for _, _, g in probe.nvlinks if g]
            if generations:
                probe.gpu = replace(
                    probe.gpu,
                    nvlink_generation=min(generations),
                    nvlinks_active=len(probe.nvlinks),
                    nvlink_link_gbps=self._nvlink_rate(probe.handle),
                )
        pairs: dict[tuple[int, int], PairFacts] = {}
        for first in probes:
            for second in probes:
                a, b = first.gpu.index, second.gpu.index
                if a >= b:
                    continue
                facts = PairFacts(nvswitch=False)
                if first.handle is not None and second.handle is not None:
                    level = self._query(
                        notes,
                        f"GPU{a}-GPU{b} PCIe path",
                        partial(
                            nvml.nvmlDeviceGetTopologyCommonAncestor, first.handle, second.handle
                        ),
                    )
                    facts.pcie = NVML_TOPOLOGY_LEVELS.get(level) if level is not None else None
                    # Both GPUs report each link; the better-informed side counts.
                    sides = direct.get((a, b), {})
                    gens = max(sides.values(), key=len) if sides else []
                    facts.nvlinks = len(gens)
                    if a in switch_links and b in switch_links:
                        facts.nvswitch = True
                        facts.nvlinks += min(switch_links[a], switch_links[b])
                    known = [g for g in gens if g] or [
                        g for g in (first.gpu.nvlink_generation, second.gpu.nvlink_generation) if g
                    ]
                    facts.nvlink_generation = min(known) if known and facts.nvlinks else None
                    status = self._query(
                        notes,
                        f"GPU{a}-GPU{b} peer access",
                        partial(nvml.nvmlDeviceGetP2PStatus, first.handle, second.handle, P2P_READ),
                    )
                    if status is not None:
                        facts.peer_access = peer_access_of(NVML_P2P_CODE.get(int(status), "U"))
                pairs[(a, b)] = facts
        return pairs

    def _cuda_version(self) -> str | None:
        try:
            version = int(self.nvml.nvmlSystemGetCudaDriverVersion())
        except self.nvml.NVMLError:
            return None
        return f"{version // 1000}.{version % 1000 // 10}"


def _cpus_from_mask(words: Any) -> list[int]:
    """NVML's CPU affinity: an array of 64-bit words, bit i of word w = CPU 64*w + i."""
    cpus = []
    for word_index, word in enumerate(words):
        value = int(word)
        bit = 0
        while value:
            if value & 1:
                cpus.append(64 * word_index + bit)
            value >>= 1
            bit += 1
    return cpus


def _numa_nodes(
    bus_id: str | None,
    cpus: list[int],
    reported: int | None,
    nodes: Callable[[], list[NumaNode]],
) -> tuple[int | None, int | None]:
    """(the GPU's nearest CPU node, the node of its own memory) from what each source means.
    ``nvmlDeviceGetNumaNodeId`` (``reported``) is the node of the GPU's own memory on coherent
    hosts (Grace: a node without CPUs) and NOT_SUPPORTED on x86; the CPU side is the kernel's
    (sysfs) or the node of the GPU's CPU affinity, NVML's answer only when neither tells. The
    GPU's own node is kept where it differs from the CPU side
    (tests/test_nvml_mock.py::test_discovery_through_nvml_matches_the_profile, its Grace case)."""
    numa = _sysfs_numa_node(bus_id)
    if numa is None and cpus:
        numa = _node_of_cpus(cpus, nodes)
    if numa is None:
        numa = reported
    return numa, reported if reported is not None and reported != numa else None


def _node_of_cpus(cpus: list[int], nodes: Callable[[], list[NumaNode]]) -> int | None:
    """The NUMA node of ``nodes()`` (this machine's) holding most of ``cpus`` (None: no node
    holds any)."""
    wanted = set(cpus)
    best, most = None, 0
    for node in nodes():
        held = len(wanted.intersection(node.cpus))
        if held > most:
            best, most = node.id, held
    return best


def _sysfs_numa_node(bus_id: str | None) -> int | None:
    """The kernel's view (``/sys/bus/pci/devices/<bdf>/numa_node``); -1 means none."""
    if not bus_id:
        return None
    domain, _, rest = bus_id.partition(":")
    path = SYSFS_PCI_DEVICES / f"{int(domain, 16):04x}:{rest.lower()}" / "numa_node"
    try:
        node = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


_NO_INSTANCE = 0xFFFFFFFF
"""What NVML reports as the GPU/compute instance of a process on a GPU not in MIG mode."""


def _instance_id(value: object) -> int | None:
    """NVML's ``gpuInstanceId`` / ``computeInstanceId``: None off MIG (or when absent)."""
    return value if isinstance(value, int) and 0 <= value < _NO_INSTANCE else None
