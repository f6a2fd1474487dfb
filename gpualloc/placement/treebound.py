"""An upper bound on what a tree pattern's unplaced ranks can still add, for the order search.

The search (:mod:`gpualloc.placement.search`) proves most count vectors unrealisable by counting
links, but on a mesh whose fast links form a tree (the NV2 links of ``cube-mesh-16`` are a
spanning tree with two GPUs of degree 3) counting cannot see why a 16-rank binary tree fits only
12 of its 15 edges on NV2: that needs the shape of both trees. This module supplies it with a
dynamic program over the pattern's rooted subtrees, the classic relaxation of tree embedding
from injective maps to *locally injective* homomorphisms:

``F(v, g, p)`` is the most weight the subtree of rank ``v`` can carry when ``v`` sits on GPU
``g`` and its parent on GPU ``p``, where the children of ``v`` go to distinct GPUs other than
``g`` and ``p``, each child's subtree again under the same rule. A real placement is injective,
so it is one of these maps and ``F`` bounds it; GPUs far apart in the pattern may coincide in
the relaxation, which is what keeps it cheap: ``O(k n^2)`` for ``k`` ranks on ``n`` GPUs,
computed once per search, shared between subtrees of the same shape. Into tree-shaped links a
locally injective map of a connected pattern is injective (a walk that never turns back is a
path), so a relaxed map that keeps every edge on such links is a real placement; mixed with other
links the bound is still far tighter than degree counting (675 GB/s against 750 for the 16-rank
tree on ``cube-mesh-16``, where the optimum is 650.2).

During the search the GPUs already used are excluded as well, which tightens the bound as the
placement grows. Children are kept distinct exactly for up to two children of a rank (every
built-in pattern); wider ranks of a custom tree relax that, which stays an upper bound.
"""

from __future__ import annotations

from collections.abc import Sequence

Candidates = tuple[tuple[float, int], ...]  # (value, GPU), best first


class TreeWeightBound:
    """The locally injective relaxation of a forest pattern placed on a pool of GPUs.

    ``parent[s]`` is the position of rank ``s``'s parent in the search's visiting order (None
    for a component's root), every parent coming before its children; ``weight[a][b]`` is the
    weight the search counts for a pattern edge on GPUs ``a`` and ``b``.
    """

    def __init__(
        self,
        parent: Sequence[int | None],
        pool: Sequence[int],
        weight: Sequence[Sequence[float]],
    ) -> None:
        k = len(parent)
        self.pool = tuple(pool)
        self.children: list[tuple[int, ...]] = [
            tuple(c for c in range(k) if parent[c] == p) for p in range(k)
        ]
        shapes = [self._shape(p) for p in range(k)]
        # Per position with a parent: for each GPU of the parent, the child's value on every
        # other GPU h (the edge to h plus the child's subtree below h), best first.
        self.candidates: list[dict[int, Candidates]] = [{} for _ in range(k)]
        table_of_shape: dict[tuple, dict[int, dict[int | None, float]]] = {}
        candidates_of_shape: dict[tuple, dict[int, Candidates]] = {}
        self.root_best: list[float] = [0.0] * k
        for v in range(k - 1, -1, -1):  # children before parents
            shape = shapes[v]
            if shape not in table_of_shape:
                table_of_shape[shape] = self._subtree_table(v)
            table = table_of_shape[shape]
            if parent[v] is None:
                self.root_best[v] = max((table[g][None] for g in self.pool), default=0.0)
            elif shape not in candidates_of_shape:
                candidates_of_shape[shape] = {
                    a: tuple(
                        sorted(
                            ((weight[a][h] + table[h][a], h) for h in self.pool if h != a),
                            reverse=True,
                        )
                    )
                    for a in self.pool
                }
            if parent[v] is not None:
                self.candidates[v] = candidates_of_shape[shape]
        # Per step s (positions below s placed): the placed ranks with children still to place,
        # and what the components not started yet can carry.
        self.frontier = [
            tuple(
                (p, tuple(c for c in self.children[p] if c >= s))
                for p in range(s)
                if any(c >= s for c in self.children[p])
            )
            for s in range(k + 1)
        ]
        self.unstarted = [
            sum(self.root_best[v] for v in range(s, k) if parent[v] is None) for s in range(k + 1)
        ]

    def _shape(self, v: int) -> tuple:
        return tuple(sorted(self._shape(c) for c in self.children[v]))

    def _subtree_table(self, v: int) -> dict[int, dict[int | None, float]]:
        """``F(v, g, p)`` for every GPU ``g`` of the pool and parent GPU ``p`` (None: a root)."""
        children = self.children[v]
        if not children:
            zero = dict.fromkeys((*self.pool, None), 0.0)
            return dict.fromkeys(self.pool, zero)
        table: dict[int, dict[int | None, float]] = {}
        for g in self.pool:
            lists = [self.candidates[c][g] for c in children]
            row: dict[int | None, float] = {None: best_children(lists, 0)}
            for p in self.pool:
                if p != g:
                    row[p] = best_children(lists, 1 << p)
            table[g] = row
        return table

    def whole(self) -> float:
        """The most weight any placement of the whole pattern can carry."""
        return self.unstarted[0]

    def remaining(self, s: int, assigned: Sequence[int], used: int) -> float:
        """The most weight the ranks at positions ``s..k-1`` can add when those below sit on
        ``assigned`` and the GPUs in ``used`` (a bitmask) are taken."""
        total = self.unstarted[s]
        candidates = self.candidates
        for p, children in self.frontier[s]:
            on = assigned[p]
            total += best_children([candidates[c][on] for c in children], used)
        return total


def best_children(lists: Sequence[Candidates], excluded: int) -> float:
    """The best total of one candidate per list on GPUs outside ``excluded`` (a bitmask),
    distinct GPUs for up to two lists; more lists take each one's best (an upper bound)."""
    if len(lists) == 2:
        first = _two_best(lists[0], excluded)
        second = _two_best(lists[1], excluded)
        if not first or not second:
            return float("-inf")
        (a1, g1), (b1, h1) = first[0], second[0]
        if g1 != h1:
            return a1 + b1
        options = [a1 + second[1][0]] if len(second) > 1 else []
        if len(first) > 1:
            options.append(first[1][0] + b1)
        return max(options, default=float("-inf"))
    total = 0.0
    for candidates in lists:
        found = _two_best(candidates, excluded)
        if not found:
            return float("-inf")
        total += found[0][0]
    return total


def _two_best(candidates: Candidates, excluded: int) -> list[tuple[float, int]]:
    found: list[tuple[float, int]] = []
    for value, h in candidates:
        if not excluded >> h & 1:
            found.append((value, h))
            if len(found) == 2:
                break
    return found
