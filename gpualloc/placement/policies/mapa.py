"""``mapa``: MAPA's Preserve policy (Ranganath et al., SC'21, seed 003, section 3.5.2, Algorithm 1).

- A bandwidth-sensitive job gets the placement of highest predicted effective bandwidth: Table 2
  (Eq. 2) on hosts whose links are the DGX-1 classes it was fitted on, else the edge-bottleneck
  estimate (:mod:`gpualloc.placement.mapa.scores`); ``--score`` chooses explicitly.
- A bandwidth-insensitive job, and every 1-GPU job, gets the set that *preserves* the most NVLink
  bandwidth among the GPUs left free (Eq. 3), so that later sensitive jobs find NVLinked GPUs.
- Ties go to the higher aggregated bandwidth (Eq. 1), then to the lowest indices.

Unlike the reference code, a placement is never refused because its predicted bandwidth does not
exceed the empty allocation's 12.335 GB/s: if GPUs are free, the best of them is returned.

Preserve search (:class:`LossSearch`): the least NVLink bandwidth a set can remove from the free
pool, by branch and bound over the candidate sets, then the sets that remove exactly that, lazily
in lexicographic order; among them the aggregated-bandwidth search of
:mod:`gpualloc.placement.mapa.search`: for a tree with a few tied sets, the lowest set alone,
then the others together, one per orbit of the host's symmetries, for a better key only; else set
by set in decreasing order of an upper bound. Where no free GPU has an NVLink every set ties, and
the tie-break is MAPA Greedy's search over the pool.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from itertools import accumulate, chain, islice, permutations
from math import comb

from gpualloc.model.request import CommunicationPattern, Placement
from gpualloc.placement import deadline
from gpualloc.placement.context import DecisionContext
from gpualloc.placement.host_graph import HostGraph
from gpualloc.placement.mapa.exact import (
    best_order_of_set,
    best_ordered_placement,
    best_placement_among,
)
from gpualloc.placement.mapa.objectives import AggregatedObjective, evaluate_order
from gpualloc.placement.mapa.pattern_graphs import is_forest
from gpualloc.placement.mapa.scores import (
    EffectiveModel,
    mapa_counts,
    pattern_pairs,
    preserved_gbps,
)
from gpualloc.placement.mapa.search import SearchResult
from gpualloc.placement.mapa.symmetry import cached_host_symmetries, set_orbits
from gpualloc.placement.policies.policy import Alternative, Policy, SetKey, gpu_list

_SLACK = 2e-6
# Up to this many tied sets of a tree job, the lowest alone and then the others together (each
# node checks the sets: _best_of_few_sets); otherwise the sets are searched one by one in
# decreasing order of their upper bounds.
_UNION_SEARCH_SETS = 64


class MapaPolicy(Policy):
    name = "mapa"
    summary = "MAPA Preserve: best predicted bandwidth if sensitive, else preserve NVLinks"
    reference = "MAPA (SC'21) section 3.5.2, Algorithm 1; Eq. 2, Eq. 3"
    reads_running_jobs = False  # the free GPUs alone decide

    def _preserves(self, ctx: DecisionContext) -> bool:
        return not ctx.request.sensitive or ctx.k == 1

    def objective(self, ctx: DecisionContext) -> str:
        if self._preserves(ctx):
            return "max preserved NVLink bandwidth (MAPA Eq. 3), then aggregated"
        return ctx.sensitive_objective().describe()

    def search(self, ctx: DecisionContext) -> Placement:
        if self._preserves(ctx):
            order = self._preserve(ctx)
        else:
            found = best_ordered_placement(
                ctx.host,
                ctx.request.pattern,
                ctx.sensitive_objective(),
                ctx.pool,
                sorted(ctx.request.required),
            )
            assert found is not None
            order = found.order
        return ctx.placement(self.name, order, self.objective(ctx))

    def set_key(self, ctx: DecisionContext, order: Sequence[int]) -> SetKey:
        pattern = ctx.request.pattern
        if self._preserves(ctx):
            aggregated = evaluate_order(ctx.host, pattern, AggregatedObjective(), order)
            preserved = preserved_gbps(ctx.host, ctx.state.free, order)
            return (round(preserved, 6), *aggregated)
        return evaluate_order(ctx.host, pattern, ctx.sensitive_objective(), order)

    def key_bound(self, ctx: DecisionContext, gpus: Sequence[int]) -> SetKey | None:
        """Bounds of :meth:`set_key` on a fixed set (``ctx.k`` GPUs): its preserved bandwidth
        exactly, or its slowest pattern link (each GPU's ``d``-th widest link in the set, for a
        pattern whose ranks have ``d`` edges or more), then the aggregated bound. Table 2 is
        not monotone: its key is the set's own, over every order (it scores 2 to 5 edges, so
        at most 6! orders)."""
        if len(gpus) != ctx.k:
            return None
        pattern, host = ctx.request.pattern, ctx.host
        aggregated = aggregated_upper_bound(host, pattern, gpus)
        if self._preserves(ctx):
            return (round(preserved_gbps(host, ctx.state.free, gpus), 6), aggregated)
        if ctx.resolved_model is EffectiveModel.MAPA:
            objective = ctx.sensitive_objective()
            return max(evaluate_order(host, pattern, objective, o) for o in permutations(gpus))
        return (slowest_link_bound(host, pattern, gpus), aggregated)

    def order_of(self, ctx: DecisionContext, gpus: tuple[int, ...]) -> tuple[int, ...]:
        if self._preserves(ctx):
            return ctx.order_for_set(gpus)
        return best_order_of_set(ctx.host, ctx.request.pattern, ctx.sensitive_objective(), gpus)

    def reason(
        self, ctx: DecisionContext, placement: Placement, runner_up: Alternative | None
    ) -> str:
        s = placement.scores
        if self._preserves(ctx):
            return _preserve_reason(ctx, placement, runner_up)
        if s.effective_model == "mapa":
            x, y, z = mapa_counts(ctx.host, pattern_pairs(placement.gpus, ctx.request.pattern))
            text = (
                f"predicted effective bandwidth {s.effective_gbps:g} GB/s (Table 2 on {x} "
                f"double-NVLink, {y} single-NVLink, {z} PCIe pattern edges)"
            )
        else:
            text = f"slowest pattern link {s.effective_gbps:g} GB/s"
        if runner_up:
            text += (
                f"; runner-up {gpu_list(runner_up.gpus)} predicts "
                f"{runner_up.scores.effective_gbps:g} GB/s"
            )
        return text

    # ---- Preserve ----------------------------------------------------------------------------

    def _preserve(self, ctx: DecisionContext) -> tuple[int, ...]:
        loss = LossSearch(ctx)
        ties = loss.tied_sets()
        first = next(ties)
        if ctx.k == 1 or len(ctx.request.pattern.edges) == 0:
            return first
        # Among the sets that preserve the most, the highest aggregated bandwidth, then the first.
        objective = AggregatedObjective()
        host, pattern = ctx.host, ctx.request.pattern
        few = list(islice(ties, _UNION_SEARCH_SETS))
        ties = chain(few, ties)
        if loss.every_set_ties() or 1 + len(few) == loss.candidate_count():
            # Every candidate set ties (no free NVLink, or k of k + 1 free GPUs): the
            # tie-break is MAPA Greedy's search over the pool.
            found = best_ordered_placement(
                host, pattern, objective, ctx.pool, sorted(ctx.request.required)
            )
            assert found is not None
            return found.order
        # A tree job with few tied sets: refuting a better key once for them all.
        if is_forest(pattern) and len(few) < _UNION_SEARCH_SETS:
            return _best_of_few_sets(host, pattern, [first, *few]).order
        # Otherwise the lowest tied set wins at once if it reaches a bound no k-set of the pool
        # can beat (a uniform NVSwitch host, where every set ties); if not, the tied sets are
        # searched in decreasing order of their own upper bounds, stopping when none can catch up.
        found = best_ordered_placement(host, pattern, objective, first, first)
        assert found is not None
        if found.key[0] >= aggregated_upper_bound(host, pattern, ctx.pool, ctx.k) - _SLACK:
            return found.order
        best_key, best_order, best_set = found.key, found.order, first
        bounded = sorted((-aggregated_upper_bound(host, pattern, gpus), gpus) for gpus in ties)
        bounded = _lowest_of_orbits(host, first, bounded)
        for negative_bound, gpus in bounded:
            bound = -negative_bound
            if bound < best_key[0] - _SLACK or (bound <= best_key[0] + _SLACK and gpus > best_set):
                break
            found = best_ordered_placement(host, pattern, objective, gpus, gpus)
            assert found is not None
            if found.key > best_key or (found.key == best_key and gpus < best_set):
                best_key, best_order, best_set = found.key, found.order, gpus
        return best_order


def _lowest_of_orbits(
    host: HostGraph, first: tuple[int, ...], bounded: list[tuple[float, tuple[int, ...]]]
) -> list[tuple[float, tuple[int, ...]]]:
    """The tied sets worth searching after ``first``: those lowest in their orbit under the
    host's symmetries among the tied sets (:mod:`gpualloc.placement.mapa.symmetry`). A symmetric
    image has the same best key and the same bound, so the lower of two never loses to the
    higher (an insensitive 14-GPU ring on ``torus-2d-16`` has 13 tied sets to search
    otherwise; ``tests/test_symmetry.py``)."""
    if len(bounded) < 2:
        return bounded
    symmetries = cached_host_symmetries(host)
    if len(symmetries) < 2:
        return bounded
    sets = sorted({first, *(gpus for _, gpus in bounded)})
    lowest = {members[0] for members in set_orbits(sets, symmetries)}
    return [(bound, gpus) for bound, gpus in bounded if gpus in lowest]


def _best_of_few_sets(
    host: HostGraph, pattern: CommunicationPattern, sets: Sequence[tuple[int, ...]]
) -> SearchResult:
    """The best aggregated placement of a tree job on one of a few tied ``sets`` (the lowest set
    first, lexicographically): the highest key, then the lowest set, then the lowest order.

    The lowest set is searched alone: its key is then the floor the others must beat, and
    finding a realisation (the expensive part on a fixed set) is not repeated for them. The
    others only have keys above the floor to refute, on one set per orbit of the host's
    symmetries (:mod:`gpualloc.placement.mapa.symmetry`: a symmetric set has the same best key;
    found once per host and process, as the order search's root orbits are, not at every
    decision), together (:func:`best_placement_among`). That is exact: a representative is the
    lowest set of its orbit, so the lowest set reaching the best key is a representative.
    """
    objective = AggregatedObjective()
    lowest = best_ordered_placement(host, pattern, objective, sets[0], sets[0])
    assert lowest is not None
    orbits = set_orbits(sets, cached_host_symmetries(host))
    others = [members[0] for members in orbits[1:]]  # the first orbit holds the lowest set
    better = best_placement_among(host, pattern, objective, others, floor=lowest.key)
    return better or lowest


class LossSearch:
    """The candidate sets that remove the least NVLink bandwidth from the free pool (Eq. 3).

    ``lost(S) = sum_{v in S} d(v) - internal(S)``, with ``d`` a GPU's NVLink bandwidth to free
    GPUs. Sets are walked depth first in lexicographic order, one GPU at a time in O(n). A branch
    with ``r`` GPUs still to pick is cut by a lower bound on what they add: the ``r`` smallest
    ``d(g) - links(g, chosen)`` among the candidates, less the ``r (r - 1) / 2`` widest NVLinks
    among the candidates (what the new GPUs could share). The bound is exact on a uniform fabric,
    so there the minimum and the first tied set cost O(n k) steps, not C(n, k). The candidates of
    a node are a suffix of the pool, so their widest NVLinks are summed once per suffix, and each
    GPU's links to the chosen ones are kept as GPUs come and go (rather than the bound rebuilt
    from every pair at every node, O(n^2 log n)); a node costs O(n log n). Where that bound
    does not cut, a second one is tried: each new GPU shares at most its ``r - 1`` widest
    NVLinks to the candidates with the other new ones, each shared link counted at both ends,
    so it adds at least ``d(g) - links(g, chosen) - top_{r-1}(g) / 2``; on a sparse mesh (a
    torus, a hypercube) this is the tighter one, since the ``r (r - 1) / 2`` widest links among
    the candidates cannot all touch ``r`` GPUs (``tests/test_placement_optimality.py``: the
    search still finds every tied set).
    """

    def __init__(self, ctx: DecisionContext) -> None:
        self.k = ctx.k
        self.pool = ctx.pool
        self.required = ctx.request.required
        free = sorted(ctx.state.free)
        self.nv = ctx.host.nvlink_bandwidth
        self.degree = {v: sum(self.nv[v][u] for u in free if u != v) for v in self.pool}
        self._widest: dict[int, list[list[float]]] = {}
        # The per-GPU bound can only beat the pair bound where some pairs have no NVLink.
        self._sparse = any(self.nv[a][b] == 0 for a in self.pool for b in self.pool if a != b)
        self.minimum = self.least_loss()

    def every_set_ties(self) -> bool:
        """Whether every candidate set loses the same, known without listing them: none of the
        pool's GPUs has an NVLink to a free GPU (a PCIe-only host), so each loses nothing."""
        return not any(self.degree.values())

    def candidate_count(self) -> int:
        """How many candidate sets there are: k of the pool, with the required GPUs."""
        required = len(self.required)
        return comb(len(self.pool) - required, self.k - required)

    def tied_sets(self) -> Iterator[tuple[int, ...]]:
        """Every set of minimal loss, lexicographically, generated lazily."""
        return self._walk(self.minimum)

    def least_loss(self) -> float:
        for _ in self._walk(None):
            pass
        return self._least

    def _walk(self, target: float | None) -> Iterator[tuple[int, ...]]:
        """With ``target`` None, find the least loss (in ``_least``); else yield every set
        that loses ``target``."""
        k, pool, nv, degree, required = self.k, self.pool, self.nv, self.degree, self.required
        self._least = float("inf") if target is None else target
        chosen: list[int] = []
        # Per GPU, its NVLink bandwidth to the chosen ones, kept as they come and go (for the
        # bound only: a set's loss is summed as it always was).
        to_chosen = dict.fromkeys(pool, 0.0)
        shared = self._shared_sums()
        tick = deadline.current().tick

        def lower_bound(start: int, need: int, lost: float, cut: float) -> float:
            """A lower bound on the loss of any completion (rounded) of a set that lost
            ``lost`` with ``need`` GPUs of ``pool[start:]`` to add; the second, costlier bound
            only where the first stays below ``cut`` (where a branch is cut)."""
            adds = sorted(degree[g] - to_chosen[g] for g in pool[start:])
            by_pairs = round(lost + sum(adds[:need]) - shared[start][need * (need - 1) // 2], 6)
            if by_pairs >= cut or not self._sparse:
                return by_pairs
            # Each new GPU shares at most its need - 1 widest links with the others, and
            # each shared link is counted at both ends.
            own = self._widest_from(start)
            halves = sorted(
                degree[g] - to_chosen[g] - own[i][need - 1] / 2 for i, g in enumerate(pool[start:])
            )
            return max(by_pairs, round(lost + sum(halves[:need]), 6))

        def extend(start: int, lost: float) -> Iterator[tuple[int, ...]]:
            tick()
            need = k - len(chosen)
            if need == 0:
                if not required <= set(chosen):
                    return
                value = round(lost, 6)
                if target is None:
                    self._least = min(self._least, value)
                elif abs(value - target) <= _SLACK:
                    yield tuple(chosen)
                return
            cut = self._least - _SLACK if target is None else self._least + _SLACK
            bound = lower_bound(start, need, lost, cut)
            if bound > self._least + _SLACK:
                return
            if target is None and bound >= self._least - _SLACK:
                return  # finding the minimum: a tie cannot lower it
            for index in range(start, len(pool) - need + 1):
                g = pool[index]
                # A required GPU cannot be skipped: every later set would miss it.
                if any(r < g and r not in chosen for r in required):
                    break
                inside = sum(nv[g][c] for c in chosen)  # summed as the keys always were
                chosen.append(g)
                row = nv[g]
                for h in pool:
                    to_chosen[h] += row[h]
                yield from extend(index + 1, lost + degree[g] - inside)
                for h in pool:
                    to_chosen[h] -= row[h]
                chosen.pop()

        return extend(0, 0.0)

    def _widest_from(self, start: int) -> list[list[float]]:
        """Per GPU of ``pool[start:]``, the sums of its j widest NVLinks to the others there,
        j = 0, 1, ...: no GPU added from there shares more with the other new ones. Computed
        for a start index when a branch first needs it, once per search."""
        cached = self._widest.get(start)
        if cached is None:
            rest, nv = self.pool[start:], self.nv
            cached = self._widest[start] = [
                list(
                    accumulate(
                        sorted((nv[a][b] for b in rest if b != a), reverse=True), initial=0.0
                    )
                )
                for a in rest
            ]
        return cached

    def _shared_sums(self) -> list[list[float]]:
        """Per start index, the sums of the j widest NVLinks among the pool's GPUs from there
        on (what the GPUs still to pick could share), j = 0, 1, ...: the candidates of a node
        are a suffix of the pool, so these are computed once, not per node."""
        pool, nv = self.pool, self.nv
        sums = []
        for start in range(len(pool) + 1):
            rest = pool[start:]
            widest = sorted(
                (nv[a][b] for i, a in enumerate(rest) for b in rest[i + 1 :]), reverse=True
            )
            sums.append(list(accumulate(widest, initial=0.0)))
        return sums


def aggregated_upper_bound(
    host: HostGraph, pattern: CommunicationPattern, gpus: Sequence[int], size: int | None = None
) -> float:
    """An upper bound on the aggregated bandwidth of ``pattern`` on the set ``gpus``, in any order.

    Each rank has at most ``d`` pattern edges (``d`` the pattern's largest degree), so each GPU
    contributes at most its ``d`` widest links within the set, and every edge has two ends; and
    the pattern's ``E`` edges are at most the ``E`` widest pairs (a pair listed twice, as in the
    2-GPU ring, at most the widest pair each time). Rounded like the search's keys.
    """
    bw = host.bandwidth
    edges = len(pattern.edges)
    pairs = sorted((bw[a][b] for i, a in enumerate(gpus) for b in gpus[i + 1 :]), reverse=True)
    if len(set(pattern.edges)) < edges:  # a pair listed twice: the widest pair each time
        return round(edges * (pairs[0] if pairs else 0.0), 6)
    degree: dict[int, int] = {}
    for u, v in pattern.edges:
        degree[u] = degree.get(u, 0) + 1
        degree[v] = degree.get(v, 0) + 1
    d = max(degree.values(), default=0)
    rows = [sorted((bw[a][b] for b in gpus if b != a), reverse=True) for a in gpus]
    # A subset of ``size`` GPUs: the ``size`` largest contributions bound any of them.
    tops = sorted((sum(row[:d]) for row in rows), reverse=True)
    by_degree = sum(tops[: size or len(gpus)]) / 2
    by_pairs = sum(pairs[:edges])
    return round(min(by_degree, by_pairs), 6)


def slowest_link_bound(
    host: HostGraph, pattern: CommunicationPattern, gpus: Sequence[int]
) -> float:
    """An upper bound on the slowest pattern link of any order of ``pattern`` on ``gpus``:
    every GPU hosts a rank with pattern edges to at least ``d`` other ranks (``d`` the least
    such count; a pair listed twice, as in the 2-GPU ring, is one), so it uses ``d`` of its
    links within the set, the slowest no faster than its ``d``-th widest."""
    neighbours: list[set[int]] = [set() for _ in range(pattern.size)]
    for u, v in pattern.edges:
        neighbours[u].add(v)
        neighbours[v].add(u)
    d = min((len(n) for n in neighbours), default=0)
    if d == 0 or len(gpus) < 2:
        return math.inf
    bw = host.bandwidth
    return min(sorted((bw[a][b] for b in gpus if b != a), reverse=True)[d - 1] for a in gpus)


def _nvlink_pairs_left(ctx: DecisionContext, chosen: Sequence[int]) -> list[tuple[int, int]]:
    """NVLinked pairs among the GPUs the placement leaves free, widest first."""
    left = sorted(ctx.state.free - set(chosen))
    nv = ctx.host.nvlink_bandwidth
    pairs = [(a, b) for i, a in enumerate(left) for b in left[i + 1 :] if nv[a][b] > 0]
    pairs.sort(key=lambda p: (-nv[p[0]][p[1]], p))
    return pairs


def _preserve_reason(
    ctx: DecisionContext, placement: Placement, runner_up: Alternative | None
) -> str:
    """What the placement keeps: the whole preserved bandwidth, over how many NVLinked pairs,
    the widest of them named."""
    kept = _nvlink_pairs_left(ctx, placement.gpus)
    preserved = placement.scores.preserved_gbps
    if not kept:
        text = "leaves no NVLinked pair among the free GPUs (nothing to preserve)"
    else:
        links = ctx.host.nvlinks
        shown = ", ".join(f"NV{links[a][b]} {a}-{b}" for a, b in kept[:3])
        more = f" and {len(kept) - 3} more" if len(kept) > 3 else ""
        pairs = "pair" if len(kept) == 1 else "pairs"
        text = (
            f"keeps {preserved:g} GB/s of NVLink among the GPUs left free, over {len(kept)} "
            f"{pairs} ({shown}{more})"
        )
    if runner_up:
        text += (
            f"; runner-up {gpu_list(runner_up.gpus)} keeps {runner_up.scores.preserved_gbps:g} GB/s"
        )
    return text
