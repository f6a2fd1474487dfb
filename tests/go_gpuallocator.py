"""go-gpuallocator's partition enumeration, literally: the reference the tests compare with."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import combinations


def literal_partitions(slots: list[int], k: int, padding: int, n: int) -> Iterator[list[tuple]]:
    """``iterateGPUPartitions``: every partition of ``slots`` into groups of ``k``, in its order.

    Slots ``>= n`` are padding; a group holds none or all of it.
    """
    if not slots:
        yield []
        return
    first, others = slots[0], slots[1:]
    for rest in combinations(others, k - 1):
        group = (first, *rest)
        pads = sum(1 for i in group if i >= n)
        if pads not in (0, padding):
            continue
        left = [i for i in others if i not in rest]
        for tail in literal_partitions(left, k, padding, n):
            yield [group, *tail]


def literal_best(weights, k, required):
    """The partition go-gpuallocator picks, by the literal enumeration: of the partitions with
    a group of real GPUs holding every ``required`` one, the first of the highest total score;
    each group as its bit set of GPUs and whether it holds padding."""
    n = len(weights)
    padding = (-n) % k

    def score(group):
        real = [i for i in group if i < n]
        return sum(weights[a][b] for a, b in combinations(real, 2))

    def qualifies(group):
        return all(i < n for i in group) and required <= set(group)

    best, best_total = None, None
    for candidate in literal_partitions(list(range(n + padding)), k, padding, n):
        if not any(qualifies(g) for g in candidate):
            continue
        total = sum(score(g) for g in candidate)
        if best is None or total > best_total:
            best, best_total = candidate, total
    return [(sum(1 << i for i in g if i < n), any(i >= n for i in g)) for g in best]
