"""The first highest-scoring partition in go-gpuallocator's enumeration order, found fast.

go-gpuallocator's best-effort policy (``besteffort_policy.go``, ``iterateGPUPartitions``) pads
the available GPUs with ``P = (-n) mod k`` empty slots and walks every partition of the slots
into groups of ``k``: the first remaining slot with each (k-1)-combination of the others, in
lexicographic order, recursively, skipping groups that hold some but not all of the padding. It
keeps the first partition of highest total pair score that has a qualifying group (all required
GPUs, no padding). That is 22 million partitions for k = 3 of 16 GPUs.

:class:`PartitionSearch` returns the same partition. It walks the same tree in the same order
with these additions, none of which changes which partition comes out first:

* the padding is one block, so only the groups go-gpuallocator keeps are generated;
* a node's groups are built member by member (:class:`_GroupWalk`), and a prefix whose every
  group falls short of the incumbent is cut as a whole (listed one by one, the groups of 16 of
  32 GPUs holding the first, C(31, 15) = 300 million, would not fit in memory);
* of twin GPUs (the same pair score to every other GPU: the GPUs under one PCIe switch) a group
  takes the lower first, since swapping two twins between groups gives a partition of the same
  total that comes earlier;
* branch and bound, with the incumbent replaced only on a *strict* improvement, and cuts only
  where nothing strictly better than the incumbent can follow. The bound gives each GPU a share:
  a group's score split evenly over its members is at most the best group score containing
  that GPU divided by the group size (found by a pruned walk, :func:`best_group_scores`), or
  half its best k-1 pair scores. Where the host's groups are few (up to 16 GPUs) the search
  starts with the first; beyond, with the second, and finds the first once it has memoised
  many sets (and keeps the second if that walk outgrows its cap: on ``torus-2d-32``, groups of
  7 and more). Exactly ``k - P`` GPUs share the padded group, and the bound counts them at
  their padded share. (Scoring every group, C(n, k), to find the bests costs too much on 32-GPU
  hosts from k = 4 on, and would leave them only the pair bound, which cuts far less);
* a transposition table: once a set of remaining GPUs has been searched, the best it can add is
  known (exactly, or as an upper bound when nothing beat the incumbent), and a later visit of
  the same set is cut at once when that cannot help.

The incumbent is replaced only by a strictly better partition, so the first optimal partition
in enumeration order is the one returned. (No greedy partition seeds the incumbent: on the
16-GPU meshes listing its groups costs more than its cuts save.) When two groups are left, the
rest is the smallest cut between them (:mod:`.two_groups`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from itertools import combinations
from math import comb

from gpualloc.placement import deadline
from gpualloc.placement.besteffort.best_groups import best_group_scores
from gpualloc.placement.besteffort.two_groups import TwoGroups

# Exact shares are found at once when the groups of the host number at most this many; beyond,
# the search starts with the pair bound, and finds them once it has memoised
# _ESCALATE_AFTER_SETS sets (a search that needs them: on ``pcie-32gpu-2socket``, jobs of 5 to
# 10 GPUs on the empty host memoise thousands of sets under the pair bound; the busy hosts'
# searches, which finish with a few hundred, would pay more for the shares than they save).
_MAX_TABULATED_GROUPS = 20_000
_ESCALATE_AFTER_SETS = 1_000
# A GPU's weights to a set are added up member by member this many times before its byte tables
# are built (256 sums per byte of a mask; a 16-GPU mesh's besteffort search reads most GPUs only
# a few times).
_DIRECT_READS = 32
# The walk for each GPU's best group stops after this many nodes, and the pair bound is kept.
_MAX_SHARE_NODES = 20_000
# Up to this many groups at a node (and no twins) they are listed and bounded one by one; beyond,
# they are walked member by member, which cuts prefixes and scores each group as it is built.
# Listing pays only for a few groups (an 8-GPU host's 35 at most); on the 16-GPU meshes walking
# them cuts prefixes that listing would score one by one.
_LISTED_GROUPS = 64


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
        self._byte_weights: list[list[list[int]] | None] = [None] * n  # built when much read
        self._reads = [0] * n
        # Per GPU, the sums of its j largest pair scores (j = 0..n-1), for the group bound.
        self.top_sums = []
        for v in range(n):
            ranked = sorted((weights[v][u] for u in range(n) if u != v), reverse=True)
            sums = [0]
            for value in ranked:
                sums.append(sums[-1] + value)
            self.top_sums.append(sums)
        self._shares: list[int] = []
        self._padded_shares: list[int] = []
        self.scale = 1
        self._share_tables: list[list[int]] = []
        # Exact shares are sought once the search has memoised this many sets (never: inf).
        self._escalate_at = math.inf
        if n + self.padding != 2 * k:  # two groups are split by :mod:`.two_groups` alone
            sizes = {k, self.padded_size}
            exact = None
            if k <= n:  # else one padded group holds every GPU, and nothing is bounded
                if sum(comb(n, size) for size in sizes) <= _MAX_TABULATED_GROUPS:
                    exact = self._exact_shares()
                else:
                    self._escalate_at = _ESCALATE_AFTER_SETS
            self._use_shares(exact or self._pair_shares())
        self._memo: dict[tuple[int, bool], int] = {}
        self._best = -1
        self._best_partition: list[tuple[int, bool]] = []
        self.twin = self._twin_classes(required)
        members: dict[int, list[int]] = {}
        for v in range(n):
            members.setdefault(self.twin[v], []).append(v)
        self._twin_groups = [group for group in members.values() if len(group) > 1]
        self.two_groups = TwoGroups(
            weights, k, self.padding, self.required, self.twin, self.deadline.tick
        )

    def _twin_classes(self, required: frozenset[int]) -> list[int]:
        """Per position, the lowest position with the same pair score to every other one
        (itself if none, and for required GPUs, which cannot trade places)."""
        n, weights = self.n, self.weights
        twin = list(range(n))
        leaders: list[int] = []
        for v in range(n):
            if v in required:
                continue
            row = weights[v]
            for h in leaders:
                other = weights[h]
                if all(row[x] == other[x] for x in range(n) if x != v and x != h):
                    twin[v] = h
                    break
            else:
                leaders.append(v)
        return twin

    # ---- scores -----------------------------------------------------------------------------

    def _byte_tables(self, values: Sequence[int]) -> list[list[int]]:
        """For each byte of a mask, the sum of ``values`` over every setting of that byte.

        Built when a GPU's weights are first read (256 sums per byte, with no tick of the
        deadline): the clock is read first, so a decision past its budget stops here too.
        """
        self.deadline.check()
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
        """The sum of GPU ``v``'s pair scores to the GPUs of ``mask``: added up member by
        member for its first :data:`_DIRECT_READS` reads, then looked up byte by byte."""
        tables = self._byte_weights[v]
        if tables is None:
            self._reads[v] += 1
            if self._reads[v] <= _DIRECT_READS:
                row, total = self.weights[v], 0
                while mask:
                    low = mask & -mask
                    total += row[low.bit_length() - 1]
                    mask ^= low
                return total
            tables = self._byte_weights[v] = self._byte_tables(self.weights[v])
        return self._mask_sum(tables, mask)

    def score(self, mask: int) -> int:
        """Sum of the pair scores inside a group (a bitmask of positions), memoised."""
        known = self._scores.get(mask)
        if known is None:
            low = mask & -mask
            rest = mask ^ low
            known = self.score(rest) + self.weight_to(low.bit_length() - 1, rest)
            self._scores[mask] = known
        return known

    def _exact_shares(self) -> tuple[list[int], list[int], int] | None:
        """Per-GPU upper bounds on its share of its group's score, scaled to integers; None
        when finding them takes more than :data:`_MAX_SHARE_NODES` nodes.

        Share bound: a group's score is the sum over its members of score/size, and each term
        is at most (best group containing that member)/size (:func:`best_group_scores`).
        """
        k, padded = self.k, self.padded_size
        best: dict[int, list[int]] = {}
        for size in {k, padded}:
            found = best_group_scores(self.weights, size, _MAX_SHARE_NODES, self.deadline.tick)
            if found is None:
                return None
            best[size] = found
        scale = k * padded
        shares = [value * scale // k for value in best[k]]
        padded_shares = [value * scale // padded for value in best[padded]]
        return shares, padded_shares, scale

    def _pair_shares(self) -> tuple[list[int], list[int], int]:
        """The pair bound, scaled by 2: a group's score is half the sum over its members of
        their weights to the others, each at most the member's best size-1 weights."""
        k, padded = self.k, self.padded_size
        shares = [sums[min(k - 1, len(sums) - 1)] for sums in self.top_sums]
        padded_shares = [sums[min(padded - 1, len(sums) - 1)] for sums in self.top_sums]
        return shares, padded_shares, 2

    def _use_shares(self, shares: tuple[list[int], list[int], int]) -> None:
        self._shares, self._padded_shares, self.scale = shares
        self._share_tables = self._byte_tables(self._shares)

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

    def _children(
        self, remaining: int, padding_left: bool, floor: Callable[[], float]
    ) -> Iterator[tuple[int, bool, int, int]]:
        """(group, padded, scaled group score, bound of the rest) for each allowed group whose
        (score + bound of the rest) may exceed ``floor()``, in go-gpuallocator's order.

        A group holding some required GPU must hold all of them, without padding. The bound of
        the rest reuses this node's padded-group correction: the k-P smallest drops over a
        subset are no smaller, so the bound stays valid, only slightly looser.

        The groups are built member by member (a depth-first walk over the combinations, in
        their lexicographic order), and a prefix none of whose groups can pass ``floor`` is cut
        (:class:`_GroupWalk`); of twin GPUs (the same pair score to every other GPU, neither
        required) a group takes the lower first: swapping two twins between groups gives a
        partition of the same total that comes earlier, so the later one is never kept.
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
        if self._listed(remaining):
            # Few groups and no twins: listing them costs less than walking them by member.
            required, tick = self.required, self.deadline.tick
            for mask, padded in self.groups_with_lowest(remaining, padding_left):
                tick()
                if mask & required and (padded or mask & required != required):
                    continue
                rest = share_sum - self._mask_sum(self._share_tables, mask)
                if padding_left and not padded:
                    rest -= correction
                yield mask, padded, self.score(mask) * self.scale, rest
            return
        walk = _GroupWalk(self, remaining, padding_left, share_sum, correction)
        yield from walk.groups(floor)

    def _canonical(self, remaining: int) -> int:
        """The memo's key for a set of remaining GPUs: each twin class's lowest members, as many
        as it has remaining (twin-isomorphic sets can add the same at most)."""
        for group in self._twin_groups:
            count = 0
            for v in group:
                if remaining >> v & 1:
                    count += 1
                    remaining ^= 1 << v
            for v in group[:count]:
                remaining |= 1 << v
        return remaining

    def _listed(self, remaining: int) -> bool:
        """Whether a node's groups are listed (itertools, then bounded one by one) rather than
        walked member by member: where they are few enough and no two candidates are twins."""
        others = (remaining & ~(remaining & -remaining)).bit_count()
        if comb(others, self.k - 1) > _LISTED_GROUPS:
            return False
        classes = {self.twin[i] for i in range(self.n) if remaining >> i & 1}
        return len(classes) == remaining.bit_count()

    def best_partition(self) -> list[tuple[int, bool]]:
        """The first partition of highest total that has a qualifying group, in
        go-gpuallocator's enumeration order, as (group mask, padded) pairs."""
        everything = (1 << self.n) - 1
        if self.n + self.padding == 2 * self.k:
            # Two groups: the smallest cut (:mod:`.two_groups`).
            found = self.two_groups.best(everything, True, False, -math.inf)
            if found is None:
                return []
            _, mask, padded, other, other_padded = found
            return [(mask, padded), (other, other_padded)]
        try:
            self._walk_from_scratch()
        except _Escalate:
            # Many sets searched under the pair bound: find the exact shares, and start again.
            self._escalate_at = math.inf
            exact = self._exact_shares()
            if exact is not None:
                self._use_shares(exact)
            self._walk_from_scratch()
        return self._best_partition

    def _walk_from_scratch(self) -> None:
        self._best = -1
        self._best_partition = []
        self._memo = {}  # its values are in the shares' scale
        self._walk((1 << self.n) - 1, True, False, 0, [])

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
        children = self._children(remaining, padding_left, lambda: self._best - total)
        for mask, padded, gained, rest in children:
            self._visit(
                remaining, padding_left, satisfied, total, partition, mask, padded, gained, rest
            )
        # Nothing below this node adds more than best - total (exactly that if it improved).
        self._memo[(self._canonical(remaining), satisfied)] = self._best - total

    def _visit(
        self,
        remaining: int,
        padding_left: bool,
        satisfied: bool,
        total: int,
        partition: list[tuple[int, bool]],
        mask: int,
        padded: bool,
        gained: int,
        rest: int,
    ) -> None:
        """One child of a node of :meth:`_walk`: the group ``mask`` taken next, worth ``gained``,
        with at most ``rest`` to come from the GPUs it leaves."""
        memo, required = self._memo, self.required
        child = remaining ^ mask
        child_satisfied = satisfied or self.qualifies(mask, padded)
        last_padded = padding_left and not padded and bool(self.padding)
        if child.bit_count() == (self.padded_size if last_padded else self.k):
            # One group is left, and it is forced: score it instead of bounding it.
            if child & required and (last_padded or child & required != required):
                return
            value = total + gained + self.score(child) * self.scale
            last_satisfied = child_satisfied or self.qualifies(child, last_padded)
            if last_satisfied and value > self._best:
                self._best = value
                self._best_partition = [*partition, (mask, padded), (child, last_padded)]
            return
        if len(memo) > self._escalate_at:
            raise _Escalate
        key = (self._canonical(child), child_satisfied)
        known = memo.get(key)
        if known is not None and known < rest:
            rest = known
        if total + gained + rest <= self._best:
            return
        child_padding = padding_left and not padded
        if child.bit_count() == 2 * self.k - (self.padding if child_padding else 0):
            # Two groups are left: the smallest cut that beats the incumbent, if any.
            floor = self._best - total - gained
            found = self.two_groups.best(child, child_padding, child_satisfied, floor // self.scale)
            if found is None:
                memo[key] = floor
                return
            value, first, first_padded, second, second_padded = found
            memo[key] = value * self.scale
            self._best = total + gained + value * self.scale
            self._best_partition = [
                *partition,
                (mask, padded),
                (first, first_padded),
                (second, second_padded),
            ]
            return
        partition.append((mask, padded))
        self._walk(child, child_padding, child_satisfied, total + gained, partition)
        partition.pop()


class _GroupWalk:
    """The groups of one node of :meth:`PartitionSearch._walk` (those holding its lowest
    remaining GPU), member by member in go-gpuallocator's order, with prefixes cut by a bound.

    A group's value to the walk is its scaled score plus the bound of the rest:
    ``scale score(G) + base - shares(G)`` (less the padded-group correction for an unpadded group
    while padding is left), ``base`` the shares of the remaining GPUs. For a prefix ``Q`` and
    ``t`` members to come, ``score(G) = score(Q) + sum over new v of w(v, Q) + score(new)``, and
    ``score(new)`` is at most half the sum over the new members of their ``t - 1`` largest pair
    scores: the value is at most ``scale score(Q) - shares(Q)`` plus the ``t`` largest of
    ``scale w(v, Q) - share(v) + scale top(v, t - 1) / 2`` over the candidates.
    """

    def __init__(
        self,
        search: PartitionSearch,
        remaining: int,
        padding_left: bool,
        share_sum: int,
        correction: int,
    ) -> None:
        self.search = search
        first = (remaining & -remaining).bit_length() - 1
        self.first = first
        self.others = [i for i in range(first + 1, search.n) if remaining >> i & 1]
        self.padding_left = padding_left
        self.base = share_sum
        self.correction = correction if padding_left else 0
        self.within = [search.weights[first][v] for v in range(search.n)]
        """Per GPU, its pair scores summed over the prefix."""

    def groups(self, floor: Callable[[], float]) -> Iterator[tuple[int, bool, int, int]]:
        """The walk, with an explicit stack (one generator, not one per member)."""
        search = self.search
        k, scale, required = search.k, search.scale, search.required
        padded_size = search.padded_size
        others, within, twin, weights = self.others, self.within, search.twin, search.weights
        shares_of, tick, count = search._shares, search.deadline.tick, len(others)
        padding_left, base, correction = self.padding_left, self.base, self.correction
        first = self.first
        # Per level: [mask, size, score, shares, next index, skipped twin classes, GPU added].
        stack: list[list] = [[1 << first, 1, 0, shares_of[first], 0, set(), -1]]
        while stack:
            level = stack[-1]
            mask, size, score, shares, index, skipped, _ = level
            if size == k:
                if not (mask & required and mask & required != required):
                    yield mask, False, score * scale, base - shares - correction
                self._pop(stack)
                continue
            grown_to = -1
            while index < count:
                left = count - index
                if left < k - size and not (
                    padding_left and size < padded_size and left >= padded_size - size
                ):
                    index = count
                    break
                v = others[index]
                index += 1
                tick()
                if twin[v] in skipped:
                    continue
                grown = mask | 1 << v
                if grown & required and required & ((1 << v) - 1) & ~grown:
                    # It holds a required GPU but has passed another: it cannot hold them all.
                    skipped.add(twin[v])
                    continue
                row = weights[v]
                for u in others:
                    within[u] += row[u]
                new_score, new_shares = score + within[v] - row[v], shares + shares_of[v]
                if self._bound(new_score, size + 1, new_shares, index) > floor():
                    grown_to = v
                    level[4] = index
                    stack.append([grown, size + 1, new_score, new_shares, index, set(skipped), v])
                    break
                for u in others:
                    within[u] -= row[u]
                skipped.add(twin[v])
            if grown_to >= 0:
                continue
            if padding_left and size == padded_size and not mask & required:
                yield mask, True, score * scale, base - shares
            self._pop(stack)

    def _pop(self, stack: list[list]) -> None:
        """Leave the deepest level: take its GPU out of the prefix, and mark its class skipped
        for the level above (a later twin may not join this group)."""
        added = stack.pop()[6]
        if added >= 0:
            row = self.search.weights[added]
            within = self.within
            for u in self.others:
                within[u] -= row[u]
            stack[-1][5].add(self.search.twin[added])

    def _bound(self, score: int, size: int, shares: int, start: int) -> float:
        """The most any group can be worth to the walk that extends a prefix of ``size`` GPUs
        (``score`` and ``shares`` its own) with candidates from ``start`` on."""
        search = self.search
        k, scale = search.k, search.scale
        base = scale * score - shares + self.base
        best = -math.inf
        options = [(k - size, self.correction)]
        if self.padding_left and size <= search.padded_size:
            options.append((search.padded_size - size, 0))
        others, within, top = self.others[start:], self.within, search.top_sums
        for t, correction in options:
            if t == 0:
                best = max(best, base - correction)
                continue
            if t > len(others):
                continue
            gains = sorted(
                (
                    scale * within[v] - search._shares[v] + (scale * top[v][t - 1] + 1) // 2
                    for v in others
                ),
                reverse=True,
            )
            best = max(best, base - correction + sum(gains[:t]))
        return best


class _Escalate(Exception):
    """The search under the pair bound memoised :data:`_ESCALATE_AFTER_SETS` sets."""
