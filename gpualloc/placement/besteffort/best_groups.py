"""Per GPU, the highest score of a group of a given size holding it: the table behind the share
bound of :mod:`.partition` (go-gpuallocator's best-effort partitions), found by a pruned walk
instead of scoring every group (``tests/test_partition_search.py`` holds it to scoring every
group)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence


class _TooManyNodes(Exception):
    """The walk of :func:`best_group_scores` outgrew its ``max_nodes``."""


def best_group_scores(
    weights: Sequence[Sequence[int]],
    size: int,
    max_nodes: float = math.inf,
    tick: Callable[[], None] = lambda: None,
) -> list[int] | None:
    """Per GPU, the highest score (sum of pair scores, which are not negative) of a group of
    ``size`` (at most the GPUs') holding it; None if that took more than ``max_nodes`` nodes of
    the walk (``tick`` is called at each).

    A depth-first walk over the groups in lexicographic order, each group's score built member
    by member (a node keeps each candidate's weight to the members so far), a member's best
    being the best of the subtrees below the node that took it. A greedy group per GPU seeds
    the bests, and a subtree is cut when no group in it can beat the best of any GPU it could
    hold: its members and candidates. The bound is the one the partition search's group walk
    uses: of ``t`` members still to come, each adds its weight to the members so far and at
    most half its ``t - 1`` largest pair scores. The bests are exact (a cut subtree changes
    none). Groups of 7 of 16 GPUs: about 1,700 nodes on the meshes, for the 11,440 groups (on
    ``dgx2`` 131 nodes).
    """
    n = len(weights)
    top_sums = []  # per GPU, the sums of its j largest pair scores
    for v in range(n):
        sums = [0]
        for value in sorted((weights[v][u] for u in range(n) if u != v), reverse=True):
            sums.append(sums[-1] + value)
        top_sums.append(sums)
    best = [_greedy_group_score(weights, v, size) for v in range(n)]
    nodes = 0

    def visit(candidates: list[int], gained: list[int], need: int, value: int, floor: int) -> int:
        """The best score below this node, whose members score ``value``, ``floor`` being the
        lowest best among them (at the root, with none, the highest of all); ``gained[i]``:
        the weight of ``candidates[i]`` to those members. -1 where the subtree is cut."""
        nonlocal nodes
        nodes += 1
        if nodes > max_nodes:
            raise _TooManyNodes
        tick()
        most = -1
        if need == 1:
            for gpu, extra in zip(candidates, gained, strict=True):
                score = value + extra
                if score > best[gpu]:
                    best[gpu] = score
                if score > most:
                    most = score
            return most
        # Twice the bound, in integers.
        pairs = zip(candidates, gained, strict=True)
        adds = sorted((2 * extra + top_sums[gpu][need - 1] for gpu, extra in pairs), reverse=True)
        bound = 2 * value + sum(adds[:need])
        if bound <= 2 * floor and all(bound <= 2 * best[gpu] for gpu in candidates):
            return -1
        for i in range(len(candidates) - need + 1):
            gpu, row, rest = candidates[i], weights[candidates[i]], candidates[i + 1 :]
            below = visit(
                rest,
                [extra + row[other] for extra, other in zip(gained[i + 1 :], rest, strict=True)],
                need - 1,
                value + gained[i],
                min(floor, best[gpu]),
            )
            if below > best[gpu]:
                best[gpu] = below
            if below > most:
                most = below
        return most

    try:
        visit(list(range(n)), [0] * n, size, 0, max(best))
    except _TooManyNodes:
        return None
    return best


def _greedy_group_score(weights: Sequence[Sequence[int]], first: int, size: int) -> int:
    """The score of a group of ``size`` grown from ``first`` by the GPU of largest weight to
    the members so far (the lowest on a tie): a score some group holding ``first`` has."""
    n = len(weights)
    gained = list(weights[first])
    free = [v for v in range(n) if v != first]
    score = 0
    for _ in range(size - 1):
        chosen = max(free, key=gained.__getitem__)
        score += gained[chosen]
        free.remove(chosen)
        row = weights[chosen]
        for v in free:
            gained[v] += row[v]
    return score
