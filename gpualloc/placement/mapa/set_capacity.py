"""Set-level capacity: which whole sets of GPUs could still carry a count vector.

The order search (:mod:`.realise`) finds its answer early and then spends most of its nodes
proving that no lexicographically lower set reaches the same key (an 11-GPU ring on an empty
``torus-2d-16``: the answer at node 86, 6,761 nodes after it). Such a set agrees with the
incumbent's up to its first GPU outside it, so it holds the incumbent's lowest GPUs (the
*forced* ones) and the GPUs placed so far: near the end of a proof only a few sets remain, and
most of them cannot carry the vector at all, whatever the order.

:class:`SetCapacity` checks one set ``T`` against the vector with the bounds of
:meth:`~.search_bounds.VectorBounds._class_group_capacities`, taken on ``T``
instead of the pool: for each group of link classes, the pattern edges its links carry are at
most half of the best pairing of the ranks' degrees with the GPUs' neighbour counts inside
``T`` (largest with largest; ``min(d, t)`` ends each), and a connected pattern spread over
``g`` components of the group's links inside ``T`` loses ``g - 1`` edges to other classes (a
2-edge-connected one, a ring, ``g``). :meth:`SetCapacity.completions` lists the sets that a
partial placement can still reach when they are few, and returns the GPUs they offer.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations
from math import comb

from gpualloc.placement.mapa.pattern_graphs import components_of, edges_cut

MAX_SETS = 120
"""Sets listed per check at most; beyond, the check says nothing (the DFS goes on as before)."""


class SetCapacity:
    """Whether a set of GPUs can carry a count vector, on any order (see the module)."""

    def __init__(
        self,
        pool_mask: int,
        groups: Sequence[tuple[tuple[int, ...], tuple[int, ...], int]],
        vector: Sequence[int],
        degrees: Sequence[int],
        edges: int,
        ring_like: bool | None,
    ) -> None:
        self.pool_mask = pool_mask
        self.checks = []
        self.spread_checks = []
        for members, masks, _ in groups:
            want = sum(vector[c] for c in members)
            if want:
                self.checks.append((want, masks))
                components = components_of(masks, pool_mask)
                # Too few components to lose what the vector leaves: it never refutes.
                spanned = min(len(degrees), len(components))
                if want > edges - edges_cut(spanned, ring_like):
                    self.spread_checks.append((want, masks, components))
        self.degrees = sorted(degrees, reverse=True)
        self.uniform = self.degrees[0] if len(set(self.degrees)) == 1 else 0
        """The degree of every rank when they are all alike (a ring's 2), else 0."""
        self.edges = edges
        self.ring_like = ring_like
        self.known: dict[int, bool] = {}

    def spread_ok(self, fixed: int, open_mask: int, size: int) -> bool:
        """Whether some set of ``size`` GPUs holding ``fixed`` (a mask) and taking the rest
        from ``open_mask`` can carry the vector by the components bound: it spans at least the
        components of each group's links (on the pool) that ``fixed`` touches, and more when
        those cannot supply the rest; spanning ``g`` of them loses ``g - 1`` edges (``g`` on a
        ring). This needs no listing of sets: a PCIe host's 16-GPU ring of 12 switch edges
        must take 4 whole switches, and without this a partial placement that touched a broken
        one is searched to the end (``tests/test_placement_speed_sets.py`` holds the bound to
        every realising set)."""
        ring_like, edges = self.ring_like, self.edges
        if ring_like is None:
            return True
        need = size - fixed.bit_count()
        for want, _, components in self.spread_checks:
            touched = 0
            count = 0
            for component in components:
                if component & fixed:
                    touched |= component
                    count += 1
            left = need - (touched & open_mask).bit_count()
            if left > 0:
                sizes = sorted(
                    ((component & open_mask).bit_count() for component in components
                     if not component & touched),
                    reverse=True,
                )  # fmt: skip
                for available in sizes:
                    if left <= 0 or not available:
                        break
                    left -= available
                    count += 1
                if left > 0:
                    return False  # too few GPUs at all
            if count > 1 and want > edges - edges_cut(count, ring_like):
                return False
        return True

    def fits(self, gpus: Sequence[int], mask: int) -> bool:
        """Whether the set (``gpus``, also as ``mask``) passes every group's bounds."""
        known = self.known.get(mask)
        if known is None:
            known = self.known[mask] = self._fits(gpus, mask)
        return known

    def _fits(self, gpus: Sequence[int], mask: int) -> bool:
        degrees, edges, ring_like, uniform = self.degrees, self.edges, self.ring_like, self.uniform
        for want, masks in self.checks:
            ends = 0
            if uniform:
                for g in gpus:
                    offer = (masks[g] & mask).bit_count()
                    ends += uniform if uniform < offer else offer
            else:
                offers = sorted(((masks[g] & mask).bit_count() for g in gpus), reverse=True)
                for degree, offer in zip(degrees, offers, strict=False):
                    ends += degree if degree < offer else offer
            if want > ends // 2:
                return False
            if ring_like is not None:
                lost = len(components_of(masks, mask))
                if lost > 1 and want > edges - edges_cut(lost, ring_like):
                    return False
        return True

    def completions(
        self, pool: Sequence[int], fixed: int, above: int, size: int, ceiling: tuple[int, ...]
    ) -> int | None:
        """The GPUs of the sets of ``size`` GPUs that hold ``fixed`` (a mask), take the rest
        from the pool above ``above``, come no later than ``ceiling`` and pass :meth:`fits`,
        as a mask (0: none); ``None`` when there are too many sets to list."""
        left = size - fixed.bit_count()
        if left < 0:
            return 0
        open_mask = self.pool_mask & ~fixed & ~((2 << above) - 1 if above >= 0 else 0)
        if comb(open_mask.bit_count(), left) > MAX_SETS:
            return None
        candidates = [g for g in pool if open_mask >> g & 1]
        base = [g for g in pool if fixed >> g & 1]
        union = 0
        for extra in combinations(candidates, left):
            gpus = sorted((*base, *extra))
            if tuple(gpus) > ceiling:
                continue
            mask = fixed
            for g in extra:
                mask |= 1 << g
            if not mask & ~union:
                continue  # its GPUs are offered already
            if self.fits(gpus, mask):
                union |= mask
        return union
