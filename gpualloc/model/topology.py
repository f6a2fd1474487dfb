"""The host topology: GPUs, the link between every pair of them, NUMA nodes, and provenance.

This is the contract every later capability consumes (placement, ledger, launcher, simulator,
Slurm). It is pure data: no I/O beyond JSON text, no discovery. ``--json`` output is
``Topology.to_json()``; the documented keys (``gpus[].index/uuid/pci_bus_id/name/numa_node/
cpu_affinity`` and ``links[].a/b/kind/nvlinks/pcie/bandwidth_gbps``) are stable.
"""

import json
from collections.abc import Iterable
from datetime import datetime
from enum import Enum
from typing import TYPE_CHECKING, Any, Literal

from msgspec import Struct, field
from msgspec.structs import replace

from gpualloc.errors import SchemaVersionError, TopologyError
from gpualloc.model.bandwidth import (
    DEFAULT_BANDWIDTH_TABLE,
    BandwidthTable,
    estimate_link_bandwidth_gbps,
)
from gpualloc.model.catalog import family_of
from gpualloc.model.mig import MigInstance, check_mig_layout, mig_label
from gpualloc.model.paths import PciePath
from gpualloc.model.printable import count_of
from gpualloc.model.validation import (
    NonNegativeFloat,
    NonNegativeInt,
    Percent,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    describe_validation_error,
    from_builtins,
    to_builtins,
)

if TYPE_CHECKING:
    import networkx

SCHEMA_VERSION = 4
"""Version of the topology file format. Bump it, and add a migration, on any breaking change.
2 added ``mig_instances``; a version 1 file reads as a host without MIG instances. 3 added
``Link.peer_access``, 4 ``Gpu.mig_pending`` and ``Gpu.serial`` (older files read without
them)."""


class Health(str, Enum):
    """Whether a GPU answered discovery."""

    OK = "ok"
    LOST = "lost"
    """NVML reported the GPU lost (fell off the bus); it must not be placed on."""
    UNKNOWN = "unknown"
    """A recorded source cannot tell."""


class _Strict(Struct, kw_only=True, forbid_unknown_fields=True):
    """A document part: unknown fields are refused, fields are passed by name."""


class _StrictFrozen(Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """A document part that never changes once read (its own base: type checkers hold msgspec's
    structs to the dataclasses' rule that a frozen class derives from frozen ones only)."""


class Gpu(_Strict, kw_only=True):
    """One physical GPU as NVML numbers it (``CUDA_DEVICE_ORDER=PCI_BUS_ID`` order)."""

    index: NonNegativeInt
    """NVML index, equal to the CUDA index in PCI_BUS_ID order."""
    uuid: str | None = None
    pci_bus_id: str | None = None
    """E.g. ``00000000:07:00.0``."""
    name: str | None = None
    serial: str | None = None
    """The board's serial number (``nvmlDeviceGetSerial``; printed on the board): with the bus id
    and UUID, what tells an administrator which card to pull."""
    minor_number: NonNegativeInt | None = None
    """N of the device file /dev/nvidiaN (NVML's minor number)."""
    memory_total_bytes: NonNegativeInt | None = None
    numa_node: int | None = None
    """The one NUMA node nearest the GPU; None when unknown or ambiguous."""
    numa_affinity: list[int] = field(default_factory=list)
    """Every NUMA node nvidia-smi lists as near (VMs list ranges)."""
    cpu_affinity: list[int] = field(default_factory=list)
    """Ids of the CPUs near the GPU."""
    gpu_numa_node: int | None = None
    """NUMA node of the GPU's own memory (coherent hosts: Grace, POWER9)."""
    mig_enabled: bool | None = None
    """MIG mode now."""
    mig_pending: bool | None = None
    """MIG mode after the next GPU reset (NVML's pending mode): where it differs from
    :attr:`mig_enabled`, an administrator switched it on a GPU that could not be reset."""
    health: Health = Health.OK
    pcie_generation: PositiveInt | None = None
    pcie_width: PositiveInt | None = None
    nvlink_generation: PositiveInt | None = None
    nvlink_link_gbps: PositiveFloat | None = None
    """Per-link NVLink rate reported by the driver (nvlink -s)."""
    nvlinks_active: NonNegativeInt | None = None
    """Active NVLinks of this GPU."""

    def __post_init__(self) -> None:
        self.cpu_affinity = sorted(set(self.cpu_affinity))
        self.numa_affinity = sorted(set(self.numa_affinity))

    def identity(self) -> str:
        """Which card this is, in words: ``bus 00000000:4E:00.0, UUID GPU-..., serial ...``
        (what is known of them)."""
        parts = [
            f"{label} {value}"
            for label, value in (
                ("bus", self.pci_bus_id),
                ("UUID", self.uuid),
                ("serial", self.serial),
            )
            if value
        ]
        return ", ".join(parts) if parts else "bus id, UUID and serial unknown"


class Link(_Strict, kw_only=True):
    """What connects GPUs ``a < b``: the PCIe path, NVLinks, an NVSwitch, and the bandwidth."""

    a: NonNegativeInt
    b: NonNegativeInt
    pcie: PciePath | None = None
    """PCIe path class; None when unknown."""
    nvlinks: NonNegativeInt = 0
    """NVLinks bonded between the pair (NV# in topo -m)."""
    nvlink_generation: PositiveInt | None = None
    nvswitch: bool = False
    """The NVLinks run through an NVSwitch fabric."""
    peer_access: bool | None = None
    """Whether the driver grants peer-to-peer access between the pair (NVML's P2P read status,
    ``nvidia-smi topo -p2p r``); None when not read. Without it copies go through host memory."""
    bandwidth_gbps: NonNegativeFloat
    """Estimated (or measured) one-direction bandwidth, GB/s."""

    def __post_init__(self) -> None:
        if self.a >= self.b:
            raise ValueError(f"link endpoints must satisfy a < b, got a={self.a}, b={self.b}")

    @property
    def kind(self) -> str:
        """``NV<n>`` when NVLinked, else the PCIe class, else ``UNKNOWN``."""
        if self.nvlinks:
            return f"NV{self.nvlinks}"
        return self.pcie.value if self.pcie else "UNKNOWN"

    def to_json_dict(self) -> dict[str, Any]:
        """The link's fields and its derived ``kind`` (which reading ignores)."""
        return {**to_builtins(self), "kind": self.kind}


class NumaNode(_Strict, kw_only=True):
    """A NUMA node; GPU-memory nodes of coherent hosts have no CPUs."""

    id: NonNegativeInt
    cpus: list[int] = field(default_factory=list)
    memory_total_bytes: NonNegativeInt | None = None
    distances: dict[int, int] = field(default_factory=dict)
    """SLIT distance to each node id (10 = local)."""

    def __post_init__(self) -> None:
        self.cpus = sorted(set(self.cpus))


class GpuProcess(_StrictFrozen, kw_only=True, frozen=True):
    """A compute process running on a GPU, as NVML's running-process list reports it.

    On a live host gpualloc asks NVML each time; a recorded or bundled topology may declare such
    processes (``processes`` in its file), so that GPUs busy outside gpualloc can be tested
    without a GPU.
    """

    gpu: NonNegativeInt
    """Index of the GPU the process runs on."""
    pid: PositiveInt
    name: str | None = None
    """The process's command name."""
    user: str | None = None
    """The user running it, when known."""
    used_memory_bytes: NonNegativeInt | None = None
    gpu_instance: NonNegativeInt | None = None
    """On a GPU in MIG mode: the GPU instance (GI) the process runs in (NVML's
    ``gpuInstanceId``); with ``compute_instance`` it names the MIG device."""
    compute_instance: NonNegativeInt | None = None


FaultKind = Literal["lost", "ecc", "retired-pages", "remapped-rows", "xid"]


class GpuFault(_StrictFrozen, kw_only=True, frozen=True):
    """Something wrong with a GPU that makes gpualloc stop handing it out:
    it fell off the bus, has uncorrectable ECC errors, pages or rows waiting for a reset, or
    logged a critical Xid error. A live host is asked each time; a recorded or bundled topology
    may declare faults (``faults`` in its file), so that all of this is testable without a
    GPU."""

    gpu: NonNegativeInt
    kind: FaultKind
    detail: str
    """What was seen, for people: ``12 uncorrectable ECC errors since the driver loaded``."""


class GpuUtilization(_StrictFrozen, kw_only=True, frozen=True):
    """How busy a GPU's compute is, as NVML's ``nvmlDeviceGetUtilizationRates`` reports it:
    the percent of its last sample period (1/6 s to 1 s) during which a kernel ran. A live host
    is asked each time; a recorded or bundled topology may declare it (``utilization`` in its
    file), so that idle leases can be shown and tested without a GPU."""

    gpu: NonNegativeInt
    percent: Percent


def faults_by_gpu(faults: Iterable[GpuFault]) -> dict[int, str]:
    """GPU index -> its faults in words, joined with ``; ``."""
    found: dict[int, list[str]] = {}
    for fault in faults:
        found.setdefault(fault.gpu, []).append(fault.detail)
    return {gpu: "; ".join(details) for gpu, details in found.items()}


Source = Literal["nvml", "nvidia-smi", "file", "bundled"]


class Provenance(_Strict, kw_only=True):
    """Where a topology came from, and what could not be read."""

    source: Source
    origin: str | None = None
    """File path, bundled name, or command."""
    hostname: str | None = None
    machine_id: str | None = None
    """The recording host's ``/etc/machine-id``: with it, a recording describes this host only
    where the ids match (host names repeat across machines)."""
    captured_at: datetime | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    description: str | None = None
    """For bundled and recorded files: what and whence."""
    notes: list[str] = field(default_factory=list)
    """Fields that could not be read."""
    bandwidth: Literal["estimated", "measured"] = "estimated"
    """Link bandwidths estimated from the bandwidth table, or measured ('topo import
    --bandwidth-matrix'); measured ones are never re-estimated."""


class Topology(_Strict, kw_only=True):
    """A multi-GPU host. Links are complete: one per unordered GPU pair, sorted by (a, b).

    Built in code (discovery), it is checked by :meth:`validated`; read from JSON, by
    :meth:`from_json_dict`. Both refuse what :meth:`__post_init__` and the field types refuse.
    """

    schema_version: int = SCHEMA_VERSION
    name: str | None = None
    gpus: list[Gpu]
    links: list[Link] = field(default_factory=list)
    numa_nodes: list[NumaNode] = field(default_factory=list)
    provenance: Provenance
    processes: list[GpuProcess] = field(default_factory=list)
    """Compute processes declared on the GPUs (recorded files only; a live host is asked each
    time)."""
    mig_instances: list[MigInstance] = field(default_factory=list)
    """The MIG devices of the GPUs with MIG enabled, sorted by (parent GPU, device index)."""
    faults: list[GpuFault] = field(default_factory=list)
    """Faults declared on the GPUs (recorded files only; a live host is asked each time)."""
    utilization: list[GpuUtilization] = field(default_factory=list)
    """GPU utilisation declared (recorded files only; a live host is asked each time)."""

    def __post_init__(self) -> None:
        indices = [g.index for g in self.gpus]
        if indices != list(range(len(indices))):
            position = next(i for i, index in enumerate(indices) if index != i)
            raise ValueError(
                f"GPU indices must be 0..{len(indices) - 1} in order; GPU number {position + 1} "
                f"in the list has index {indices[position]}, not {position}"
            )
        strays = [p.gpu for p in self.processes if p.gpu >= len(indices)]
        strays += [f.gpu for f in self.faults if f.gpu >= len(indices)]
        strays += [u.gpu for u in self.utilization if u.gpu >= len(indices)]
        if strays:
            raise ValueError(
                f"a process, fault or utilization is on GPU {strays[0]}, which does not exist"
            )
        self.links.sort(key=lambda link: (link.a, link.b))
        pairs = [(link.a, link.b) for link in self.links]
        expected = [(a, b) for a in indices for b in indices if a < b]
        if pairs != expected:
            missing = sorted(set(expected) - set(pairs))
            extra = sorted(set(pairs) - set(expected))
            dup = len(pairs) - len(set(pairs))
            raise ValueError(
                "links must cover every GPU pair exactly once"
                + (f"; missing {missing[:4]}" if missing else "")
                + (f"; unknown pairs {extra[:4]}" if extra else "")
                + (f"; {dup} duplicated" if dup else "")
            )
        check_mig_layout(self.mig_instances, len(indices))
        self.mig_instances.sort(key=lambda m: (m.gpu, m.device))
        for instance in self.mig_instances:
            if self.gpus[instance.gpu].mig_enabled is False:
                raise ValueError(
                    f"MIG device {instance.label} is on GPU {instance.gpu}, whose MIG mode is off"
                )
        node_ids = [n.id for n in self.numa_nodes]
        if len(set(node_ids)) != len(node_ids):
            raise ValueError(f"NUMA node ids repeat: {node_ids}")
        if not self.gpus:
            raise ValueError("a topology has at least one GPU; this one lists none")
        self.numa_nodes.sort(key=lambda n: n.id)

    # ---- lookups -------------------------------------------------------------------------

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    def gpu(self, index: int) -> Gpu:
        try:
            return self.gpus[index]
        except IndexError:
            raise TopologyError(
                f"GPU {index} does not exist on this host ({count_of(self.gpu_count, 'GPU')})"
            ) from None

    def cuda_ordinals(self) -> dict[int, int]:
        """GPU index -> the number CUDA gives that GPU under ``CUDA_DEVICE_ORDER=PCI_BUS_ID``: its
        place in PCI bus-id order. NVML numbers GPUs in its own enumeration order, which is not bus
        order on every host (the L40S profile of NVIDIA's mock NVML enumerates 17:00, 31:00, B1:00,
        CA:00, 18:00, ...): exporting NVML indices there runs jobs on GPUs they do not hold
        (tests/test_nvml_mock.py::test_run_exports_the_gpus_it_leased_by_bus_order). The
        identity where a bus id is unknown (bundled and recorded topologies without them)."""
        keys = [_bus_order_key(gpu.pci_bus_id) for gpu in self.gpus]
        if any(key is None for key in keys):
            return {gpu.index: gpu.index for gpu in self.gpus}
        ranked = sorted(range(len(keys)), key=lambda i: keys[i])  # type: ignore[arg-type,return-value]
        return {self.gpus[i].index: ordinal for ordinal, i in enumerate(ranked)}

    def link(self, a: int, b: int) -> Link:
        """The link between two distinct GPUs, in either order."""
        if a == b:
            raise ValueError("a GPU has no link to itself")
        low, high = min(a, b), max(a, b)
        n = self.gpu_count
        if low < 0 or high >= n:
            raise TopologyError(
                f"GPU pair ({a}, {b}) does not exist on this host ({count_of(n, 'GPU')})"
            )
        # Links are sorted (a, b) over a < b: row `low` starts after the rows above it.
        position = low * n - low * (low + 1) // 2 + (high - low - 1)
        return self.links[position]

    def mig_on(self, gpu: int) -> list[MigInstance]:
        """The MIG devices of one GPU (empty when MIG is off or none is configured)."""
        return [m for m in self.mig_instances if m.gpu == gpu]

    def mig_device(self, gpu: int, device: int) -> MigInstance:
        """MIG device ``device`` of GPU ``gpu`` (TopologyError when the host has none such)."""
        found = next((m for m in self.mig_instances if (m.gpu, m.device) == (gpu, device)), None)
        if found is None:
            raise TopologyError(
                f"this host has no MIG device {mig_label(gpu, device)}",
                hint="'gpualloc topo show' lists the MIG devices",
            )
        return found

    def numa_node(self, node_id: int) -> NumaNode | None:
        return next((n for n in self.numa_nodes if n.id == node_id), None)

    # ---- derived views -------------------------------------------------------------------

    def with_bandwidth_table(self, table: BandwidthTable) -> "Topology":
        """A copy whose link bandwidths are re-estimated with ``table`` (unless measured)."""
        if self.provenance.bandwidth == "measured":
            return self
        links = [
            replace(link, bandwidth_gbps=pair_bandwidth_gbps(self.gpus, link, table))
            for link in self.links
        ]
        return replace(self, links=links)

    def estimated(self, table: BandwidthTable) -> "Topology":
        """A copy whose link bandwidths are all estimated with ``table``, measured or not: what a
        measurement is checked against."""
        provenance = replace(self.provenance, bandwidth="estimated")
        return replace(self, provenance=provenance).with_bandwidth_table(table)

    def to_networkx(self) -> "networkx.Graph[int]":
        """An undirected graph: GPU nodes (with their attributes), one edge per pair.

        Edge attributes are the link's fields plus ``weight`` = bandwidth in GB/s. networkx is
        imported here, not at module level, so that the CLI starts fast (house style habit 9).
        """
        import networkx as nx

        graph: nx.Graph[int] = nx.Graph(name=self.name or "")
        for gpu in self.gpus:
            attributes = to_builtins(gpu)
            del attributes["index"]
            graph.add_node(gpu.index, **attributes)
        for link in self.links:
            attributes = link.to_json_dict()
            del attributes["a"], attributes["b"]
            graph.add_edge(link.a, link.b, weight=link.bandwidth_gbps, **attributes)
        return graph

    # ---- JSON ----------------------------------------------------------------------------

    def to_json_dict(self) -> dict[str, Any]:
        data = to_builtins(self)
        data["links"] = [link.to_json_dict() for link in self.links]
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_json_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json_dict(
        cls, data: Any, *, origin: str = "<json>", declared_numa: bool = False
    ) -> "Topology":
        """Validate a parsed JSON document; errors name the file and the offending field.
        ``declared_numa``: a user's file, whose GPUs must be on NUMA nodes it declares."""
        if not isinstance(data, dict):
            raise TopologyError(f"{origin}: a topology file holds a JSON object")
        version = data.get("schema_version")
        if not isinstance(version, int):
            raise TopologyError(
                f"{origin}: no integer schema_version; not a gpualloc topology file",
                hint="create one with 'gpualloc topo record' or 'gpualloc topo import'",
            )
        if version > SCHEMA_VERSION:
            raise SchemaVersionError(
                f"{origin} has schema_version {version}; this gpualloc reads up to "
                f"{SCHEMA_VERSION}",
                hint="upgrade gpualloc (pip install -U gpualloc)",
            )
        links = data.get("links")
        if isinstance(links, list):  # ``kind`` is derived: to_json() writes it, reading drops it
            data = {**data, "links": [_without_kind(link) for link in links]}
        try:
            topology = from_builtins(data, cls)
        except ValidationError as exc:
            raise TopologyError(f"{origin}: {describe_validation_error(exc)}") from exc
        if declared_numa:
            topology._check_declared_numa(origin)
        return topology

    def _check_declared_numa(self, origin: str) -> None:
        """A topology file's GPUs are on NUMA nodes it declares: a GPU on
        another would be bound to CPUs and memory nobody described. None declared: unknown,
        not checked. Not asked of a live host, whose sysfs may show a container fewer nodes
        than its GPUs name."""
        declared = {node.id for node in self.numa_nodes}
        stray = [g for g in self.gpus if declared and g.numa_node not in (None, *declared)]
        if stray:
            raise TopologyError(
                f"{origin}: GPU {stray[0].index} is on NUMA node {stray[0].numa_node}, which "
                f"numa_nodes does not declare (it declares {sorted(declared)})",
                hint="fix the GPU's numa_node, or add the node to numa_nodes",
            )

    def validated(self) -> "Topology":
        """This topology, built in code, checked as if read from its JSON (types, ranges)."""
        return Topology.from_json_dict(self.to_json_dict(), origin="discovered topology")

    @classmethod
    def from_json(
        cls, text: str, *, origin: str = "<json>", declared_numa: bool = False
    ) -> "Topology":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TopologyError(
                f"{origin}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
                hint="a topology file is what 'gpualloc topo record' or 'topo show --json' "
                "writes, or 'nvidia-smi topo -m' text",
            ) from exc
        return cls.from_json_dict(data, origin=origin, declared_numa=declared_numa)


def _without_kind(link: Any) -> Any:
    if isinstance(link, dict) and "kind" in link:
        return {key: value for key, value in link.items() if key != "kind"}
    return link


def _per_link_rate(gpu: Gpu, table: BandwidthTable) -> float | None:
    """The driver-reported NVLink rate, else the table's rate for the GPU's architecture."""
    if gpu.nvlink_link_gbps:
        return gpu.nvlink_link_gbps
    family = family_of(gpu.name)
    return table.nvlink_link_gbps_by_architecture.get(family.architecture) if family else None


def pair_bandwidth_gbps(
    gpus: list[Gpu], link: Link, table: BandwidthTable = DEFAULT_BANDWIDTH_TABLE
) -> float:
    """Estimate a link's bandwidth from the two GPUs' facts and ``table``."""
    first, second = gpus[link.a], gpus[link.b]
    rates = [rate for g in (first, second) if (rate := _per_link_rate(g, table))]
    generations = [g.pcie_generation for g in (first, second) if g.pcie_generation]
    widths = [g.pcie_width for g in (first, second) if g.pcie_width]
    return estimate_link_bandwidth_gbps(
        nvlinks=link.nvlinks,
        nvlink_generation=link.nvlink_generation,
        nvlink_link_gbps=min(rates) if rates else None,
        pcie=link.pcie,
        pcie_generation=min(generations) if generations else None,
        pcie_width=min(widths) if widths else None,
        peer_access=link.peer_access,
        table=table,
    )


def _bus_order_key(bus_id: str | None) -> tuple[int, ...] | None:
    """``0000:17:00.0`` (any domain width) as numbers to sort by; None if it is not one."""
    if not bus_id:
        return None
    parts = bus_id.strip().replace(".", ":").split(":")
    if len(parts) == 3:
        parts.insert(0, "0")
    try:
        return tuple(int(part, 16) for part in parts) if len(parts) == 4 else None
    except ValueError:
        return None
