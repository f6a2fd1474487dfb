"""Turn what a source observed into a :class:`~gpualloc.model.Topology`.

Every source (NVML, nvidia-smi, recorded text) reports GPUs and, for each pair, a PCIe path and a
number of NVLinks. This module fills in what the source left implicit, in one place, so the
sources agree: NVLink generations from the GPU family, NVSwitch fabrics that ``topo -m`` does not
name, NUMA placement from CPU affinity, and the bandwidth estimate. Every inference adds a note to
the provenance so that ``topo show`` can say what was observed and what was assumed.
"""

from __future__ import annotations

from msgspec import Struct
from msgspec.structs import replace

from gpualloc.model.bandwidth import DEFAULT_BANDWIDTH_TABLE, BandwidthTable
from gpualloc.model.catalog import family_of
from gpualloc.model.mig import MigInstance
from gpualloc.model.paths import PciePath
from gpualloc.model.topology import Gpu, Link, NumaNode, Provenance, Topology, pair_bandwidth_gbps

MOST_NVLINKS_PER_GPU = 18
"""No NVIDIA GPU so far has more than 18 NVLinks (H100, H200, B200); a GPU reported with more
NVLinks to its peers than that must reach them through an NVSwitch."""


class PairFacts(Struct):
    """What a source observed between two GPUs."""

    pcie: PciePath | None = None
    nvlinks: int = 0
    nvlink_generation: int | None = None
    nvswitch: bool | None = None
    """None: the source cannot tell (``topo -m``); inferred from link counts."""
    peer_access: bool | None = None
    """None: not read (``topo -m`` alone)."""


def assemble_topology(
    *,
    gpus: list[Gpu],
    pairs: dict[tuple[int, int], PairFacts],
    numa_nodes: list[NumaNode],
    provenance: Provenance,
    table: BandwidthTable = DEFAULT_BANDWIDTH_TABLE,
    name: str | None = None,
    mig_instances: list[MigInstance] | None = None,
) -> Topology:
    notes = provenance.notes
    gpus = [_with_family_facts(gpu, notes) for gpu in gpus]
    if not numa_nodes:
        numa_nodes = _numa_from_affinity(gpus, notes)
    gpus = [_with_numa_placement(gpu, numa_nodes) for gpu in gpus]
    switched = _switch_attached(gpus, pairs, notes)
    links = []
    for a in range(len(gpus)):
        for b in range(a + 1, len(gpus)):
            facts = pairs.get((a, b), PairFacts())
            generation = facts.nvlink_generation or _common_generation(gpus[a], gpus[b])
            nvswitch = facts.nvswitch
            if nvswitch is None:
                nvswitch = facts.nvlinks > 0 and a in switched and b in switched
            link = Link(
                a=a,
                b=b,
                pcie=facts.pcie,
                nvlinks=facts.nvlinks,
                nvlink_generation=generation if facts.nvlinks else None,
                nvswitch=nvswitch,
                peer_access=facts.peer_access,
                bandwidth_gbps=0.0,
            )
            link.bandwidth_gbps = pair_bandwidth_gbps(gpus, link, table)
            links.append(link)
    if any(link.nvlinks and link.nvlink_generation is None for link in links):
        notes.append(
            "NVLink generation unknown (no GPU names in the source); bandwidth assumes "
            f"generation {table.default_nvlink_generation}"
        )
    return Topology(
        name=name,
        gpus=gpus,
        links=links,
        numa_nodes=numa_nodes,
        provenance=provenance,
        mig_instances=mig_instances or [],
    ).validated()


def _with_family_facts(gpu: Gpu, notes: list[str]) -> Gpu:
    family = family_of(gpu.name)
    if family is None:
        return gpu
    update: dict[str, int] = {}
    if gpu.nvlink_generation is None and family.nvlink_generation and gpu.nvlinks_active != 0:
        update["nvlink_generation"] = family.nvlink_generation
    if gpu.pcie_generation is None and family.pcie_generation:
        update["pcie_generation"] = family.pcie_generation
        note = (
            f"PCIe generation of {gpu.name} assumed from its model (gen {family.pcie_generation})"
        )
        if note not in notes:
            notes.append(note)
    return replace(gpu, **update) if update else gpu


def _common_generation(first: Gpu, second: Gpu) -> int | None:
    generations = [g.nvlink_generation for g in (first, second) if g.nvlink_generation]
    return min(generations) if generations else None


def _switch_attached(
    gpus: list[Gpu], pairs: dict[tuple[int, int], PairFacts], notes: list[str]
) -> set[int]:
    """GPUs whose NVLinks must run through an NVSwitch, judged by link counts.

    ``topo -m`` prints an NVSwitch fabric as ``NV<n>`` between every pair, where ``n`` is each
    GPU's number of links into the fabric (NV12 on DGX A100, NV18 on HGX H100). A GPU cannot have
    more direct links than it has NVLinks, so when the NV counts to its peers add up to more than
    that, its links go into a switch.
    """
    totals = dict.fromkeys(range(len(gpus)), 0)
    undetermined = False
    for (a, b), facts in pairs.items():
        if facts.nvswitch is None and facts.nvlinks:
            undetermined = True
            totals[a] += facts.nvlinks
            totals[b] += facts.nvlinks
    if not undetermined:
        return set()
    switched = set()
    for index, total in totals.items():
        family = family_of(gpus[index].name)
        capacity = gpus[index].nvlinks_active or (family.max_nvlinks if family else None)
        if total > (capacity or MOST_NVLINKS_PER_GPU):
            switched.add(index)
    if switched:
        notes.append(
            f"NVSwitch inferred for GPUs {sorted(switched)}: their NVLink counts to peers exceed "
            "the links a GPU has"
        )
    return switched


def _numa_from_affinity(gpus: list[Gpu], notes: list[str]) -> list[NumaNode]:
    """NUMA nodes as far as the GPUs' affinities tell (no memory sizes or distances)."""
    cpus_by_node: dict[int, set[int]] = {}
    for gpu in gpus:
        if gpu.numa_node is not None:
            cpus_by_node.setdefault(gpu.numa_node, set()).update(gpu.cpu_affinity)
    if not cpus_by_node:
        return []
    notes.append(
        "NUMA nodes derived from GPU affinity only: nodes without GPUs, memory sizes and "
        "distances unknown (give 'numactl --hardware' output to fill them in)"
    )
    return [NumaNode(id=node, cpus=sorted(cpus)) for node, cpus in sorted(cpus_by_node.items())]


def _with_numa_placement(gpu: Gpu, numa_nodes: list[NumaNode]) -> Gpu:
    """Fill a GPU's NUMA node from its CPU affinity, or its CPU affinity from its node."""
    update: dict[str, object] = {}
    if gpu.numa_node is None and gpu.cpu_affinity and not gpu.numa_affinity:
        wanted = set(gpu.cpu_affinity)
        holders = [n.id for n in numa_nodes if n.cpus and wanted <= set(n.cpus)]
        if len(holders) == 1:
            update["numa_node"] = holders[0]
            update["numa_affinity"] = holders
    if not gpu.cpu_affinity and gpu.numa_node is not None:
        node = next((n for n in numa_nodes if n.id == gpu.numa_node), None)
        if node and node.cpus:
            update["cpu_affinity"] = node.cpus
    return replace(gpu, **update) if update else gpu
