"""How ``gpualloc topo show`` presents a topology to people."""

from __future__ import annotations

from collections.abc import Callable

from gpualloc.cli.output import STYLE_BY_CLASS, Table
from gpualloc.model.cpuset import format_cpulist
from gpualloc.model.topology import Health, Link, Topology

Cell = tuple[str, str | None]

LEGEND = [  # one entry a line, as nvidia-smi's: each fits an 80-column terminal
    "Legend:",
    "  NV<n>  n NVLinks between the pair; NV<n>* through an NVSwitch fabric",
    "  PIX    at most one PCIe bridge",
    "  PXB    several PCIe bridges, no host bridge",
    "  PHB    through a PCIe host bridge",
    "  NODE   between host bridges of one NUMA node",
    "  SYS    across the CPU interconnect (QPI/UPI/xGMI; older drivers printed SOC)",
    "  BOARD  both GPUs on one board",
    "  ?      unknown",
    "  Bandwidth: estimated one-direction GB/s from gpualloc's bandwidth table",
]


def describe(topology: Topology) -> str:
    """One line: name, GPU count, interconnect, NUMA nodes."""
    name = topology.name or topology.provenance.origin or "this host"
    models = mixed_models(topology)
    named = {g.name for g in topology.gpus if g.name}
    model = f" ({models})" if models else (f" x {named.pop()}" if named else "")
    kinds = sorted({link.kind for link in topology.links if link.nvlinks})
    fabric = " through NVSwitch" if any(link.nvswitch for link in topology.links) else ""
    interconnect = f"NVLink ({'/'.join(kinds)}){fabric}" if kinds else "PCIe only"
    cpu_nodes = [n for n in topology.numa_nodes if n.cpus]
    numa = f", {len(cpu_nodes)} NUMA node{'s' if len(cpu_nodes) != 1 else ''}" if cpu_nodes else ""
    count = topology.gpu_count
    mig = len(topology.mig_instances)
    parents = format_cpulist(sorted({m.gpu for m in topology.mig_instances}))
    split = f", {mig} MIG device{'s' if mig != 1 else ''} on GPU {parents}" if mig else ""
    return f"{name}: {count} GPU{'s' if count != 1 else ''}{model}, {interconnect}{numa}{split}"


def mixed_models(topology: Topology) -> str | None:
    """``2x Quadro RTX 8000 + 2x Tesla V100-PCIE-32GB``: the models of a host whose GPUs are
    not all of one (a GPU whose name is unknown counts as one of another), in index order;
    None on a host of one model."""
    counts: dict[str | None, int] = {}
    for gpu in topology.gpus:
        counts[gpu.name] = counts.get(gpu.name, 0) + 1
    if len(counts) == 1:
        return None
    unknown = counts.pop(None, 0)
    parts = [f"{count}x {model}" for model, count in counts.items()]
    return " + ".join(parts + ([f"{unknown} unknown"] if unknown else []))


def topology_tables(topology: Topology) -> list[Table]:
    tables = [gpu_table(topology)]
    if topology.mig_instances:
        tables.append(mig_table(topology))
        room = mig_room_table(topology)
        if room is not None:
            tables.append(room)
    if topology.gpu_count > 1:
        tables.append(link_matrix(topology))
        if any(link.nvlinks and link.pcie for link in topology.links):
            tables.append(pcie_matrix(topology))
        tables.append(bandwidth_matrix(topology))
    if topology.numa_nodes:
        tables.append(numa_table(topology))
    return tables


def gpu_table(topology: Topology) -> Table:
    rows = []
    for gpu in topology.gpus:
        rows.append(
            [
                str(gpu.index),
                gpu.name or "?",
                gpu.pci_bus_id or "?",
                _gib(gpu.memory_total_bytes),
                _numa(gpu.numa_node, gpu.numa_affinity),
                format_cpulist(gpu.cpu_affinity) or "?",
                _mig(gpu.mig_enabled, gpu.mig_pending),
                gpu.health.value,
            ]
        )
    lost = [f"GPU {g.index} lost: {g.identity()}" for g in topology.gpus if g.health == Health.LOST]
    changes = lost + mig_changes(topology)
    return Table(
        "GPUs",
        ["GPU", "Name", "Bus id", "Memory", "NUMA", "CPU affinity", "MIG", "Health"],
        rows,
        wrap=(1,),
        caption="; ".join(changes) if changes else None,
    )


def mig_change(enabled: bool | None, pending: bool | None) -> str | None:
    """What a GPU's MIG mode does at its next reset, in words (None: nothing, or unknown)."""
    if enabled is None or pending is None or enabled == pending:
        return None
    if pending:
        return "MIG enabled, pending reset (off until the GPU is reset)"
    return "MIG disabling at next reset (on until then)"


def mig_changes(topology: Topology) -> list[str]:
    """``GPU 0-7: MIG enabled, pending reset ...``: the GPUs whose MIG mode an administrator
    switched (``nvidia-smi -mig``) while they could not be reset, by what will change."""
    by_change: dict[str, list[int]] = {}
    for gpu in topology.gpus:
        change = mig_change(gpu.mig_enabled, gpu.mig_pending)
        if change is not None:
            by_change.setdefault(change, []).append(gpu.index)
    return [f"GPU {format_cpulist(gpus)}: {change}" for change, gpus in by_change.items()]


def mig_table(topology: Topology) -> Table:
    """One row per MIG device: what ``--mig`` and ``CUDA_VISIBLE_DEVICES`` name."""
    rows = []
    for instance in topology.mig_instances:
        memory = instance.memory_total_bytes
        rows.append(
            [
                instance.label,
                instance.profile,
                str(instance.slices),
                _gib(memory) if memory is not None else f"~{_gib(instance.memory_bytes)}",
                _id(instance.gpu_instance) + "/" + _id(instance.compute_instance),
                _placement(instance.placement_start, instance.placement_size),
                instance.uuid or "?",
            ]
        )
    return Table(
        "MIG devices",
        ["Device", "Profile", "Slices", "Memory", "GI/CI", "Placement", "UUID"],
        rows,
        caption=(
            "~: the profile's nominal size (the source did not report the memory)"
            if any(m.memory_total_bytes is None for m in topology.mig_instances)
            else None
        ),
    )


def mig_room_table(topology: Topology) -> Table | None:
    """Per GPU in MIG mode: its free memory slices, and what NVIDIA's placement rules still let
    an administrator create there (None when no layout's placements are known)."""
    from gpualloc.placement.mig.slots import free_slices

    rows = []
    for gpu in topology.gpus:
        found = free_slices(topology, gpu.index) if gpu.mig_enabled else None
        if found is None:
            continue
        free, room = found
        fits = ", ".join(f"{count} x {profile}" for profile, count in room.items())
        rows.append([f"GPU{gpu.index}", format_cpulist(free) or "none", fits or "nothing"])
    if not rows:
        return None
    return Table(
        "Free MIG slices",
        ["GPU", "Free memory slices", "Room for (each profile alone)"],
        rows,
        wrap=(2,),
        caption="NVIDIA's placement rules ('nvidia-smi mig -lgipp'): a profile starts only at "
        "fixed slices, so free slices are not all usable",
    )


def _id(value: int | None) -> str:
    return "?" if value is None else str(value)


def _placement(start: int | None, size: int | None) -> str:
    return "?" if start is None or size is None else f"{start}:{size}"


def _matrix(topology: Topology, title: str, cell_of: Callable[[Link], Cell]) -> Table:
    labels = [f"GPU{g.index}" for g in topology.gpus]
    rows: list[list[str]] = []
    styles: list[list[str | None]] = []
    for a in range(topology.gpu_count):
        row: list[str] = [labels[a]]
        style: list[str | None] = ["bold"]
        for b in range(topology.gpu_count):
            text, cell_style = ("X", "dim") if a == b else cell_of(topology.link(a, b))
            row.append(text)
            style.append(cell_style)
        rows.append(row)
        styles.append(style)
    return Table(title, ["", *labels], rows, styles=styles, right_align_from=1)


def link_matrix(topology: Topology) -> Table:
    def cell(link: Link) -> Cell:
        if link.nvlinks:
            return f"NV{link.nvlinks}{'*' if link.nvswitch else ''}", STYLE_BY_CLASS["NV"]
        kind = link.pcie.value if link.pcie else "?"
        return kind, STYLE_BY_CLASS.get(kind, STYLE_BY_CLASS["UNKNOWN"])

    return _matrix(topology, "Links", cell)


def pcie_matrix(topology: Topology) -> Table:
    def cell(link: Link) -> Cell:
        kind = link.pcie.value if link.pcie else "?"
        return kind, STYLE_BY_CLASS.get(kind, STYLE_BY_CLASS["UNKNOWN"])

    return _matrix(topology, "PCIe paths (also under NVLinked pairs)", cell)


def bandwidth_matrix(topology: Topology) -> Table:
    values = [link.bandwidth_gbps for link in topology.links]
    best = max(values, default=0.0)
    # One format for the whole matrix: whole numbers as they are, else one decimal
    # everywhere, so that "150" never stands beside "25.0" or "7.9".
    digits = 0 if all(round(value, 1) == round(value) for value in values) else 1

    def cell(link: Link) -> Cell:
        value = link.bandwidth_gbps
        text = f"{value:.{digits}f}"
        if link.nvlinks:
            style = "bold green" if value >= 0.5 * best else "green"
        else:
            style = STYLE_BY_CLASS.get(link.pcie.value if link.pcie else "UNKNOWN", "")
        return text, style

    how = topology.provenance.bandwidth  # a matrix imported or calibrated is not an estimate
    return _matrix(topology, f"Bandwidth (GB/s, one direction, {how})", cell)


def numa_table(topology: Topology) -> Table:
    ids = [node.id for node in topology.numa_nodes]
    rows = []
    for node in topology.numa_nodes:
        gpus = [g.index for g in topology.gpus if g.numa_node == node.id]
        gpu_memory = [g.index for g in topology.gpus if g.gpu_numa_node == node.id]
        if gpu_memory:
            gpus_text = f"memory of GPU {format_cpulist(gpu_memory)}"
        else:
            gpus_text = format_cpulist(gpus) or "-"
        distances = (
            " ".join(str(node.distances.get(i, "?")) for i in ids) if node.distances else "?"
        )
        rows.append(
            [
                str(node.id),
                format_cpulist(node.cpus) or "(none)",
                _gib(node.memory_total_bytes),
                gpus_text,
                distances,
            ]
        )
    return Table(
        "NUMA nodes",
        ["Node", "CPUs", "Memory", "GPUs", f"Distances to {' '.join(map(str, ids))}"],
        rows,
        wrap=(3,),
    )


def provenance_lines(topology: Topology) -> list[str]:
    p = topology.provenance
    parts = [f"source: {p.source}"]
    if p.origin:
        parts.append(p.origin)
    if p.hostname:
        parts.append(f"host {p.hostname}")
    if p.driver_version:
        parts.append(f"driver {p.driver_version}")
    if p.captured_at:
        parts.append(f"captured {p.captured_at:%Y-%m-%d %H:%M:%S %Z}".rstrip())
    lines = [", ".join(parts)]
    if p.description:
        lines.append(f"  {p.description}")
    if p.notes:
        lines.append("Notes:")
        lines += [f"  - {note}" for note in p.notes]
    return lines


def _gib(size: int | None) -> str:
    if size is None:
        return "?"
    gib = size / 1024**3
    return f"{gib:.0f} GiB" if gib >= 10 else f"{gib:.1f} GiB"


def _numa(node: int | None, affinity: list[int]) -> str:
    if node is not None:
        return str(node)
    return format_cpulist(affinity) if affinity else "?"


def _mig(enabled: bool | None, pending: bool | None = None) -> str:
    now = "?" if enabled is None else ("on" if enabled else "off")
    if mig_change(enabled, pending) is None:
        return now
    return f"{now}, {'on' if pending else 'off'} at reset"
