"""Symmetries of a host: permutations of its GPUs that keep every pair's link class.

A permutation ``σ`` of the GPUs with ``class(σ(a), σ(b)) = class(a, b)`` for every pair (the same
bandwidth and the same MAPA class) maps every placement on a set ``S`` to one on ``σ(S)`` with the
same links, so the best key of an edge objective is the same on both sets. MAPA's Preserve
tie-break (:mod:`gpualloc.placement.policies.mapa`) uses this to refute better keys on one set
per orbit instead of on every tied set: on ``torus-2d-16`` the 14 sets that leave one NV2 pair
free fall into 5 orbits of the torus's 4 symmetries.

The group can be huge (every permutation of an NVSwitch host's GPUs is one), so the search stops
after ``limit`` permutations or ``max_nodes`` steps: any subset of the group is still sound, it
only merges fewer sets.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from gpualloc.placement.host_graph import HostGraph

Permutation = tuple[int, ...]


def host_symmetries(host: HostGraph, limit: int = 64, max_nodes: int = 20_000) -> list[Permutation]:
    """Permutations of the host's GPUs that preserve every pair's bandwidth and MAPA class, the
    identity first; at most ``limit`` of them, found by a backtracking search of at most
    ``max_nodes`` steps (GPU by GPU, each image checked against the GPUs already mapped)."""
    n = host.gpu_count
    link = [[(host.bandwidth[a][b], host.mapa_class[a][b]) for b in range(n)] for a in range(n)]
    # A GPU can only map to one with the same multiset of links.
    signature = [tuple(sorted(link[a][b] for b in range(n) if b != a)) for a in range(n)]
    found: list[Permutation] = []
    image: list[int] = []
    taken = [False] * n
    nodes = 0

    def extend() -> bool:
        """False once the search must stop (enough found, or out of steps)."""
        nonlocal nodes
        a = len(image)
        if a == n:
            found.append(tuple(image))
            return len(found) < limit
        for g in range(n):
            nodes += 1
            if nodes > max_nodes:
                return False
            if taken[g] or signature[g] != signature[a]:
                continue
            row, mapped = link[a], link[g]
            if all(row[b] == mapped[image[b]] for b in range(a)):
                image.append(g)
                taken[g] = True
                go_on = extend()
                image.pop()
                taken[g] = False
                if not go_on:
                    return False
        return True

    extend()
    return found or [tuple(range(n))]


def set_orbits(
    sets: Sequence[tuple[int, ...]], symmetries: Sequence[Permutation]
) -> list[list[tuple[int, ...]]]:
    """``sets`` grouped by the symmetries (each group's first set is its lowest in ``sets``'
    order); two sets are grouped when a symmetry maps one onto the other."""
    index = {tuple(sorted(s)): i for i, s in enumerate(sets)}
    group_of: dict[int, int] = {}
    groups: list[list[tuple[int, ...]]] = []
    for i, gpus in enumerate(sets):
        if i in group_of:
            continue
        group_of[i] = len(groups)
        members = [gpus]
        for sigma in symmetries:
            j = index.get(tuple(sorted(sigma[g] for g in gpus)))
            if j is not None and j not in group_of:
                group_of[j] = len(groups)
                members.append(sets[j])
        groups.append(members)
    return groups


@functools.lru_cache(maxsize=8)
def cached_host_symmetries(host: HostGraph) -> tuple[Permutation, ...]:
    """:func:`host_symmetries` with its defaults, once per host (the order search asks per
    vector)."""
    return tuple(host_symmetries(host))


def orbit_masks(host: HostGraph, pool_mask: int, required_mask: int) -> list[int]:
    """Per GPU, a mask of its images under the host's symmetries (:func:`host_symmetries`)
    that map the pool onto itself and the required GPUs onto themselves: a placement whose
    rank r sits on g maps to one with the same links whose rank r sits on each of them."""
    n = host.gpu_count
    orbits = [1 << g for g in range(n)]
    for sigma in cached_host_symmetries(host)[1:]:
        if _image(sigma, pool_mask) != pool_mask or _image(sigma, required_mask) != required_mask:
            continue
        for g in range(n):
            if pool_mask >> g & 1:
                orbits[g] |= 1 << sigma[g]
    return orbits


def _image(sigma: Permutation, mask: int) -> int:
    image = 0
    while mask:
        low = mask & -mask
        image |= 1 << sigma[low.bit_length() - 1]
        mask ^= low
    return image
