"""The candidate sets of a placement: every k-set of the free GPUs that holds the required ones,
in lexicographic order (the order every policy's tie-break relies on)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import combinations


def candidate_sets(
    pool: Sequence[int], required: frozenset[int], k: int
) -> Iterable[tuple[int, ...]]:
    """Every k-set of ``pool`` containing ``required``, in lexicographic order of sorted sets.

    Merging a fixed set into lexicographically ordered combinations keeps them in lexicographic
    order, so ``itertools.combinations`` (C speed) does the enumeration.
    """
    others = [g for g in pool if g not in required]
    need = k - len(required)
    if need < 0:
        return ()
    if not required:
        return combinations(others, need)
    base = tuple(sorted(required))
    return (tuple(sorted(base + extra)) for extra in combinations(others, need))
