"""The GPUs' links as they are now, for ``gpualloc doctor``: which NVLink
ports are up and at which generation, at which PCIe generation and width each GPU runs, and
whether peer-to-peer access works between two GPUs.

The topology says what the links *should* be (NV4, PCIe x16); this says what they *are*: a
link that trained down (a GPU at x8 in an x16 slot, a dead NVLink lane, a bridge off) or a
sharing layer that turned peer-to-peer off keeps a job correct but slow, and nothing else
tells. From NVML (``nvmlDeviceGetNvLinkState``, ``nvmlDeviceGetCurrPcieLinkWidth`` and
``...Generation``, ``nvmlDeviceGetP2PStatus``), else from nvidia-smi (``nvlink -s``,
``topo -p2p r``, ``--query-gpu=pcie.link.*``).
"""

from __future__ import annotations

import contextlib
import csv
import io
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from msgspec import Struct, field

from gpualloc.discovery.p2p_codes import (  # noqa: F401 - parse_p2p_matrix is used from here
    NVML_P2P_CODE,
    P2P_MEANING,
    P2P_NVLINK,
    P2P_READ,
    parse_p2p_matrix,
)
from gpualloc.errors import DiscoveryError

if TYPE_CHECKING:
    from gpualloc.discovery.nvml import NvmlSession
    from gpualloc.model.topology import Topology


class Port(Struct, frozen=True):
    """One NVLink port of a GPU."""

    link: int
    active: bool
    remote_bus_id: str | None = None
    """The PCI bus id at the other end (a GPU's, or an NVSwitch's), when active."""
    generation: int | None = None
    """The NVLink generation the port runs at (NVML's link version, translated)."""


class GpuLinks(Struct):
    """One GPU's links now; None where the source cannot say."""

    gpu: int
    ports: list[Port] | None = None
    """Every NVLink port the GPU has (None: NVLink state unknown; empty: none)."""
    pcie_generation: int | None = None
    pcie_generation_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None


class LinksNow(Struct):
    gpus: dict[int, GpuLinks] = field(default_factory=dict)
    p2p: dict[tuple[int, int], str] = field(default_factory=dict)
    """(GPU a, GPU b), a < b -> the peer-to-peer read status code (``OK``, ``GNS``, ...)."""
    p2p_nvlink: dict[tuple[int, int], str] = field(default_factory=dict)
    """The same over NVLink (NVML only), for pairs the topology links by NVLink."""
    source: str = "none"
    notes: list[str] = field(default_factory=list)


def read_links(topology: Topology, pairs: Iterable[tuple[int, int]]) -> LinksNow:
    """The links of this host's GPUs now, and peer-to-peer for ``pairs``: NVML, else
    nvidia-smi, else nothing (with a note)."""
    from gpualloc.discovery.nvml import NvmlSession

    pairs = sorted({(min(a, b), max(a, b)) for a, b in pairs})
    problems: list[str] = []
    try:
        with NvmlSession() as session:
            return links_from_nvml(session, topology, pairs)
    except DiscoveryError as problem:
        problems.append(str(problem))
    try:
        return _links_from_nvidia_smi(topology)
    except DiscoveryError as problem:
        problems.append(str(problem))
    return LinksNow(notes=[f"cannot read the GPUs' links ({'; '.join(problems)})"])


# ---- NVML ------------------------------------------------------------------------------------


def links_from_nvml(
    session: NvmlSession, topology: Topology, pairs: list[tuple[int, int]]
) -> LinksNow:
    from gpualloc.discovery.nvml import NVLINK_VERSION_TO_GENERATION, normalise_bus_id

    nvml = session.nvml
    handles = _handles(session, topology)
    now = LinksNow(source="nvml")

    def ask(call: Any) -> Any:
        try:
            return call()
        except (nvml.NVMLError, AttributeError):
            return None

    for gpu, handle in handles.items():
        links = GpuLinks(gpu)
        links.pcie_generation = ask(lambda h=handle: nvml.nvmlDeviceGetCurrPcieLinkGeneration(h))
        links.pcie_generation_max = ask(lambda h=handle: nvml.nvmlDeviceGetMaxPcieLinkGeneration(h))
        links.pcie_width = ask(lambda h=handle: nvml.nvmlDeviceGetCurrPcieLinkWidth(h))
        links.pcie_width_max = ask(lambda h=handle: nvml.nvmlDeviceGetMaxPcieLinkWidth(h))
        ports: list[Port] = []
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            try:
                active = bool(nvml.nvmlDeviceGetNvLinkState(handle, link))
            except nvml.NVMLError:
                break  # NotSupported: no NVLink; InvalidArgument: past this GPU's last port
            if not active:
                ports.append(Port(link, False))
                continue
            remote = ask(lambda h=handle, k=link: nvml.nvmlDeviceGetNvLinkRemotePciInfo(h, k))
            version = ask(lambda h=handle, k=link: nvml.nvmlDeviceGetNvLinkVersion(h, k))
            ports.append(
                Port(
                    link,
                    True,
                    normalise_bus_id(remote.busId) if remote is not None else None,
                    NVLINK_VERSION_TO_GENERATION.get(version) if version else None,
                )
            )
        links.ports = ports
        now.gpus[gpu] = links
    nvlinked = {(link.a, link.b) for link in topology.links if link.nvlinks}
    for a, b in pairs:
        if a not in handles or b not in handles:
            continue
        first, second = handles[a], handles[b]
        for index, found in ((P2P_READ, now.p2p), (P2P_NVLINK, now.p2p_nvlink)):
            if index == P2P_NVLINK and (a, b) not in nvlinked:
                continue
            status = ask(lambda i=index, x=first, y=second: nvml.nvmlDeviceGetP2PStatus(x, y, i))
            if status is not None:
                found[(a, b)] = NVML_P2P_CODE.get(int(status), "U")
    return now


def _handles(session: NvmlSession, topology: Topology) -> dict[int, Any]:
    """Topology GPU index -> NVML handle (matched by UUID, else by index)."""
    from gpualloc.discovery.text import text_of

    nvml = session.nvml
    by_uuid: dict[str, Any] = {}
    by_index: dict[int, Any] = {}
    for index in range(session.device_count()):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except nvml.NVMLError:
            continue
        by_index[index] = handle
        with contextlib.suppress(nvml.NVMLError):
            by_uuid[text_of(nvml.nvmlDeviceGetUUID(handle)) or ""] = handle
    found = {}
    for gpu in topology.gpus:
        handle = by_uuid.get(gpu.uuid or "\0", by_index.get(gpu.index))
        if handle is not None:
            found[gpu.index] = handle
    return found


# ---- nvidia-smi ------------------------------------------------------------------------------


def _links_from_nvidia_smi(topology: Topology) -> LinksNow:
    from gpualloc.discovery.nvlink_status import parse_nvlink_status
    from gpualloc.discovery.smi import run_nvidia_smi

    now = LinksNow(source="nvidia-smi")
    query = (
        "index,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max"
    )
    for row in parse_pcie_query(run_nvidia_smi(f"--query-gpu={query}", "--format=csv,noheader")):
        if row.gpu < topology.gpu_count:
            now.gpus[row.gpu] = row
    try:
        for status in parse_nvlink_status(run_nvidia_smi("nvlink", "-s")):
            if status.index in now.gpus:
                now.gpus[status.index].ports = [
                    Port(link, rate is not None) for link, rate in sorted(status.links.items())
                ]
    except DiscoveryError as problem:
        now.notes.append(f"NVLink state unknown: {problem}")
    try:
        now.p2p = parse_p2p_matrix(run_nvidia_smi("topo", "-p2p", "r"))
    except DiscoveryError as problem:
        now.notes.append(f"peer-to-peer state unknown: {problem}")
    return now


def parse_pcie_query(text: str) -> list[GpuLinks]:
    """``nvidia-smi --query-gpu=index,pcie.link.gen.current,pcie.link.gen.max,
    pcie.link.width.current,pcie.link.width.max --format=csv,noheader`` ([N/A] where unknown)."""

    def number(cell: str) -> int | None:
        cell = cell.strip()
        return int(cell) if cell.isdigit() else None

    found = []
    for row in csv.reader(io.StringIO(text)):
        if len(row) < 5 or number(row[0]) is None:
            continue
        index, generation, generation_max, width, width_max = (number(c) for c in row[:5])
        assert index is not None
        found.append(GpuLinks(index, None, generation, generation_max, width, width_max))
    return found
