"""Recorded topologies: gpualloc JSON files, and raw ``nvidia-smi`` / ``numactl`` text files."""

from __future__ import annotations

from pathlib import Path

from gpualloc.discovery.numa import parse_numactl_hardware
from gpualloc.discovery.p2p_codes import parse_p2p_matrix
from gpualloc.discovery.smi import topology_from_smi_texts
from gpualloc.errors import TopologyError, TopologyNotFound, TopologyParseError
from gpualloc.model.bandwidth import DEFAULT_BANDWIDTH_TABLE, BandwidthTable
from gpualloc.model.topology import Topology
from gpualloc.user_files import read_user_text, shown_path


def read_text(path: Path, what: str, *, missing: type[TopologyNotFound] | None = None) -> str:
    """Read a recorded text file: a regular file of at most 64 MiB, never blocking (see
    :mod:`gpualloc.user_files`); stray bytes of pasted output become U+FFFD. A file that cannot
    be read is exit 8 whatever it holds; ``missing`` is the error of one that does not exist
    (``--topology``'s own, exit 3)."""
    return read_user_text(path, what, missing=missing, replace_bad_bytes=True)


def looks_like_json(text: str) -> bool:
    return text.lstrip().startswith("{")


def load_topology_file(path: Path, *, table: BandwidthTable | None = None) -> Topology:
    """A gpualloc topology JSON file, or raw ``nvidia-smi topo -m`` text, from ``path``."""
    text = read_text(path, "topology file", missing=TopologyNotFound)
    if not text.strip():
        raise TopologyError(
            f"topology file {shown_path(path)} is empty",
            hint="record one with 'gpualloc topo record -o FILE' or 'nvidia-smi topo -m > FILE'",
        )
    if path.suffix == ".json" and not looks_like_json(text):
        raise TopologyError(
            f"topology file {shown_path(path)} is not a JSON object (it does not start with '{{')",
            hint="a .json topology is what 'gpualloc topo record' writes; name 'nvidia-smi "
            "topo -m' text anything but .json",
        )
    if looks_like_json(text):
        topology = Topology.from_json(text, origin=str(path), declared_numa=True)
        return topology.with_bandwidth_table(table) if table is not None else topology
    return topology_from_smi_texts(
        text, origin=str(path), table=table or DEFAULT_BANDWIDTH_TABLE, name=path.stem
    )


def import_smi_files(
    topo_path: Path,
    *,
    nvlink_path: Path | None = None,
    numa_path: Path | None = None,
    p2p_path: Path | None = None,
    table: BandwidthTable | None = None,
    name: str | None = None,
) -> Topology:
    """``gpualloc topo import``: recorded ``topo -m`` text plus optional companion files."""
    p2p_text = read_text(p2p_path, "topo -p2p file") if p2p_path else None
    topology = import_smi_texts(
        read_text(topo_path, "topo -m file"),
        nvlink_text=read_text(nvlink_path, "nvlink file") if nvlink_path else None,
        p2p_text=p2p_text,
        numa_text=read_text(numa_path, "numactl file") if numa_path else None,
        origin=str(topo_path),
        numa_origin=str(numa_path) if numa_path else None,
        table=table,
        name=name or topo_path.stem,
    )
    if p2p_text is not None and topology.gpu_count > 1 and not parse_p2p_matrix(p2p_text):
        raise TopologyParseError(  # a --p2p file without a matrix is a mistake, not no peer access
            "no 'nvidia-smi topo -p2p r' matrix in it (rows such as 'GPU0 X OK')",
            source=str(p2p_path),
            hint="give --p2p the output of 'nvidia-smi topo -p2p r' saved to a file",
        )
    return topology


def import_smi_texts(
    topo_text: str,
    *,
    nvlink_text: str | None = None,
    numa_text: str | None = None,
    origin: str | None = None,
    numa_origin: str | None = None,
    table: BandwidthTable | None = None,
    name: str | None = None,
    p2p_text: str | None = None,
) -> Topology:
    """Recorded texts to a topology (the file-less core of :func:`import_smi_files`)."""
    numa_nodes = parse_numactl_hardware(numa_text, source=numa_origin) if numa_text else None
    return topology_from_smi_texts(
        topo_text,
        nvlink_text=nvlink_text,
        p2p_text=p2p_text,
        numa_nodes=numa_nodes,
        origin=origin,
        table=table or DEFAULT_BANDWIDTH_TABLE,
        name=name,
    )
