"""The nvidia-smi source: run nvidia-smi, and turn its texts into a topology.

``topology_from_smi_texts`` is pure and serves both the live fallback (NVML absent) and
``gpualloc topo import`` of recorded text. ``topo -m`` gives the PCIe classes, NVLink counts and
affinities; ``nvlink -s`` adds GPU names, UUIDs and per-link rates; ``--query-gpu`` adds bus ids,
memory, MIG mode and PCIe links; ``numactl -H`` adds the NUMA nodes. Only ``topo -m`` is required.
"""

from __future__ import annotations

import csv
import io
from datetime import datetime, timezone

from msgspec import Struct
from msgspec.structs import replace

from gpualloc import boot
from gpualloc.discovery.assemble import PairFacts, assemble_topology
from gpualloc.discovery.nvlink_status import NvlinkGpuStatus, parse_nvlink_status
from gpualloc.discovery.p2p_codes import parse_p2p_matrix, peer_access_of
from gpualloc.discovery.topo_matrix import TopoMatrix, parse_topo_matrix
from gpualloc.errors import DiscoveryError, DiscoveryUnavailable, TopologyParseError
from gpualloc.model.bandwidth import DEFAULT_BANDWIDTH_TABLE, BandwidthTable
from gpualloc.model.cpuset import parse_cpulist
from gpualloc.model.paths import PciePath
from gpualloc.model.printable import count_of
from gpualloc.model.topology import Gpu, Health, NumaNode, Provenance, Source, Topology

QUERY_FIELDS = (
    "index",
    "uuid",
    "pci.bus_id",
    "name",
    "serial",
    "memory.total",
    "mig.mode.current",
    "mig.mode.pending",
    "pcie.link.gen.max",
    "pcie.link.width.max",
    "driver_version",
)
_MIB = 1024 * 1024


class QueriedGpu(Struct):
    """One row of ``nvidia-smi --query-gpu`` (fields nvidia-smi could not read are None)."""

    index: int
    uuid: str | None
    pci_bus_id: str | None
    name: str | None
    serial: str | None
    memory_total_bytes: int | None
    mig_enabled: bool | None
    mig_pending: bool | None
    """MIG mode after the next GPU reset (``mig.mode.pending``)."""
    pcie_generation: int | None
    pcie_width: int | None
    driver_version: str | None


def topology_from_smi_texts(
    topo_text: str,
    *,
    nvlink_text: str | None = None,
    numa_nodes: list[NumaNode] | None = None,
    queried: list[QueriedGpu] | None = None,
    source: Source = "file",
    origin: str | None = None,
    table: BandwidthTable = DEFAULT_BANDWIDTH_TABLE,
    name: str | None = None,
    hostname: str | None = None,
    driver_version: str | None = None,
    p2p_text: str | None = None,
) -> Topology:
    """Build a topology from ``nvidia-smi topo -m`` text and, optionally, its companions.

    Peer access comes from ``nvidia-smi topo -p2p r`` (``p2p_text``, or such a matrix pasted
    below the ``topo -m`` one in ``topo_text``)."""
    matrix = parse_topo_matrix(topo_text, source=origin)
    notes = list(matrix.notes)
    statuses = parse_nvlink_status(nvlink_text, source="nvlink -s") if nvlink_text else []
    _check_counts(matrix, statuses, queried)
    gpus = [_gpu_from_row(matrix, index, notes) for index in range(matrix.gpu_count)]
    gpus = [_merge_nvlink_status(gpu, statuses, notes) for gpu in gpus]
    gpus = [_merge_query(gpu, queried or []) for gpu in gpus]
    if queried and not driver_version:
        driver_version = queried[0].driver_version
    if not queried:
        notes.append("GPU bus ids, memory sizes and MIG modes unknown (topo -m does not show them)")
    provenance = Provenance(
        source=source,
        origin=origin,
        hostname=hostname,
        machine_id=boot.machine_id() if source == "nvidia-smi" else None,
        captured_at=datetime.now(timezone.utc) if source == "nvidia-smi" else None,
        driver_version=driver_version,
        notes=notes,
    )
    pairs = _pairs_from_matrix(matrix)
    for pair, code in parse_p2p_matrix(p2p_text or topo_text).items():
        if pair in pairs:
            pairs[pair].peer_access = peer_access_of(code)
    return assemble_topology(
        gpus=gpus,
        pairs=pairs,
        numa_nodes=numa_nodes or [],
        provenance=provenance,
        table=table,
        name=name,
    )


def _check_counts(
    matrix: TopoMatrix, statuses: list[NvlinkGpuStatus], queried: list[QueriedGpu] | None
) -> None:
    for status in statuses:
        if status.index >= matrix.gpu_count:
            raise TopologyParseError(
                f"'nvlink -s' describes GPU {status.index} but 'topo -m' shows "
                f"{count_of(matrix.gpu_count, 'GPU')}; are the two files from the same host?"
            )
    if queried is not None and len(queried) != matrix.gpu_count:
        raise DiscoveryError(
            f"nvidia-smi --query-gpu lists {count_of(len(queried), 'GPU')} but topo -m shows "
            f"{matrix.gpu_count}"
        )


def _gpu_from_row(matrix: TopoMatrix, index: int, notes: list[str]) -> Gpu:
    row = matrix.rows[index]
    cpu_text = row.affinity.get("CPU Affinity", "")
    numa_text = row.affinity.get("NUMA Affinity", "")
    gpu_numa_text = row.affinity.get("GPU NUMA ID", "")
    cpus = parse_cpulist(cpu_text) if cpu_text not in ("", "N/A") else []
    numa = parse_cpulist(numa_text) if numa_text not in ("", "N/A") else []
    if not cpus:
        notes.append(f"GPU{index}: CPU affinity not reported")
    if len(numa) > 1:
        notes.append(f"GPU{index}: NUMA affinity spans nodes {numa_text}; no single nearest node")
    return Gpu(
        index=index,
        numa_node=numa[0] if len(numa) == 1 else None,
        numa_affinity=numa,
        cpu_affinity=cpus,
        gpu_numa_node=int(gpu_numa_text) if gpu_numa_text.isdigit() else None,
        health=Health.UNKNOWN,
    )


def _pairs_from_matrix(matrix: TopoMatrix) -> dict[tuple[int, int], PairFacts]:
    labels = matrix.gpu_labels
    pairs = {}
    for a in range(len(labels)):
        for b in range(a + 1, len(labels)):
            cell = matrix.cell(labels[a], labels[b])
            if cell.startswith("NV"):
                # topo -m hides the PCIe path of NVLinked pairs.
                pairs[(a, b)] = PairFacts(nvlinks=int(cell[2:]))
            else:
                pairs[(a, b)] = PairFacts(pcie=PciePath.from_token(cell))
    return pairs


def _merge_nvlink_status(gpu: Gpu, statuses: list[NvlinkGpuStatus], notes: list[str]) -> Gpu:
    status = next((s for s in statuses if s.index == gpu.index), None)
    if status is None:
        return gpu
    if status.snipped:
        notes.append(f"GPU{gpu.index}: 'nvlink -s' block was cut by its author; link count unknown")
    return replace(
        gpu,
        name=status.name,
        uuid=status.uuid,
        nvlink_link_gbps=status.link_gbps,
        nvlinks_active=None if status.snipped else status.active_links,
    )


def _merge_query(gpu: Gpu, queried: list[QueriedGpu]) -> Gpu:
    row = next((q for q in queried if q.index == gpu.index), None)
    if row is None:
        return gpu
    return replace(
        gpu,
        uuid=row.uuid or gpu.uuid,
        name=row.name or gpu.name,
        serial=row.serial,
        pci_bus_id=row.pci_bus_id,
        memory_total_bytes=row.memory_total_bytes,
        mig_enabled=row.mig_enabled,
        mig_pending=row.mig_pending,
        pcie_generation=row.pcie_generation,
        pcie_width=row.pcie_width,
        health=Health.OK,
    )


# ---- running nvidia-smi ----------------------------------------------------------------------


def run_nvidia_smi(*args: str, timeout_s: float = 60.0) -> str:
    """Run ``nvidia-smi ARGS``; absent binary or driver -> DiscoveryUnavailable."""
    import shutil  # here: reading a recorded topology (doctor) runs no process
    import subprocess

    binary = shutil.which("nvidia-smi")
    if binary is None:
        raise DiscoveryUnavailable("nvidia-smi is not installed (not on PATH)")
    try:
        completed = subprocess.run(
            [binary, *args], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise DiscoveryError(
            f"nvidia-smi {' '.join(args)} did not answer within {timeout_s:.0f} s",
            hint="a GPU may be hung; check 'dmesg' for Xid errors",
        ) from exc
    except OSError as exc:
        raise DiscoveryUnavailable(f"cannot run nvidia-smi: {exc.strerror}") from exc
    if completed.returncode != 0:
        message = (completed.stdout + completed.stderr).strip().splitlines()
        first = message[0] if message else f"exit status {completed.returncode}"
        raise DiscoveryUnavailable(f"nvidia-smi {' '.join(args)} failed: {first}")
    return completed.stdout


def parse_query_gpu_csv(text: str) -> list[QueriedGpu]:
    """Parse ``--query-gpu=<QUERY_FIELDS> --format=csv,noheader,nounits`` output."""
    rows = []
    for number, fields in enumerate(csv.reader(io.StringIO(text)), start=1):
        if not fields:
            continue
        values = [_na(f.strip()) for f in fields]
        if len(values) != len(QUERY_FIELDS) or values[0] is None or not values[0].isdigit():
            raise TopologyParseError(
                f"expected {len(QUERY_FIELDS)} CSV fields ({','.join(QUERY_FIELDS)})",
                line_number=number,
                token=",".join(fields),
                source="nvidia-smi --query-gpu",
            )
        _, uuid, bus, name, serial, memory, mig, pending, gen, width, driver = values
        rows.append(
            QueriedGpu(
                index=int(values[0]),
                uuid=uuid,
                pci_bus_id=bus,
                name=name,
                serial=serial,
                memory_total_bytes=int(float(memory)) * _MIB if memory else None,
                mig_enabled=None if mig is None else mig.lower() == "enabled",
                mig_pending=None if pending is None else pending.lower() == "enabled",
                pcie_generation=int(gen) if gen and gen.isdigit() else None,
                pcie_width=int(width) if width and width.isdigit() else None,
                driver_version=driver,
            )
        )
    return rows


def _na(value: str) -> str | None:
    return None if value in ("", "[N/A]", "N/A", "[Not Supported]", "[Unknown Error]") else value


def query_gpus() -> list[QueriedGpu]:
    text = run_nvidia_smi(f"--query-gpu={','.join(QUERY_FIELDS)}", "--format=csv,noheader,nounits")
    return parse_query_gpu_csv(text)


def discover_with_nvidia_smi(
    *,
    queried: list[QueriedGpu],
    numa_nodes: list[NumaNode],
    table: BandwidthTable = DEFAULT_BANDWIDTH_TABLE,
) -> Topology:
    """This host's topology from nvidia-smi alone (the fallback when NVML cannot be loaded).

    ``queried`` is the caller's ``query_gpus()`` result (it already read it for the cache key).
    """
    topo_text = run_nvidia_smi("topo", "-m")
    notes: list[str] = []
    try:
        nvlink_text: str | None = run_nvidia_smi("nvlink", "-s") or None
    except DiscoveryError as exc:
        nvlink_text = None
        notes.append(f"nvidia-smi nvlink -s failed: {exc}")
    try:
        p2p_text: str | None = run_nvidia_smi("topo", "-p2p", "r") or None
    except DiscoveryError as exc:
        p2p_text = None
        notes.append(f"nvidia-smi topo -p2p r failed: {exc}")
    topology = topology_from_smi_texts(
        topo_text,
        nvlink_text=nvlink_text,
        p2p_text=p2p_text,
        numa_nodes=numa_nodes,
        queried=queried,
        source="nvidia-smi",
        origin="nvidia-smi topo -m",
        table=table,
        hostname=boot.hostname(),
    )
    if any(q.mig_enabled for q in queried):
        topology = _with_live_mig(topology, notes)
    topology.provenance.notes.extend(notes)
    return topology


def list_gpus_text() -> str:
    """``nvidia-smi -L``: GPUs and MIG devices with their UUIDs (cheap; for the cache key)."""
    return run_nvidia_smi("-L")


def _with_live_mig(topology: Topology, notes: list[str]) -> Topology:
    """Add the MIG devices from ``nvidia-smi -L`` and the MIG devices table of ``nvidia-smi``
    (``mig -lgi`` needs root, so placements stay unknown here)."""
    from gpualloc.discovery.mig_text import read_mig_texts, with_mig_layout

    texts = [("nvidia-smi -L", list_gpus_text())]
    try:
        texts.append(("nvidia-smi", run_nvidia_smi()))
    except DiscoveryError as exc:
        notes.append(f"MIG memory unknown: nvidia-smi failed ({exc})")
    try:
        return with_mig_layout(topology, read_mig_texts(texts))
    except TopologyParseError as exc:
        notes.append(f"MIG devices unknown: {exc}")
        return topology
