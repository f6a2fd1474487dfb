"""The first highest-scoring partition in go-gpuallocator's enumeration order, found fast.

go-gpuallocator's best-effort policy (``besteffort_policy.go``, ``iterateGPUPartitions``) pads
the available GPUs with ``P = (-n) mod k`` empty slots and walks every partition of the slots
into groups of ``k``: the first remaining slot with each (k-1)-combination of the others, in
lexicographic order, recursively, skipping groups that hold some but not all of the padding. It
keeps the first partition of highest total pair score that has a qualifying group (all required
GPUs, no padding). That is 22 million partitions for k = 3 of 16 GPUs.

:class:`PartitionSearch` returns the same partition. It walks the same tree in the same order
with three additions, none of which changes which partition comes out first:

* the padding is one block, so only the groups go-gpuallocator keeps are generated;
* branch and bound, with the incumbent replaced only on a *strict* improvement, and cuts only
  where nothing strictly better than the incumbent can follow. The bound gives each GPU a share:
  a group's score split evenly over its members is at most the best group score containing
  that GPU divided by the group size (or half its best k-1 pair scores, when there are only two
  groups or too many to tabulate); exactly ``k - P`` GPUs share the padded group, and the bound
  counts them at their padded share;
* a transposition table: once a set of remaining GPUs has been searched, the best it can add is
  known (exactly, or as an upper bound when nothing beat the incumbent), and a later visit of
  the same set is cut at once when that cannot help.

The search starts from the score of a greedy partition minus one (scores are integers), so it
cuts from the first node. Since only a partition *at least as good* as the greedy one is kept,
and afterwards only strictly better ones, the first optimal partition in enumeration order is
the one returned.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import combinations
from math import comb

from gpualloc.placement import deadline

# Tabulating every group of the host costs C(n, k); beyond this, the pair bound is used.
_MAX_TABULATED_GROUPS = 20_000


class PartitionSearch:
    """Groups of ``k`` over ``n`` GPUs, scored by the sum of their pairs' integer scores.

    Positions 0..n-1 stand for the available GPUs in ascending order; ``weights[a][b]`` is the
    pair score. ``required`` is the set of positions one group must hold (with no padding) for a
    partition to count.
    """

    def __init__(self, weights: Sequence[Sequence[int]], k: int, required: frozenset[int]):
        self.n = n = len(weights)
        self.deadline = deadline.current()
        self.k = k
        self.padding = (-n) % k
        self.padded_size = k - self.padding  # GPUs in the padded group, when there is padding
        self.weights = weights
        self.required = sum(1 << i for i in required)
        self._scores: dict[int, int] = {0: 0}
        # The weight from GPU v to a mask is a sum over the mask's bytes, looked up.
        self._byte_weights = [self._byte_tables(weights[v]) for v in range(n)]
        self._shares, self._padded_shares, self.scale = self._vertex_shares()
        self._share_tables = self._byte_tables(self._shares)
        self._memo: dict[tuple[int, bool], int] = {}
        self._best = -1
        self._best_partition: list[tuple[int, bool]] = []

    # ---- scores -----------------------------------------------------------------------------

    def _byte_tables(self, values: Sequence[int]) -> list[list[int]]:
        """For each byte of a mask, the sum of ``values`` over every setting of that byte."""
        tables = []
        for chunk in range((self.n + 7) // 8):
            part = list(values[8 * chunk : 8 * chunk + 8])
            table = [0] * 256
            for byte in range(1, 256):
                low = byte & -byte
                bit = low.bit_length() - 1
                table[byte] = table[byte ^ low] + (part[bit] if bit < len(part) else 0)
            tables.append(table)
        return tables

    def weight_to(self, v: int, mask: int) -> int:
        return self._mask_sum(self._byte_weights[v], mask)

    def score(self, mask: int) -> int:
        """Sum of the pair scores inside a group (a bitmask of positions), memoised."""
        known = self._scores.get(mask)
        if known is None:
            low = mask & -mask
            rest = mask ^ low
            known = self.score(rest) + self.weight_to(low.bit_length() - 1, rest)
            self._scores[mask] = known
        return known

    def _vertex_shares(self) -> tuple[list[int], list[int], int]:
        """Per-GPU upper bounds on its share of its group's score, scaled to integers.

        Share bound: a group's score is the sum over its members of score/size, and each term
        is at most (best group containing that member)/size. When tabulating every group costs
        too much, the pair bound is used instead: a group's score is half the sum over members
        of their weights to the others, each at most the member's best size-1 weights.
        """
        n, k, padded = self.n, self.k, self.padded_size
        sizes = {k, padded} if self.padding else {k}
        groups = (n + self.padding) // k
        # Two groups: the search is one level deep and the pair bound is enough.
        if groups > 2 and sum(comb(n, size) for size in sizes) <= _MAX_TABULATED_GROUPS:
            scale = k * padded
            best = {size: [0] * n for size in sizes}
            for size in sizes:
                top, bits = best[size], [1 << i for i in range(n)]
                for group in combinations(range(n), size):
                    value = self.score(sum(bits[i] for i in group))
                    for i in group:
                        if value > top[i]:
                            top[i] = value
            shares = [value * scale // k for value in best[k]]
            padded_shares = [value * scale // padded for value in best[padded]]
            return shares, padded_shares, scale
        ranked = [
            sorted((self.weights[v][u] for u in range(n) if u != v), reverse=True) for v in range(n)
        ]
        shares = [sum(row[: k - 1]) for row in ranked]
        padded_shares = [sum(row[: padded - 1]) for row in ranked]
        return shares, padded_shares, 2

    # ---- enumeration in go-gpuallocator's order ---------------------------------------------

    def groups_with_lowest(self, remaining: int, padding_left: bool) -> Iterator[tuple[int, bool]]:
        """Groups (mask, padded) holding the lowest remaining GPU, in go-gpuallocator's order.

        Padding slots sort after every GPU, so a padded group (first, r1..rj, pad...) comes
        right after the unpadded groups that start with (first, r1..rj).
        """
        low = remaining & -remaining
        others = [1 << i for i in range(self.n) if (remaining ^ low) >> i & 1]
        plain = combinations(others, self.k - 1)
        if not (padding_left and self.padding):
            for group in plain:
                yield low + sum(group), False
            return
        width = self.padded_size - 1
        padded = list(combinations(others, width))
        index = 0
        for group in plain:
            head = group[:width]
            while index < len(padded) and padded[index] < head:
                yield low + sum(padded[index]), True
                index += 1
            yield low + sum(group), False
        for group in padded[index:]:
            yield low + sum(group), True

    # ---- search ----------------------------------------------------------------------------

    def _mask_sum(self, tables: list[list[int]], mask: int) -> int:
        total, chunk = 0, 0
        while mask:
            total += tables[chunk][mask & 255]
            mask >>= 8
            chunk += 1
        return total

    def qualifies(self, mask: int, padded: bool) -> bool:
        return not padded and mask & self.required == self.required

    def _children(self, remaining: int, padding_left: bool) -> Iterator[tuple[int, bool, int, int]]:
        """(group, padded, scaled group score, bound of the rest) for each allowed group.

        A group holding some required GPU must hold all of them, without padding. The bound of
        the rest reuses this node's padded-group correction: the k-P smallest drops over a
        subset are no smaller, so the bound stays valid, only slightly looser.
        """
        padding_left = padding_left and bool(self.padding)
        share_sum = self._mask_sum(self._share_tables, remaining)
        correction = 0
        if padding_left:
            drops = sorted(
                self._shares[i] - self._padded_shares[i]
                for i in range(self.n)
                if remaining >> i & 1
            )
            correction = sum(drops[: self.padded_size])
        required, tick = self.required, self.deadline.tick
        for mask, padded in self.groups_with_lowest(remaining, padding_left):
            tick()
            if mask & required and (padded or mask & required != required):
                continue
            rest = share_sum - self._mask_sum(self._share_tables, mask)
            if padding_left and not padded:
                rest -= correction
            yield mask, padded, self.score(mask) * self.scale, rest

    def greedy_total(self) -> int | None:
        """Score of the partition that takes, at each step, the group of highest score plus
        bound of the rest; ``None`` if it ends without a qualifying group."""
        remaining, padding_left, satisfied, total = (1 << self.n) - 1, True, False, 0
        while remaining:
            best = None
            for mask, padded, gained, rest in self._children(remaining, padding_left):
                if best is None or gained + rest > best[0]:
                    best = (gained + rest, mask, padded)
            if best is None:
                return None
            _, mask, padded = best
            total += self.score(mask)
            satisfied = satisfied or self.qualifies(mask, padded)
            remaining ^= mask
            padding_left = padding_left and not padded
        return total if satisfied else None

    def best_partition(self) -> list[tuple[int, bool]]:
        """The first partition of highest total that has a qualifying group, in
        go-gpuallocator's enumeration order, as (group mask, padded) pairs."""
        # With two groups the search is one level deep, and a greedy start would double it.
        greedy = self.greedy_total() if self.n + self.padding > 2 * self.k else None
        self._best = greedy * self.scale - 1 if greedy is not None else -1
        self._best_partition = []
        self._walk((1 << self.n) - 1, True, False, 0, [])
        return self._best_partition

    def _walk(
        self,
        remaining: int,
        padding_left: bool,
        satisfied: bool,
        total: int,
        partition: list[tuple[int, bool]],
    ) -> None:
        self.deadline.tick()
        if not remaining:
            if satisfied and total > self._best:
                self._best, self._best_partition = total, list(partition)
            return
        memo, required = self._memo, self.required
        for mask, padded, gained, rest in self._children(remaining, padding_left):
            child = remaining ^ mask
            child_satisfied = satisfied or self.qualifies(mask, padded)
            last_padded = padding_left and not padded and bool(self.padding)
            if child.bit_count() == (self.padded_size if last_padded else self.k):
                # One group is left, and it is forced: score it instead of bounding it.
                if child & required and (last_padded or child & required != required):
                    continue
                value = total + gained + self.score(child) * self.scale
                last_satisfied = child_satisfied or self.qualifies(child, last_padded)
                if last_satisfied and value > self._best:
                    self._best, self._best_partition = (
                        value,
                        [
                            *partition,
                            (mask, padded),
                            (child, last_padded),
                        ],
                    )
                continue
            known = memo.get((child, child_satisfied))
            if known is not None and known < rest:
                rest = known
            if total + gained + rest <= self._best:
                continue
            partition.append((mask, padded))
            self._walk(
                child, padding_left and not padded, child_satisfied, total + gained, partition
            )
            partition.pop()
        # Nothing below this node adds more than best - total (exactly that if it improved).
        memo[(remaining, satisfied)] = self._best - total
