#!/usr/bin/env python3
"""Generate gpualloc/topologies/*.json, the topologies usable by name.

Run from the repository root: ``python scripts/build_bundled_topologies.py`` writes the files;
``--check`` exits 1 if any file differs from what this script builds (tests run the same check).

Each topology states in ``provenance.description`` where its facts come from: the real outputs
in tests/fixtures/topologies/ (copied from the project's shared collection), the MAPA and DRB
reference implementations' hardware graphs (socal-ucr/MAPA and HiEST/gpu-topo-aware on GitHub,
named by repository: the project's shared collection, ``../shared/reference``, is not in a
clone), and vendor documentation. Where a fact is an assumption, the description says so.
UUIDs are synthetic (uuid5 of name and index) so that tools keyed on UUIDs work on bundled
hosts.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable
from pathlib import Path

from gpualloc.discovery.assemble import PairFacts, assemble_topology
from gpualloc.model import Gpu, NumaNode, PciePath, Provenance, Topology

GIB = 1024**3
OUT_DIR = Path(__file__).resolve().parent.parent / "gpualloc" / "topologies"
PathRule = Callable[[int, int], PciePath | None]


def x86_sockets(
    sockets: int, cores: int, memory_gib: int, remote: int = 21, threads: int = 2
) -> list[NumaNode]:
    """Linux numbering of ``sockets`` x ``cores`` with SMT: node s holds core ids s*cores.. and
    their hyperthread siblings sockets*cores + s*cores.. (as in the numactl fixtures)."""
    total = sockets * cores
    nodes = []
    for s in range(sockets):
        cpus = []
        for t in range(threads):
            cpus += range(t * total + s * cores, t * total + (s + 1) * cores)
        nodes.append(
            NumaNode(
                id=s,
                cpus=cpus,
                memory_total_bytes=memory_gib * GIB,
                distances={o: 10 if o == s else remote for o in range(sockets)},
            )
        )
    return nodes


def build(
    name: str,
    *,
    description: str,
    gpu_name: str,
    memory_gib: int,
    gpu_numa: list[int],
    numa_nodes: list[NumaNode],
    nvlinks: dict[tuple[int, int], int],
    pcie: PathRule,
    nvswitch: bool = False,
    nvlink_generation: int | None = None,
    pcie_generation: int = 3,
    gpu_numa_nodes: list[int] | None = None,
) -> Topology:
    count = len(gpu_numa)
    cpus_of = {n.id: n.cpus for n in numa_nodes}
    gpus = [
        Gpu(
            index=i,
            uuid=f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'gpualloc:{name}/{i}')}",
            name=gpu_name,
            memory_total_bytes=memory_gib * GIB,
            numa_node=gpu_numa[i],
            numa_affinity=[gpu_numa[i]],
            cpu_affinity=cpus_of[gpu_numa[i]],
            gpu_numa_node=gpu_numa_nodes[i] if gpu_numa_nodes else None,
            mig_enabled=False,
            pcie_generation=pcie_generation,
            pcie_width=16,
            nvlink_generation=nvlink_generation if any(i in p for p in nvlinks) else None,
            nvlinks_active=sum(n for p, n in nvlinks.items() if i in p) if not nvswitch else None,
        )
        for i in range(count)
    ]
    pairs = {}
    for a in range(count):
        for b in range(a + 1, count):
            links = nvlinks.get((a, b), 0)
            pairs[(a, b)] = PairFacts(
                pcie=pcie(a, b),
                nvlinks=links,
                nvlink_generation=nvlink_generation if links else None,
                nvswitch=nvswitch and links > 0,
            )
    return assemble_topology(
        gpus=gpus,
        pairs=pairs,
        numa_nodes=numa_nodes,
        provenance=Provenance(source="bundled", origin=name, description=description),
        name=name,
    )


def grouped(*levels: tuple[int, PciePath], farthest: PciePath) -> PathRule:
    """Path rule for GPUs hung in a tree: ``(group size, class)`` from the innermost group out;
    pairs in no common group get ``farthest``."""

    def rule(a: int, b: int) -> PciePath:
        for size, path in levels:
            if a // size == b // size:
                return path
        return farthest

    return rule


def pairs_of(*edges: tuple[int, int], links: int) -> dict[tuple[int, int], int]:
    return {(min(a, b), max(a, b)): links for a, b in edges}


def all_pairs(count: int, links: int) -> dict[tuple[int, int], int]:
    return {(a, b): links for a in range(count) for b in range(a + 1, count)}


def from_mapa(edges: list[tuple[int, int, str]]) -> dict[tuple[int, int], int]:
    """MAPA's 1-based typed edges (socal-ucr/MAPA on GitHub) to 0-based NV counts."""
    return {(a - 1, b - 1): int(kind[2:]) for a, b, kind in edges}


# ---- the topologies --------------------------------------------------------------------------

DGX1_PAIRS_P100 = {(0, 2), (1, 3), (4, 6), (5, 7)}
DGX1_PAIRS_V100 = {(0, 1), (2, 3), (4, 5), (6, 7)}


def dgx1_pcie(switch_pairs: set[tuple[int, int]]) -> PathRule:
    def rule(a: int, b: int) -> PciePath:
        if (a, b) in switch_pairs:
            return PciePath.PIX
        return PciePath.PHB if a // 4 == b // 4 else PciePath.SYS

    return rule


def dgx1_p100() -> Topology:
    quads = [(a, b) for q in (0, 4) for a in range(q, q + 4) for b in range(a + 1, q + 4)]
    return build(
        "dgx1-p100",
        description=(
            "NVIDIA DGX-1 with 8 Tesla P100-SXM2-16GB, hybrid cube-mesh of NVLink 1 (one link on "
            "every pair within the quads 0-3 and 4-7, and 0-4, 1-5, 2-6, 3-7), as in the MAPA "
            "reference graph 'dgx-p' (socal-ucr/MAPA on GitHub) and the DGX-1 "
            "system architecture whitepaper (WP-08437-002). PCIe: pairs 0-2, 1-3, 4-6, 5-7 share "
            "a PCIe switch, the pairs of a quad meet at the host bridge, quads are on different "
            "sockets. CPUs: 2 x Xeon E5-2698 v4 (20 cores, HT), 256 GiB per socket."
        ),
        gpu_name="Tesla P100-SXM2-16GB",
        memory_gib=16,
        gpu_numa=[0, 0, 0, 0, 1, 1, 1, 1],
        numa_nodes=x86_sockets(2, 20, 256),
        nvlinks=pairs_of(*quads, (0, 4), (1, 5), (2, 6), (3, 7), links=1),
        pcie=dgx1_pcie(DGX1_PAIRS_P100),
        nvlink_generation=1,
    )


def dgx1_v100() -> Topology:
    double = [(0, 3), (0, 4), (1, 2), (1, 5), (2, 3), (4, 7), (5, 6), (6, 7)]
    single = [(0, 1), (0, 2), (1, 3), (2, 6), (3, 7), (4, 5), (4, 6), (5, 7)]
    return build(
        "dgx1-v100",
        description=(
            "NVIDIA DGX-1 with 8 Tesla V100-SXM2-32GB, hybrid cube-mesh of NVLink 2: two links on "
            "0-3, 0-4, 1-2, 1-5, 2-3, 4-7, 5-6, 6-7 and one on 0-1, 0-2, 1-3, 2-6, 3-7, 4-5, "
            "4-6, 5-7. The NVLink matrix equals the real 'nvidia-smi topo -m' of an 8 x V100-SXM2 "
            "host (tests/fixtures/topologies/dgx1-v100_vast_topo.txt) and MAPA's 'dgx-v' graph. "
            "PCIe: pairs 0-1, 2-3, 4-5, 6-7 share a PCIe switch, the pairs of each quad meet at "
            "the host bridge, quads are on different sockets (DGX-1V whitepaper). CPUs: 2 x Xeon "
            "E5-2698 v4 (20 cores, HT; CPU affinity 0-19,40-59 / 20-39,60-79 as in the real "
            "output), 256 GiB per socket."
        ),
        gpu_name="Tesla V100-SXM2-32GB",
        memory_gib=32,
        gpu_numa=[0, 0, 0, 0, 1, 1, 1, 1],
        numa_nodes=x86_sockets(2, 20, 256),
        nvlinks={**pairs_of(*double, links=2), **pairs_of(*single, links=1)},
        pcie=dgx1_pcie(DGX1_PAIRS_V100),
        nvlink_generation=2,
    )


def dgx2() -> Topology:
    return build(
        "dgx2",
        description=(
            "NVIDIA DGX-2 with 16 Tesla V100-SXM3-32GB behind 12 NVSwitches: every pair NV6 "
            "(six NVLink 2 links from each GPU into the fabric), as in the real 'topo -m' header "
            "and first rows of tests/fixtures/topologies/dgx2_16gpu_nv6_10nic_PARTIAL_topo.txt. "
            "PCIe: GPUs in pairs under a leaf switch (PIX), quads under one switch tree (PXB), "
            "GPUs 0-7 and 8-15 on the two sockets (NODE within, SYS across); the visible rows "
            "show this for GPUs 0-4, the rest follows the DGX-2 user guide's symmetric layout. "
            "CPUs: 2 x Xeon Platinum 8168 (24 cores, HT; affinity 0-23,48-71 as in the output), "
            "768 GiB per socket."
        ),
        gpu_name="Tesla V100-SXM3-32GB",
        memory_gib=32,
        gpu_numa=[0] * 8 + [1] * 8,
        numa_nodes=x86_sockets(2, 24, 768),
        nvlinks=all_pairs(16, 6),
        pcie=grouped(
            (2, PciePath.PIX), (4, PciePath.PXB), (8, PciePath.NODE), farthest=PciePath.SYS
        ),
        nvswitch=True,
        nvlink_generation=2,
    )


def dgx_a100() -> Topology:
    nodes = []
    for n in range(8):
        cpus = list(range(16 * n, 16 * n + 16)) + list(range(128 + 16 * n, 128 + 16 * n + 16))
        nodes.append(
            NumaNode(
                id=n,
                cpus=cpus,
                memory_total_bytes=128 * GIB,
                distances={o: 10 if o == n else (12 if o // 4 == n // 4 else 32) for o in range(8)},
            )
        )
    return build(
        "dgx-a100",
        description=(
            "NVIDIA DGX A100 with 8 A100-SXM4-40GB behind 6 NVSwitches: every pair NV12 (twelve "
            "NVLink 3 links per GPU). NUMA: 2 x AMD EPYC 7742 in NPS4 mode, 8 nodes; GPUs 0-1 on "
            "node 3, 2-3 on 1, 4-5 on 7, 6-7 on 5, with the CPU lists of the real outputs "
            "(tests/fixtures/topologies/dgx-a100_*_topo.txt). PCIe: each GPU pair shares a switch "
            "tree with two NICs (PXB, as the GPU-NIC cells show); pairs on different NUMA nodes "
            "are SYS. Distances 10/12/32 as in the NPS4 numactl fixture; 128 GiB per node."
        ),
        gpu_name="NVIDIA A100-SXM4-40GB",
        memory_gib=40,
        gpu_numa=[3, 3, 1, 1, 7, 7, 5, 5],
        numa_nodes=nodes,
        nvlinks=all_pairs(8, 12),
        pcie=grouped((2, PciePath.PXB), farthest=PciePath.SYS),
        nvswitch=True,
        nvlink_generation=3,
        pcie_generation=4,
    )


def hgx_h100() -> Topology:
    return build(
        "hgx-h100",
        description=(
            "An 8 x H100-SXM5 80GB HGX host behind NVSwitches: every pair NV18 (eighteen NVLink "
            "4 links per GPU), GPUs 0-3 on socket 0 and 4-7 on socket 1 with CPU affinity "
            "0-47,96-143 / 48-95,144-191, from the real output in tests/fixtures/topologies/"
            "hgx-h100_8nic_sglang20859_misaligned-spaces_topo.txt. PCIe: each GPU under its own "
            "switch (GPU-GPU paths NODE within a socket, SYS across, as the GPU-NIC cells of that "
            "output imply). 1 TiB per socket (assumed)."
        ),
        gpu_name="NVIDIA H100 80GB HBM3",
        memory_gib=80,
        gpu_numa=[0] * 4 + [1] * 4,
        numa_nodes=x86_sockets(2, 48, 1024),
        nvlinks=all_pairs(8, 18),
        pcie=grouped((4, PciePath.NODE), farthest=PciePath.SYS),
        nvswitch=True,
        nvlink_generation=4,
        pcie_generation=5,
    )


MIB = 1024**2

MigSpec = tuple[str, int, int, int]
"""(profile, GPU instance id, placement start, MiB of memory) of one MIG device."""

A100_40GB_MIG_MIB = {"1g.5gb": 4864, "2g.10gb": 9984, "3g.20gb": 20096, "4g.20gb": 20096}
"""Memory per profile of an A100-SXM4-40GB: 3g.20gb from the real 'nvidia-smi' MIG table in
tests/fixtures/topologies (20096 MiB, GI 2), the others as NVIDIA's MIG User Guide lists them
for 'nvidia-smi mig -lgip' (4.75 and 9.75 GiB; 4g.20gb has the memory of 3g.20gb)."""

H100_80GB_MIG_MIB = {"1g.10gb": 9984, "2g.20gb": 20096, "3g.40gb": 40192, "7g.80gb": 81152}
"""Memory per profile of an H100 80GB, as NVIDIA's MIG User Guide lists them (9.75, 19.62,
39.25 and 79.25 GiB); not checked against a real H100 here."""


def with_mig(
    topology: Topology, layouts: dict[int, list[MigSpec]], slots: dict[str, int]
) -> Topology:
    """Turn MIG on for the GPUs in ``layouts``, with those MIG devices (device index in GI id
    order, compute instance 0, synthetic MIG UUIDs). ``slots``: memory slices per profile."""
    from msgspec.structs import replace

    from gpualloc.model import MigInstance

    gpus = [replace(g, mig_enabled=True) if g.index in layouts else g for g in topology.gpus]
    instances = []
    for gpu, specs in layouts.items():
        for device, (profile, gi, start, mib) in enumerate(sorted(specs, key=lambda s: s[1])):
            key = f"gpualloc:{topology.name}/{gpu}/mig{device}"
            instances.append(
                MigInstance(
                    gpu=gpu,
                    device=device,
                    profile=profile,
                    uuid=f"MIG-{uuid.uuid5(uuid.NAMESPACE_URL, key)}",
                    gpu_instance=gi,
                    compute_instance=0,
                    memory_total_bytes=mib * MIB,
                    placement_start=start,
                    placement_size=slots[profile],
                )
            )
    return replace(topology, gpus=gpus, mig_instances=instances).validated()


def dgx_a100_mig() -> Topology:
    base = dgx_a100()
    mib = A100_40GB_MIG_MIB
    slots = {"1g.5gb": 1, "2g.10gb": 2, "3g.20gb": 4, "4g.20gb": 4}
    seven = [("1g.5gb", 7 + k, k, mib["1g.5gb"]) for k in range(7)]
    two = [("3g.20gb", 1, 4, 20224), ("3g.20gb", 2, 0, mib["3g.20gb"])]
    mixed = [
        ("4g.20gb", 1, 0, mib["4g.20gb"]),
        ("2g.10gb", 5, 4, mib["2g.10gb"]),
        ("1g.5gb", 13, 6, mib["1g.5gb"]),
    ]
    topology = replace_identity(
        base,
        "dgx-a100-mig",
        "The dgx-a100 host with MIG on three GPUs, as a lab shares one: GPU0 split into 7 x "
        "1g.5gb (the layout of the real 'nvidia-smi -L' output in tests/fixtures/topologies), "
        "GPU1 into 2 x 3g.20gb (GI ids, placements 4:4 and 0:4 and memories 20224 / 20096 MiB "
        "of the real 'mig -lgi' and 'nvidia-smi' outputs there), GPU2 into 4g.20gb + 2g.10gb + "
        "1g.5gb; GPUs 3-7 whole. Memory of the other profiles as NVIDIA's MIG User Guide lists "
        "it; GI ids of GPU0 and GPU2 and all MIG UUIDs are synthetic.",
    )
    return with_mig(topology, {0: seven, 1: two, 2: mixed}, slots)


def hgx_h100_mig() -> Topology:
    base = hgx_h100()
    mib = H100_80GB_MIG_MIB
    slots = {"1g.10gb": 1, "2g.20gb": 2, "3g.40gb": 4, "7g.80gb": 8}
    # The layout of the real 'mig -lgi' of reference/measured/mig (an A100 80GB's 1g + 1g + 2g
    # + 3g): NVIDIA's placement rules leave no other for these four (a 1g may not start at 7).
    mixed = [
        ("3g.40gb", 2, 4, mib["3g.40gb"]),
        ("2g.20gb", 3, 0, mib["2g.20gb"]),
        ("1g.10gb", 9, 2, mib["1g.10gb"]),
        ("1g.10gb", 10, 3, mib["1g.10gb"]),
    ]
    seven = [("1g.10gb", 7 + k, k, mib["1g.10gb"]) for k in range(7)]
    topology = replace_identity(
        base,
        "hgx-h100-mig",
        "The hgx-h100 host with MIG on two GPUs: GPU0 mixed (3g.40gb + 2g.20gb + 2 x "
        "1g.10gb), GPU1 7 x 1g.10gb; GPUs 2-7 whole. Memory per profile as NVIDIA's MIG User "
        "Guide lists it for the H100 80GB (assumed, not read from a real H100); GI ids and MIG "
        "UUIDs are synthetic.",
    )
    return with_mig(topology, {0: mixed, 1: seven}, slots)


def replace_identity(topology: Topology, name: str, description: str) -> Topology:
    """``topology`` under another name: new description, new synthetic GPU UUIDs."""
    from msgspec.structs import replace

    gpus = [
        replace(g, uuid=f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'gpualloc:{name}/{g.index}')}")
        for g in topology.gpus
    ]
    provenance = replace(topology.provenance, origin=name, description=description)
    return replace(topology, name=name, gpus=gpus, provenance=provenance)


def summit_node() -> Topology:
    sockets = [
        NumaNode(
            id=0, cpus=list(range(88)), memory_total_bytes=256 * GIB, distances={0: 10, 8: 40}
        ),
        NumaNode(
            id=8, cpus=list(range(88, 176)), memory_total_bytes=256 * GIB, distances={0: 40, 8: 10}
        ),
    ]
    gpu_memory = [NumaNode(id=255 - i, memory_total_bytes=16 * GIB) for i in range(6)]
    return build(
        "summit-node",
        description=(
            "An OLCF Summit node (IBM AC922): 2 POWER9 sockets (22 cores, SMT4) with 3 Tesla "
            "V100-SXM2-16GB each, all pairs within a socket joined by two NVLink 2 links (the "
            "NVLink triangles of MAPA's 'summit' graph, socal-ucr/MAPA on GitHub); "
            "across sockets GPUs talk over the X-bus (SYS). NUMA ids 0 and 8 as on the real "
            "AC922 output (tests/fixtures/topologies/ibm-ac922_4gpu_power9_topo.txt). The "
            "coherent GPU memory appears as CPU-less NUMA nodes 255..250 (GPU i -> 255-i), as "
            "the NVIDIA driver onlines it on POWER9; 256 GiB per socket."
        ),
        gpu_name="Tesla V100-SXM2-16GB",
        memory_gib=16,
        gpu_numa=[0, 0, 0, 8, 8, 8],
        numa_nodes=sockets + gpu_memory,
        nvlinks=pairs_of((0, 1), (0, 2), (1, 2), (3, 4), (3, 5), (4, 5), links=2),
        pcie=grouped((3, PciePath.NODE), farthest=PciePath.SYS),
        nvlink_generation=2,
        gpu_numa_nodes=[255 - i for i in range(6)],
    )


def pcie_8gpu_2socket() -> Topology:
    return build(
        "pcie-8gpu-2socket",
        description=(
            "A representative dual-socket 8-GPU PCIe server without NVLink: 8 NVIDIA L40S, four "
            "PCIe Gen4 switches with two GPUs each (PIX), two switches per socket (NODE within a "
            "socket, SYS across), 2 x 32-core CPUs with HT, 512 GiB per socket. Synthetic: it "
            "follows the common 4U dual-root layout; the closest real output, 8 x RTX 4090 with "
            "6+2 GPUs per socket, is tests/fixtures/topologies/8x4090_pcie_vast_2socket_6plus2_"
            "topo.txt."
        ),
        gpu_name="NVIDIA L40S",
        memory_gib=48,
        gpu_numa=[0] * 4 + [1] * 4,
        numa_nodes=x86_sockets(2, 32, 512),
        nvlinks={},
        pcie=grouped((2, PciePath.PIX), (4, PciePath.NODE), farthest=PciePath.SYS),
        pcie_generation=4,
    )


def pcie_32gpu_2socket() -> Topology:
    return build(
        "pcie-32gpu-2socket",
        description=(
            "A dual-socket 32-GPU PCIe host without NVLink, for placement at scale "
            "(benchmarks/bench_placement.py times every policy on it): 32 NVIDIA L40S, eight "
            "PCIe Gen4 switches with four GPUs each (PIX; a 98-lane switch of the Broadcom "
            "PEX88096 class takes four x16 GPUs and a x16 uplink), four switches per socket "
            "(NODE within a socket, SYS across), 2 x 32-core CPUs with HT, 512 GiB per socket."
            " Synthetic: no 32-GPU host's 'nvidia-smi topo -m' is in the collection; it scales"
            " pcie-8gpu-2socket's dual-root layout (two GPUs a switch there) to the GPU count "
            "of PCIe expansion builds."
        ),
        gpu_name="NVIDIA L40S",
        memory_gib=48,
        gpu_numa=[0] * 16 + [1] * 16,
        numa_nodes=x86_sockets(2, 32, 512),
        nvlinks={},
        pcie=grouped((4, PciePath.PIX), (16, PciePath.NODE), farthest=PciePath.SYS),
        pcie_generation=4,
    )


def a40_nv4_pairs_8gpu() -> Topology:
    return build(
        "a40-nv4-pairs-8gpu",
        description=(
            "A recorded host: 8 NVIDIA A40 in NVLink-bridged pairs (NV4 on 0-1, 2-3, 4-5, 6-7), "
            "NODE within a socket (GPUs 0-3, 4-7), SYS across, as printed by its owner with "
            "nccl-tests runs on it (tests/fixtures/measured/nccl_tests/a40x8_nv4pairs_p2p_node_"
            "sys.txt, eugenesiow/LLM-Insights). A40: 4 bridge links at 14.06 GB/s, PCIe 4.0 x16 "
            "(its datasheet); all_reduce_perf on the NV4 pair measured 47.5 GB/s bus bandwidth "
            "(estimate: 56.25 x NCCL's 0.8). CPU counts and memory are not in the source: "
            "2 x 32 cores with HT and 256 GiB per socket assumed."
        ),
        gpu_name="NVIDIA A40",
        memory_gib=48,
        gpu_numa=[0] * 4 + [1] * 4,
        numa_nodes=x86_sockets(2, 32, 256),
        nvlinks=pairs_of((0, 1), (2, 3), (4, 5), (6, 7), links=4),
        pcie=lambda a, b: (
            None if a // 2 == b // 2 else PciePath.NODE if a // 4 == b // 4 else PciePath.SYS
        ),
        nvlink_generation=3,
        pcie_generation=4,
    )


def nvlink_pairs_4gpu() -> Topology:
    nodes = [
        NumaNode(
            id=s,
            cpus=list(range(s, 12, 2)),
            memory_total_bytes=128 * GIB,
            distances={0: 10 if s == 0 else 21, 1: 10 if s == 1 else 21},
        )
        for s in (0, 1)
    ]
    return build(
        "nvlink-pairs-4gpu",
        description=(
            "A 2-socket workstation with 4 GPUs in two NVLink-bridged pairs (NV4 on 0-1 and 2-3, "
            "SYS across), CPU affinity interleaved 0,2,4,6,8,10 / 1,3,5,7,9,11, from the real "
            "output tests/fixtures/topologies/4gpu_nv4-bridge-pairs_2socket_interleaved-cpus_"
            "topo.txt. The GPU model is not in that output; RTX A6000 (4 bridge links at "
            "14.06 GB/s, its datasheet) is assumed. The PCIe path of the bridged pairs is hidden "
            "by topo -m and left unknown; 128 GiB per socket assumed."
        ),
        gpu_name="NVIDIA RTX A6000",
        memory_gib=48,
        gpu_numa=[0, 0, 1, 1],
        numa_nodes=nodes,
        nvlinks=pairs_of((0, 1), (2, 3), links=4),
        pcie=lambda a, b: None if a // 2 == b // 2 else PciePath.SYS,
        nvlink_generation=3,
        pcie_generation=4,
    )


MAPA_TORUS_2D = [
    (1, 2, "NV2"),
    (1, 4, "NV1"),
    (1, 5, "NV1"),
    (1, 13, "NV2"),
    (2, 3, "NV2"),
    (2, 6, "NV1"),
    (2, 14, "NV1"),
    (3, 4, "NV2"),
    (3, 7, "NV1"),
    (3, 15, "NV1"),
    (4, 8, "NV1"),
    (4, 16, "NV2"),
    (5, 6, "NV2"),
    (5, 8, "NV1"),
    (5, 9, "NV1"),
    (6, 7, "NV2"),
    (6, 10, "NV1"),
    (7, 8, "NV2"),
    (7, 11, "NV1"),
    (8, 12, "NV1"),
    (9, 10, "NV2"),
    (9, 12, "NV1"),
    (9, 13, "NV1"),
    (10, 11, "NV2"),
    (10, 14, "NV1"),
    (11, 12, "NV2"),
    (11, 15, "NV1"),
    (12, 16, "NV1"),
    (13, 14, "NV2"),
    (13, 16, "NV1"),
    (14, 15, "NV2"),
    (15, 16, "NV2"),
]
MAPA_CUBE_MESH_16 = [
    (1, 2, "NV1"),
    (1, 3, "NV1"),
    (1, 4, "NV2"),
    (1, 12, "NV2"),
    (2, 3, "NV2"),
    (2, 4, "NV1"),
    (2, 6, "NV2"),
    (3, 7, "NV1"),
    (3, 10, "NV1"),
    (4, 9, "NV2"),
    (5, 6, "NV2"),
    (5, 7, "NV1"),
    (5, 8, "NV1"),
    (5, 16, "NV2"),
    (6, 7, "NV1"),
    (6, 8, "NV1"),
    (7, 8, "NV2"),
    (7, 14, "NV1"),
    (8, 13, "NV2"),
    (9, 10, "NV1"),
    (9, 11, "NV2"),
    (9, 12, "NV1"),
    (10, 11, "NV2"),
    (10, 12, "NV1"),
    (10, 14, "NV2"),
    (11, 15, "NV1"),
    (13, 14, "NV2"),
    (13, 15, "NV1"),
    (13, 16, "NV2"),
    (14, 15, "NV1"),
    (14, 16, "NV1"),
    (15, 16, "NV2"),
]


def mapa_torus_edges(rows: int, columns: int) -> list[tuple[int, int, str]]:
    """MAPA's torus-2d construction (Fig. 17a) on ``rows`` x ``columns`` GPUs, 1-based like
    MAPA_TORUS_2D: each row a path of double links closed by a single one, each column single
    links, the first and last columns closed by double links. On 4 x 4 it is MAPA_TORUS_2D
    with the edge 1-5 the reference omits; no GPU has more than six links (a V100's)."""
    edges = []
    for r in range(rows):
        for c in range(columns):
            g = r * columns + c + 1
            if c + 1 < columns:
                edges.append((g, g + 1, "NV2"))
            if r + 1 < rows:
                edges.append((g, g + columns, "NV1"))
        edges.append((r * columns + 1, r * columns + columns, "NV1"))
    for c in range(columns):
        wrap = "NV2" if c in (0, columns - 1) else "NV1"
        edges.append((c + 1, (rows - 1) * columns + c + 1, wrap))
    return edges


def mapa_mesh(
    name: str, edges: list[tuple[int, int, str]], what: str, gpu_count: int = 16
) -> Topology:
    node = NumaNode(id=0, cpus=list(range(64)), memory_total_bytes=1024 * GIB, distances={0: 10})
    return build(
        name,
        description=(
            f"{what} The non-NVLinked pairs share one flat PCIe host bridge (PHB) and one NUMA "
            "node, matching MAPA's uniform 10 GB/s PCIe edge; the GPUs are V100-class (NVLink 2, "
            "25 GB/s per link) as in the paper's DGX-1 V100 link classes."
        ),
        gpu_name="Tesla V100-SXM2-32GB",
        memory_gib=32,
        gpu_numa=[0] * gpu_count,
        numa_nodes=[node],
        nvlinks=from_mapa(edges),
        pcie=lambda a, b: PciePath.PHB,
        nvlink_generation=2,
    )


def torus_2d_16() -> Topology:
    return mapa_mesh(
        "torus-2d-16",
        MAPA_TORUS_2D,
        "The 16-GPU 2D torus (4 x 4) of the MAPA paper's Fig. 17, from MAPA's reference graph "
        "'torus-2d' (socal-ucr/MAPA on GitHub), 0-based. The reference omits edge "
        "1-5 (GPUs 0-4 here); the paper's figure is a full torus, so it is included, as a single "
        "link like every other vertical edge.",
    )


def cube_mesh_16() -> Topology:
    return mapa_mesh(
        "cube-mesh-16",
        MAPA_CUBE_MESH_16,
        "The 16-GPU cube-mesh of the MAPA paper's Fig. 17, from MAPA's reference graph "
        "'cubeMesh-16' (socal-ucr/MAPA on GitHub), 0-based, with the link types as "
        "declared (the reference's runtime bandwidth map has defects documented there).",
    )


def torus_2d_32() -> Topology:
    return mapa_mesh(
        "torus-2d-32",
        mapa_torus_edges(4, 8),
        "A 32-GPU 2D torus of 4 rows x 8 columns, built the way MAPA's 16-GPU torus-2d "
        "(the paper's Fig. 17a, socal-ucr/MAPA on GitHub) is: each row a path "
        "of double NVLinks closed by a single one, single links down the columns, the first "
        "and last columns closed by double links (mapa_torus_edges; on 4 x 4 it gives "
        "torus-2d-16). Synthetic: no 32-GPU NVLink mesh exists as a product (NVIDIA's 32-GPU "
        "NVLink domains are NVSwitch fabrics, uniform like dgx2); this is the MAPA paper's "
        "'novel topology' at twice the size, for placement at that scale.",
        gpu_count=32,
    )


def minsky_p100() -> Topology:
    nodes = [
        NumaNode(
            id=s,
            cpus=list(range(80 * s, 80 * s + 80)),
            memory_total_bytes=256 * GIB,
            distances={0: 10 if s == 0 else 40, 1: 10 if s == 1 else 40},
        )
        for s in (0, 1)
    ]
    return build(
        "minsky-p100",
        description=(
            "The DRB paper's prototype: an IBM Power System S822LC for HPC ('Minsky'), 2 POWER8 "
            "sockets (10 cores, SMT8) with 2 Tesla P100-SXM2-16GB each. Within a socket the two "
            "GPUs share two NVLink 1 links (40 GB/s); across sockets they talk over the X-bus "
            "(SYS). GPU-to-socket map, 256 GiB per socket and the 10/40 socket distances from the "
            "DRB reference machine (HiEST/gpu-topo-aware on GitHub, 'minsky-infra-1m')."
        ),
        gpu_name="Tesla P100-SXM2-16GB",
        memory_gib=16,
        gpu_numa=[0, 0, 1, 1],
        numa_nodes=nodes,
        nvlinks=pairs_of((0, 1), (2, 3), links=2),
        pcie=lambda a, b: PciePath.NODE if a // 2 == b // 2 else PciePath.SYS,
        nvlink_generation=1,
    )


def single_gpu() -> Topology:
    return build(
        "single-gpu",
        description=(
            "A one-GPU machine (workstation or cloud VM): one NVIDIA A100 80GB PCIe on a 16-core "
            "CPU with HT, one NUMA node of 256 GiB. Synthetic; the smallest host gpualloc handles."
        ),
        gpu_name="NVIDIA A100 80GB PCIe",
        memory_gib=80,
        gpu_numa=[0],
        numa_nodes=x86_sockets(1, 16, 256),
        nvlinks={},
        pcie=lambda a, b: None,
        pcie_generation=4,
    )


BUILDERS: tuple[Callable[[], Topology], ...] = (
    dgx1_p100,
    dgx1_v100,
    dgx2,
    dgx_a100,
    dgx_a100_mig,
    hgx_h100,
    hgx_h100_mig,
    summit_node,
    pcie_8gpu_2socket,
    pcie_32gpu_2socket,
    nvlink_pairs_4gpu,
    a40_nv4_pairs_8gpu,
    torus_2d_16,
    cube_mesh_16,
    torus_2d_32,
    minsky_p100,
    single_gpu,
)


def build_all() -> dict[str, str]:
    """File name -> JSON text for every bundled topology."""
    result = {}
    for builder in BUILDERS:
        topology = builder()
        result[f"{topology.name}.json"] = topology.to_json()
    return result


def main(argv: list[str] | None = None) -> int:
    from generated_files import write_or_check

    return write_or_check(
        __doc__.splitlines()[0],
        lambda: {OUT_DIR / name: text for name, text in build_all().items()},
        argv,
    )


if __name__ == "__main__":
    sys.exit(main())
