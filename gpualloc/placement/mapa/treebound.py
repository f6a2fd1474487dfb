"""An upper bound on what a tree pattern's unplaced ranks can still add, for the order search.

The search (:mod:`.search`) proves most count vectors unrealisable by counting
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

**Penalties (Lagrangian relaxation of injectivity).** Where the links close cycles (a torus), the
relaxed map wraps around them, putting several ranks on the best GPUs. A penalty ``λ_g`` per GPU
is charged for every rank the relaxed map puts on ``g``, and the most a real completion could be
charged is credited back: it puts one rank on each of ``r`` distinct free GPUs, so at most the
``r`` largest penalties among them (or, with candidate sets, the largest sum over the rest of a
set). The bound stays valid for penalties of either sign and, tuned by subgradient steps
(:func:`lagrangian_bound`, the method Held and Karp used for the travelling salesman's 1-trees),
prices the wrapping out: the 14-rank tree on 14 GPUs of ``torus-2d-16`` is bounded at about 528
GB/s after 15 steps (523.5 at best) instead of 562.6, where the optimum is 512.8.

During the search the GPUs already used are excluded as well, which tightens the bound as the
placement grows. Children are kept distinct exactly for up to two children of a rank (every
built-in pattern); wider ranks of a custom tree relax that, which stays an upper bound.
"""

from __future__ import annotations

from collections.abc import Sequence

Candidates = tuple[tuple[float, int], ...]  # (value, GPU), best first
Pick = tuple[float, tuple[int, ...]]  # (value, the children's GPUs)
_NEGATIVE = float("-inf")
_NONE: Pick = (_NEGATIVE, ())


class TreeWeightBound:
    """The locally injective relaxation of a forest pattern placed on a pool of GPUs.

    ``parent[s]`` is the position of rank ``s``'s parent in the search's visiting order (None
    for a component's root), every parent coming before its children; ``weight[a][b]`` is the
    weight the search counts for a pattern edge on GPUs ``a`` and ``b``; ``penalty[g]`` (indexed
    like ``weight``, any sign) the Lagrangian price of a rank on GPU ``g``; ``allowed`` the
    candidate sets (bitmasks) a placement must be one of, if any.
    """

    def __init__(
        self,
        parent: Sequence[int | None],
        pool: Sequence[int],
        weight: Sequence[Sequence[float]],
        penalty: Sequence[float] | None = None,
        allowed: Sequence[int] | None = None,
    ) -> None:
        k = len(parent)
        self.k = k
        self.pool = tuple(pool)
        self.pool_mask = sum(1 << g for g in self.pool)
        self.penalty = list(penalty) if penalty is not None else [0.0] * len(weight)
        self.penalised = any(self.penalty[g] for g in self.pool)
        # The candidate sets a placement must be one of (bitmasks), with their penalties summed.
        self.allowed = tuple(allowed) if allowed is not None else None
        self.allowed_penalty = tuple(
            sum(self.penalty[g] for g in self.pool if mask >> g & 1) for mask in self.allowed or ()
        )
        self.by_penalty = sorted(self.pool, key=lambda g: (-self.penalty[g], g))
        self.parent = tuple(parent)
        self.children: list[tuple[int, ...]] = [
            tuple(c for c in range(k) if parent[c] == p) for p in range(k)
        ]
        self.shape = shapes = [self._shape(p) for p in range(k)]
        # Children in the order of their shapes: subtrees of one shape share a table, whose
        # picks list the children's GPUs in this order.
        self.by_shape = [tuple(sorted(self.children[v], key=shapes.__getitem__)) for v in range(k)]
        # Per position with a parent: for each GPU of the parent, the child's value on every
        # other GPU h (the edge to h, less h's penalty, plus the child's subtree below h).
        self.candidates: list[dict[int, Candidates]] = [{} for _ in range(k)]
        self.tables: dict[tuple, tuple[dict[int, Pick], dict[int, dict[int, Pick]]]] = {}
        candidates_of_shape: dict[tuple, dict[int, Candidates]] = {}
        self.root_best: list[float] = [0.0] * k
        self.root_gpu: list[int | None] = [None] * k
        pen = self.penalty
        for v in range(k - 1, -1, -1):  # children before parents
            shape = shapes[v]
            if shape not in self.tables:
                self.tables[shape] = self._subtree_table(v)
            best, alternatives = self.tables[shape]
            if parent[v] is None:
                scored = [(best[g][0] - pen[g], -g) for g in self.pool]
                value, minus_g = max(scored, default=(0.0, 1))
                self.root_best[v], self.root_gpu[v] = value, -minus_g
            elif shape not in candidates_of_shape:
                candidates_of_shape[shape] = {
                    a: tuple(
                        sorted(
                            (
                                (weight[a][h] - pen[h] + alternatives[h].get(a, best[h])[0], h)
                                for h in self.pool
                                if h != a
                            ),
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

    def _subtree_table(self, v: int) -> tuple[dict[int, Pick], dict[int, dict[int, Pick]]]:
        """Per GPU ``g`` of the pool: ``F(v, g, None)`` with the children's GPUs that reach it,
        and ``F(v, g, p)`` for the parent GPUs ``p`` that change it (the picked ones; any other
        parent leaves the best picks available)."""
        children = self.by_shape[v]
        best: dict[int, Pick] = {}
        alternatives: dict[int, dict[int, Pick]] = {}
        for g in self.pool:
            if not children:
                best[g], alternatives[g] = (0.0, ()), {}
                continue
            lists = [self.candidates[c][g] for c in children]
            best[g] = top = best_pick(lists, 0)
            alternatives[g] = {p: best_pick(lists, 1 << p) for p in set(top[1])}
        return best, alternatives

    def whole(self) -> float:
        """The most weight any placement of the whole pattern can carry."""
        return self.unstarted[0] + self.credit(0, 0, self.pool_mask)

    def remaining(
        self, s: int, assigned: Sequence[int], used: int, free: int | None = None
    ) -> float:
        """The most weight the ranks at positions ``s..k-1`` can add when those below sit on
        ``assigned`` and the GPUs in ``used`` (a bitmask) are taken; only those in ``free``
        (default: the rest of the pool) may take the others."""
        if free is None:
            free = self.pool_mask & ~used
        total = self.unstarted[s]
        if self.penalised:
            total += self.credit(s, used, free)
        candidates = self.candidates
        excluded = ~free
        for p, children in self.frontier[s]:
            on = assigned[p]
            if len(children) == 2:
                total += best_pair(
                    candidates[children[0]][on], candidates[children[1]][on], excluded
                )
            else:
                total += best_children([candidates[c][on] for c in children], excluded)
        return total

    def credit(self, s: int, used: int, free: int) -> float:
        """The penalties credited back to ranks ``s..k-1``: the most their GPUs' penalties can
        sum to, one rank on each. That is the ``k - s`` largest penalties of the free GPUs, or
        with candidate sets, the largest sum over the rest of a set holding every GPU used."""
        if not self.penalised:
            return 0.0
        penalty = self.penalty
        if self.allowed is not None:
            spent = 0.0
            rest = used & self.pool_mask
            while rest:
                low = rest & -rest
                spent += penalty[low.bit_length() - 1]
                rest ^= low
            fits = [
                total
                for mask, total in zip(self.allowed, self.allowed_penalty, strict=True)
                if not used & ~mask
            ]
            return max(fits, default=float("-inf")) - spent
        left = self.k - s
        total = 0.0
        for g in self.by_penalty:
            if not left:
                break
            if free >> g & 1:
                total += penalty[g]
                left -= 1
        return total

    def credited_gpus(self) -> set[int]:
        """The GPUs whose penalties :meth:`whole` credits (its subgradient's other half)."""
        if self.allowed is not None:
            best = max(range(len(self.allowed)), key=self.allowed_penalty.__getitem__)
            return {g for g in self.pool if self.allowed[best] >> g & 1}
        return set(self.by_penalty[: self.k])

    def relaxed_use(self) -> list[int]:
        """How many ranks the relaxed optimum of the whole pattern puts on each GPU (indexed like
        ``penalty``): the subgradient of :func:`lagrangian_bound`."""
        use = [0] * len(self.penalty)
        stack: list[tuple[int, int, int | None]] = [
            (v, g, None) for v, g in enumerate(self.root_gpu) if g is not None
        ]
        while stack:
            v, g, p = stack.pop()
            use[g] += 1
            best, alternatives = self.tables[self.shape[v]]
            picks = alternatives[g].get(p, best[g])[1] if p is not None else best[g][1]
            stack.extend((c, h, g) for c, h in zip(self.by_shape[v], picks, strict=False))
        return use


def lagrangian_bound(
    parent: Sequence[int | None],
    pool: Sequence[int],
    weight: Sequence[Sequence[float]],
    aim: float,
    rounds: int,
    allowed: Sequence[int] | None = None,
) -> TreeWeightBound:
    """The tightest :class:`TreeWeightBound` found by ``rounds`` subgradient steps on the
    per-GPU penalties (Held and Karp's method for the 1-tree bound of the travelling salesman).

    The bound is ``relaxed(λ) + credit(λ)``; its subgradient in ``λ_g`` is whether ``g`` is
    credited less the number of ranks the relaxed optimum puts on ``g``. Steps follow Polyak's
    rule towards ``aim`` (the weight of some real placement, below the bound), halving their
    scale when three in a row bring no improvement.
    """
    penalty = [0.0] * len(weight)
    best = current = TreeWeightBound(parent, pool, weight, penalty, allowed)
    scale = 1.0
    stalled = 0
    for _ in range(rounds):
        value = current.whole()
        if value < best.whole():
            best, stalled = current, 0
        elif current is not best:
            stalled += 1
            if stalled >= 3:
                scale, stalled = scale / 2, 0
        use = current.relaxed_use()
        credited = current.credited_gpus()
        gradient = [(g in credited) - use[g] for g in pool]
        norm = sum(step * step for step in gradient)
        if not norm or value <= aim:
            break  # the bound is reached by a real placement: nothing tighter exists
        length = scale * (value - aim) / norm
        for g, step in zip(pool, gradient, strict=True):
            penalty[g] -= length * step
        current = TreeWeightBound(parent, pool, weight, penalty, allowed)
    if current.whole() < best.whole():
        best = current
    return best


def best_pick(lists: Sequence[Candidates], excluded: int) -> Pick:
    """The best total of one candidate per list on GPUs outside ``excluded`` (a bitmask), with
    the GPUs picked: distinct GPUs for up to two lists; more lists take each one's best (an
    upper bound)."""
    if len(lists) == 2:
        a1, g1, a2, g2 = _two_best(lists[0], excluded)
        b1, h1, b2, h2 = _two_best(lists[1], excluded)
        if g1 < 0 or h1 < 0:
            return _NONE
        if g1 != h1:
            return (a1 + b1, (g1, h1))
        options = [(a1 + b2, (g1, h2)), (a2 + b1, (g2, h1))]
        return max((o for o in options if o[0] > _NEGATIVE), default=_NONE)
    total = 0.0
    picks = []
    for candidates in lists:
        value, g, _, _ = _two_best(candidates, excluded)
        if g < 0:
            return _NONE
        total += value
        picks.append(g)
    return (total, tuple(picks))


def best_children(lists: Sequence[Candidates], excluded: int) -> float:
    """The value of :func:`best_pick` (the search's hot path: no picks kept)."""
    if len(lists) == 2:
        return best_pair(lists[0], lists[1], excluded)
    total = 0.0
    for candidates in lists:
        value, g, _, _ = _two_best(candidates, excluded)
        if g < 0:
            return _NEGATIVE
        total += value
    return total


def best_pair(first: Candidates, second: Candidates, excluded: int) -> float:
    """:func:`best_children` of two lists: the best pair on distinct GPUs outside ``excluded``
    (-inf when a list has none)."""
    a1, g1, a2, _ = _two_best(first, excluded)
    b1, h1, b2, _ = _two_best(second, excluded)
    if g1 < 0 or h1 < 0:
        return _NEGATIVE
    if g1 != h1:
        return a1 + b1
    return max(a1 + b2, a2 + b1)


def _two_best(candidates: Candidates, excluded: int) -> tuple[float, int, float, int]:
    """The first two candidates outside ``excluded`` as (value, GPU, value, GPU); a missing one
    is (-inf, -1). A tuple, not a list: this runs at every node of the search."""
    value1, gpu1 = _NEGATIVE, -1
    for value, g in candidates:
        if not excluded >> g & 1:
            if gpu1 < 0:
                value1, gpu1 = value, g
            else:
                return value1, gpu1, value, g
    return value1, gpu1, _NEGATIVE, -1


def greedy_weight(
    parent: Sequence[int | None], pool: Sequence[int], weight: Sequence[Sequence[float]], k: int
) -> float:
    """The weight of a real placement built greedily (a lower bound on the optimum, which
    :func:`lagrangian_bound` aims its steps at): the first rank on each GPU of the pool in turn,
    every other rank on the free GPU with the widest link to its parent's (a later root on the
    lowest free GPU); the best of these, ``O(k n^2)``."""
    best = float("-inf")
    for first in pool:
        free = [g for g in pool if g != first]
        on = [first]
        total = 0.0
        for s in range(1, k):
            p = parent[s]
            if p is None:
                g = free[0]
            else:
                row = weight[on[p]]
                g = max(free, key=lambda h: (row[h], -h))
                total += row[g]
            free.remove(g)
            on.append(g)
        best = max(best, total)
    return best
