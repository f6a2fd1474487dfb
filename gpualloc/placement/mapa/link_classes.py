"""The link classes of a pool of GPUs: step 1 of the exact search (:mod:`.search`).

Pairs of GPUs fall into a few classes, the distinct (MAPA class, bandwidth) combinations of the
host; every edge objective is a function of how many of a pattern's edges land in each. The
search, its bounds (:mod:`.search_bounds`) and its realisation (:mod:`.realise`) all read them,
so they live below all three. O(n^2) in the pool's size.
"""

from __future__ import annotations

from collections.abc import Sequence

from msgspec import Struct

from gpualloc.placement.host_graph import HostGraph
from gpualloc.placement.mapa.objectives import rounded


class LinkClasses(Struct, frozen=True):
    """The distinct (MAPA class, bandwidth) combinations among the pool's pairs."""

    of_pair: tuple[tuple[int, ...], ...]  # class id per GPU pair (-1 on the diagonal)
    mapa: tuple[int, ...]  # MAPA class per class id
    weight: tuple[float, ...]  # bandwidth per class id
    adjacency: tuple[tuple[int, ...], ...]  # per class: bitmask of pool neighbours per GPU


def link_classes(host: HostGraph, pool: Sequence[int]) -> LinkClasses:
    """The classes of the pairs of ``pool``, numbered in the order the pairs first show them."""
    n = host.gpu_count
    ids: dict[tuple[int, float], int] = {}
    of_pair = [[-1] * n for _ in range(n)]
    for i, a in enumerate(pool):
        for b in pool[i + 1 :]:
            label = (host.mapa_class[a][b], rounded(host.bandwidth[a][b]))
            c = ids.setdefault(label, len(ids))
            of_pair[a][b] = of_pair[b][a] = c
    labels = sorted(ids, key=ids.__getitem__)
    adjacency = [[0] * n for _ in labels]
    for a in pool:
        for b in pool:
            if a != b:
                adjacency[of_pair[a][b]][a] |= 1 << b
    return LinkClasses(
        of_pair=tuple(tuple(row) for row in of_pair),
        mapa=tuple(label[0] for label in labels),
        weight=tuple(label[1] for label in labels),
        adjacency=tuple(tuple(row) for row in adjacency),
    )
