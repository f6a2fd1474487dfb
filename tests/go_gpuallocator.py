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
