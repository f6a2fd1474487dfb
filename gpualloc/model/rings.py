"""The fastest ring through a set of GPUs: what a ring all-reduce (NCCL's) runs at.

NCCL orders the GPUs of its rings itself, so a set's ring runs at the best bottleneck any
Hamiltonian cycle through it reaches. Used by the runtime model (:mod:`gpualloc.simulate.
runtime`) and by the predicted-against-measured comparison (:mod:`gpualloc.measurements.
compare`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from gpualloc.model.bandwidth import DEFAULT_BANDWIDTH_TABLE, BandwidthTable

if TYPE_CHECKING:
    from gpualloc.model.topology import Topology


def best_ring_gbps(gpus: Sequence[int], bandwidth: Callable[[int, int], float]) -> float:
    """The highest slowest-link bandwidth of a ring through all of ``gpus`` (the bottleneck
    Hamiltonian cycle): the fastest threshold whose links still close a ring, found by a
    bitmask walk over the set (O(2^k k) per threshold)."""
    k = len(gpus)
    if k == 2:
        return bandwidth(gpus[0], gpus[1])
    pairs = {(i, j): bandwidth(gpus[i], gpus[j]) for i, j in itertools.combinations(range(k), 2)}
    for threshold in sorted(set(pairs.values()), reverse=True):
        near = [0] * k
        for (i, j), gbps in pairs.items():
            if gbps >= threshold:
                near[i] |= 1 << j
                near[j] |= 1 << i
        if _closes_a_ring(near):
            return threshold
    return min(pairs.values())


def _closes_a_ring(near: list[int]) -> bool:
    """Whether the graph (adjacency bitmasks) has a cycle through every vertex: paths from
    vertex 0, by the set they cover and the vertex they end at."""
    k = len(near)
    full = (1 << k) - 1
    ends = {1: 1}  # covered set -> bitmask of the vertices a path from 0 over it can end at
    for _ in range(k - 1):
        grown: dict[int, int] = {}
        for covered, at in ends.items():
            for v in range(k):
                if at >> v & 1:
                    step = near[v] & ~covered
                    while step:
                        u = step & -step
                        step ^= u
                        grown[covered | u] = grown.get(covered | u, 0) | u
        ends = grown
    return any(at & near[0] for covered, at in ends.items() if covered == full)


def allreduce_busbw_gbps(
    topology: Topology,
    gpus: Sequence[int],
    table: BandwidthTable = DEFAULT_BANDWIDTH_TABLE,
    *,
    peer_to_peer: bool = True,
) -> float:
    """The bus bandwidth NCCL's all-reduce reaches over ``gpus`` (nccl-tests' ``busbw``): the
    best ring's slowest link, scaled by :attr:`BandwidthTable.nccl_nvlink_efficiency` when a
    ring that fast runs over NVLink alone, and by :attr:`BandwidthTable.nccl_staged_efficiency`
    when a pair on it has no peer access (NCCL stages through host memory). No recording
    measures NCCL over PCIe peer links yet: those are unscaled. A faster PCIe pair beside the
    ring changes nothing. ``peer_to_peer`` False: as under ``NCCL_P2P_DISABLE=1``, every pair
    staged."""
    if not peer_to_peer:
        ring = best_ring_gbps(gpus, lambda a, b: staged_pair_gbps(topology, a, b, table))
        return ring * table.nccl_staged_efficiency

    def bandwidth(a: int, b: int) -> float:
        return topology.link(a, b).bandwidth_gbps

    ring = best_ring_gbps(gpus, bandwidth)
    if _ring_over_nvlink(topology, gpus, ring):
        return ring * table.nccl_nvlink_efficiency
    staged = [
        (a, b)
        for i, a in enumerate(gpus)
        for b in gpus[i + 1 :]
        if topology.link(a, b).peer_access is False and bandwidth(a, b) <= ring
    ]
    return ring * table.nccl_staged_efficiency if staged else ring


def staged_pair_gbps(
    topology: Topology, a: int, b: int, table: BandwidthTable = DEFAULT_BANDWIDTH_TABLE
) -> float:
    """What a copy between ``a`` and ``b`` staged through host memory reaches (no peer
    access, whatever the pair has), by the PCIe path between them."""
    from msgspec.structs import replace

    from gpualloc.model.topology import pair_bandwidth_gbps

    link = replace(topology.link(a, b), nvlinks=0, peer_access=False)
    return pair_bandwidth_gbps(list(topology.gpus), link, table)


def _ring_over_nvlink(topology: Topology, gpus: Sequence[int], ring: float) -> bool:
    """Whether NVLinks of at least ``ring`` GB/s alone close a ring through ``gpus``."""
    k = len(gpus)
    if k < 2:
        return False

    def nvlink_at_least(i: int, j: int) -> bool:
        link = topology.link(gpus[i], gpus[j])
        return bool(link.nvlinks) and link.bandwidth_gbps >= ring

    if k == 2:
        return nvlink_at_least(0, 1)
    near = [0] * k
    for i, j in itertools.combinations(range(k), 2):
        if nvlink_at_least(i, j):
            near[i] |= 1 << j
            near[j] |= 1 << i
    return _closes_a_ring(near)
