"""The hosts the placement-budget tests search: one of 32 GPUs known by a measured bandwidth
matrix alone, where every order search falls back on plain branch and bound."""

from __future__ import annotations

import random

from gpualloc.model import Topology


def measured_32() -> Topology:
    """32 GPUs known by a measured bandwidth matrix alone, every pair its own bandwidth."""
    from gpualloc.discovery.bandwidth_matrix import topology_from_bandwidth_matrix

    rng = random.Random(43)
    matrix = [[0.0] * 32 for _ in range(32)]
    for a in range(32):
        for b in range(a + 1, 32):
            matrix[a][b] = matrix[b][a] = round(rng.uniform(5, 100), 2)
    return topology_from_bandwidth_matrix(matrix, name="measured-32", origin="test")
