"""The last two groups of go-gpuallocator's partition order, found as a smallest cut.

:class:`~.partition.PartitionSearch` walks go-gpuallocator's
``iterateGPUPartitions`` order (``besteffort_policy.go``) group by group. When two groups are
left (from the start when ``k >= n / 2``: 11,440 groups for 9 of 16 GPUs, each scored in turn
otherwise), a partition of the remaining GPUs ``R`` is fixed by the group ``G`` that holds R's
lowest GPU, and its total is ``W(R) - cut(G, R - G)``: the highest total is the smallest cut.

:class:`TwoGroups` walks G's members depth first over R's GPUs in ascending order, each GPU
put in G before it is left out. That is the lexicographic order of G's members, which is
go-gpuallocator's order (its padding slots sort after every GPU, and a group holds all of them
or none), so the first partition of smallest cut is the first one the walk meets, and the
incumbent is replaced only on a strict improvement, as go-gpuallocator keeps its first best.

The bound is the one of branch and bound for graph bisection from the GPUs placed so far: the
cut among them is known, and each GPU still to place adds at least its weight to the side it
does not join (``a`` to G's complement if it joins G, ``b`` to G if not), where exactly ``m`` of
them join G: ``sum b + the m smallest (a - b)``. The smallest pair weight ``c`` is taken off
every pair first: a split of ``R`` into ``t`` and ``|R| - t`` GPUs cuts ``c t (|R| - t)`` of it,
the same for both group sizes a padded partition allows (``k`` and ``k - P``, which sum to
``|R|``), so the bound sees only what differs between pairs (a mesh's NVLinks over its PCIe).

Of twin GPUs (the same weight to every other GPU, neither required), G takes the lower first:
swapping them gives the same total, earlier in the order. A partition counts only where a group
that is not padded holds every required GPU (and a group holding some holds all, unpadded).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

Split = tuple[int, int, bool, int, bool]
"""(total, G's mask, G padded, the other group's mask, it padded)."""


class TwoGroups:
    """Splits of a set of positions into the last two groups of a partition (see the module).

    ``weights`` are the integer pair scores of positions ``0..n-1``; ``padding`` the number of
    empty slots (``P``), ``required`` a mask of positions, ``twin`` per position the lowest
    position with the same weight to every other (itself if none, and for required ones).
    """

    def __init__(
        self,
        weights: Sequence[Sequence[int]],
        k: int,
        padding: int,
        required: int,
        twin: Sequence[int],
        tick: Callable[[], None],
    ) -> None:
        n = len(weights)
        self.tick = tick
        self.k, self.padding, self.required, self.twin = k, padding, required, twin
        base = min((weights[a][b] for a in range(n) for b in range(a + 1, n)), default=0)
        self.base = base
        self.reduced = [[weights[a][b] - base if a != b else 0 for b in range(n)] for a in range(n)]

    def best(
        self, remaining: int, padding_left: bool, satisfied: bool, threshold: float
    ) -> Split | None:
        """The first split of ``remaining`` of highest total, if that total is above
        ``threshold`` and the partition counts; ``None`` otherwise.

        ``padding_left``: one of the two groups is the padded one (``k - P`` GPUs); else both
        hold ``k``. ``satisfied``: an earlier group already holds every required GPU.
        """
        k, padding = self.k, self.padding
        padded = padding_left and padding > 0
        positions = [i for i in range(len(self.reduced)) if remaining >> i & 1]
        need = self.required & remaining
        if need and need != self.required:
            return None  # an earlier group holds some required GPUs but not all
        if not need and not (satisfied or not self.required):
            return None
        # Configurations (side of the required GPUs: True in G, False out, None: none; G's size).
        configs: list[tuple[bool | None, int]]
        if need:
            configs = [(True, k), (False, k - padding if padded else k)]
        else:
            configs = [(None, t) for t in ((k, k - padding) if padded else (k,))]
        whole, constant = self.totals(positions, padded)
        found: list[tuple[int, int]] = []
        # A split's total is whole - constant - cut; it must exceed threshold.
        limit = [whole - constant - threshold]

        def keep(in_mask: int, cut: int) -> None:
            found.append((cut, in_mask))
            limit[0] = cut

        _Walk(self, positions, need, configs, lambda: limit[0], keep).run()
        if not found:
            return None
        cut, in_mask = found[-1]
        other = remaining ^ in_mask
        in_padded = padded and in_mask.bit_count() != k
        return whole - constant - cut, in_mask, in_padded, other, padded and not in_padded

    def totals(self, positions: list[int], padded: bool) -> tuple[int, int]:
        """The total of every pair of ``positions``, and the part of it that any partition of
        them into groups of ``k`` (one of ``k - P`` if ``padded``) cuts at the smallest pair
        weight: a partition's total is the first less the second less its reduced cut."""
        size, k, reduced = len(positions), self.k, self.reduced
        whole = self.base * size * (size - 1) // 2 + sum(
            reduced[a][b] for i, a in enumerate(positions) for b in positions[i + 1 :]
        )
        last = k - self.padding if padded else k
        inside = (size - last) // k * k * (k - 1) // 2 + last * (last - 1) // 2
        return whole, self.base * (size * (size - 1) // 2 - inside)


class _Walk:
    """One depth-first walk over the members of the group that holds the lowest position."""

    def __init__(
        self,
        owner: TwoGroups,
        positions: list[int],
        need: int,
        configs: list[tuple[bool | None, int]],
        limit: Callable[[], float],
        on_leaf: Callable[[int, int], None],
    ) -> None:
        self.owner = owner
        self.first, self.rest = positions[0], positions[1:]
        self.need = need
        self.configs = configs
        self.largest = max(t for _, t in configs)
        self.limit = limit  # a group's cut must be strictly below this
        self.on_leaf = on_leaf
        reduced = owner.reduced
        # a: weight to the GPUs left out of G; b: weight to G (the first GPU is in G).
        self.a = [0] * len(reduced)
        self.b = list(reduced[self.first])
        self.tick = owner.tick
        twin = owner.twin
        classes: dict[int, int] = {}
        for u in self.rest:
            classes[twin[u]] = classes.get(twin[u], 0) + 1
        self.twin_of = {u: twin[u] for u in self.rest if classes[twin[u]] > 1}
        self.out_classes: dict[int, int] = {}

    def run(self) -> None:
        first = 1 << self.first
        self._dfs(0, first, 1, 0, bool(self.need & first), False)

    def _bound(self, index: int, in_count: int, cut: int, need_in: bool, need_out: bool) -> float:
        """The least cut of any split that completes this node (``inf`` if none can)."""
        a, b, need = self.a, self.b, self.need
        free_b = forced_a = forced_b = forced = 0
        diffs = []
        for u in self.rest[index:]:
            if need >> u & 1:
                forced += 1
                forced_a += a[u]
                forced_b += b[u]
            else:
                free_b += b[u]
                diffs.append(a[u] - b[u])
        diffs.sort()
        best = math.inf
        for side, t in self.configs:
            m = t - in_count
            if side is True:
                if need_out:
                    continue
                m -= forced
                value = cut + free_b + forced_a
            else:
                if side is False and need_in:
                    continue
                value = cut + free_b + forced_b
            if m < 0 or m > len(diffs):
                continue
            value += sum(diffs[:m])
            if value < best:
                best = value
        return best

    def _dfs(
        self, index: int, in_mask: int, in_count: int, cut: int, need_in: bool, need_out: bool
    ) -> None:
        self.tick()
        bound = self._bound(index, in_count, cut, need_in, need_out)
        if bound >= self.limit():
            return
        rest = self.rest
        if index == len(rest):
            self.on_leaf(in_mask, int(bound))
            return
        u = rest[index]
        row = self.owner.reduced[u]
        later = rest[index + 1 :]
        required = self.need >> u & 1
        cls = self.twin_of.get(u)
        # Into G first (the lexicographic order of G), unless a lower twin was left out.
        if in_count < self.largest and not (cls is not None and self.out_classes.get(cls)):
            b = self.b
            for v in later:
                b[v] += row[v]
            self._dfs(
                index + 1,
                in_mask | 1 << u,
                in_count + 1,
                cut + self.a[u],
                need_in or bool(required),
                need_out,
            )
            for v in later:
                b[v] -= row[v]
        a = self.a
        for v in later:
            a[v] += row[v]
        if cls is not None:
            self.out_classes[cls] = self.out_classes.get(cls, 0) + 1
        self._dfs(
            index + 1, in_mask, in_count, cut + self.b[u], need_in, need_out or bool(required)
        )
        if cls is not None:
            self.out_classes[cls] -= 1
        for v in later:
            a[v] -= row[v]
