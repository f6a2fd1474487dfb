"""Exact search for the best ordered placement under an edge objective.

An *edge objective* scores an ordered placement from the links that carry the pattern's edges:
the aggregated bandwidth (MAPA Greedy), the predicted effective bandwidth then the aggregated one
(MAPA Preserve for a sensitive job), or the slowest link then the aggregated bandwidth (the general
effective estimate). The original MAPA enumerates all k! orders of every candidate set (half a
billion evaluations for 8 of 16 GPUs). This module finds the structure instead:

1. **Link classes and count vectors.** Pairs of GPUs fall into a few classes: the distinct
   (MAPA class, bandwidth) combinations of the host, typically 2 to 4 (NV2 / NV1 / PCIe on a
   DGX-1). Every objective is a function of the *count vector*: how many of the pattern's edges
   land in each class. A ring of 8 has at most 45 vectors over 3 classes, against 8!/16 orders
   of each of the 12,870 sets.
2. **Vectors best first.** Vectors are ranked by the objective and tried in that order; the first
   vector that some placement *realises* is optimal. Necessary conditions discard most
   unrealisable vectors without search: a class cannot carry more edges than its links can under
   the pattern's degrees; a group of classes whose links fall into ``g`` components loses the
   ``g - 1`` pattern edges (``g`` for a ring) that must cross between them; and a group whose
   GPUs have at most ``D`` links in it carries at most the largest subgraph of the pattern with
   degrees ``<= D`` (11 of a 16-rank binary tree's 15 edges when ``D = 2``).
3. **Budgeted depth-first search.** A vector is checked by assigning ranks to GPUs in the
   pattern's visiting order, spending one unit of the class budget per pattern edge closed; a
   branch dies as soon as a budget goes negative, or when a lookahead shows that a group of
   classes can no longer take what is left of its budget (an assigned GPU closes at most as many
   edges on a group's links as it has unused neighbours on them; on a tree the degree limit
   is applied to the edges still open; on other patterns, a rank of degree d on a GPU with t
   neighbours in the group sends d - t edges elsewhere, and one edge off the group covers at
   most two such deficits, the highest degrees going to the best-connected GPUs; on a tree,
   the weight the unplaced ranks can still add, from :mod:`.treebound`,
   must reach what the vector's budget still asks for; a tree search that outgrows
   ``ESCALATE_AFTER_NODES`` tightens that bound with Lagrangian penalties per GPU and checks it
   at every node from then on, which cut the 14-rank tree on 14 GPUs of a torus from 27,544
   nodes to about 4,000). Dead ends
   are remembered by the GPUs used, the GPUs of the ranks still read and the budget left,
   which on a ring is Held and Karp's dynamic program over subsets.
4. **Symmetry and ties.** Orders equivalent under an automorphism of the pattern are skipped
   (:mod:`.patterns`: a ring has 2k equivalent orders), and of twin GPUs (the
   same link class to every other: the GPUs under one PCIe switch, an NVSwitch host's GPUs)
   the lower is placed first, on the lower rank. Among placements with
   the same key the lexicographically lowest sorted GPU set wins, then the lowest order; the DFS
   visits orders lexicographically and cuts a branch whose lowest reachable set cannot beat the
   incumbent, or whose sets that could (they hold the incumbent's lowest GPUs) cannot carry the
   vector (:mod:`.set_capacity`).

Keys are rounded to 1e-6 so that the same links summed in another order tie exactly.

The module is the search itself; its link classes are :mod:`.link_classes`, its objectives
:mod:`.objectives`, its bounds :mod:`.search_bounds`, its depth-first realisation
:mod:`.realise`, the pattern and link-graph facts they use :mod:`.pattern_graphs`, and what
other modules call :mod:`.exact`.

Complexity: the problems are NP-hard (a ring is a travelling-salesman tour), so the worst case is
exponential; on hosts with few link classes the work is a few thousand search nodes per decision.
``benchmarks/bench_placement.py`` measures every bundled host, pattern and size.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from math import comb

from msgspec import Struct

from gpualloc.model.request import CommunicationPattern
from gpualloc.placement import deadline
from gpualloc.placement.host_graph import HostGraph
from gpualloc.placement.mapa.all_pairs import best_all_pairs_set
from gpualloc.placement.mapa.link_classes import link_classes
from gpualloc.placement.mapa.objectives import EdgeObjective, Key, evaluate_order, rounded
from gpualloc.placement.mapa.pattern_graphs import or_masks
from gpualloc.placement.mapa.patterns import search_shape
from gpualloc.placement.mapa.realise import Escalate, realise, realise_star
from gpualloc.placement.mapa.search_bounds import VectorBounds
from gpualloc.placement.sets.candidates import candidate_sets
from gpualloc.placement.sets.search import CostOnly, SetSearch, twin_classes


def _vectors(classes: int, total: int) -> list[tuple[int, ...]]:
    """Every way to spread ``total`` edges over ``classes`` classes."""
    if classes == 1:
        return [(total,)]
    result = []
    for first in range(total, -1, -1):
        for rest in _vectors(classes - 1, total - first):
            result.append((first, *rest))
    return result


MAX_VECTORS = 20_000
"""Above this many count vectors (many distinct link bandwidths and a large pattern) the search
falls back to plain branch and bound over orders."""


class SearchResult(Struct):
    order: tuple[int, ...]
    key: Key
    vectors_tried: int
    nodes: int


class PlacementSearch(VectorBounds):
    """Best ordered placement of one pattern on a pool of GPUs under one objective."""

    def __init__(
        self,
        host: HostGraph,
        pattern: CommunicationPattern,
        objective: EdgeObjective,
        pool: Sequence[int],
        required: Sequence[int] = (),
    ) -> None:
        self.host = host
        self.deadline = deadline.current()
        self.pattern = pattern
        self.objective = objective
        self.pool = tuple(sorted(set(pool)))
        self.required = frozenset(required)
        self.k = pattern.size
        shape = search_shape(pattern)
        self.order_free = shape.order_free
        self.visit = shape.visit
        position = {v: i for i, v in enumerate(shape.visit)}
        back: list[list[int]] = [[] for _ in range(self.k)]
        for u, v in pattern.edges:
            pu, pv = position[u], position[v]
            back[max(pu, pv)].append(min(pu, pv))
        self.back = [tuple(b) for b in back]
        after: list[list[int]] = [[] for _ in range(self.k)]
        before: list[list[int]] = [[] for _ in range(self.k)]
        for i, j in shape.less_than:
            pi, pj = position[i], position[j]
            if pi < pj:
                after[pj].append(pi)
            else:
                before[pi].append(pj)
        self.after = [tuple(a) for a in after]
        self.before = [tuple(b) for b in before]
        degree = [0] * self.k
        for u, v in pattern.edges:
            degree[u] += 1
            degree[v] += 1
        self.max_degree = max(degree, default=0)
        self.classes = link_classes(host, self.pool)
        self.capacity = self._class_capacities()
        self.required_mask = sum(1 << g for g in self.required)
        # Candidate sets the placement must be one of (None: any k-set of the pool), as masks.
        self.allowed: tuple[int, ...] | None = None
        self.nodes = 0
        self.escalate_at: float = math.inf
        # Only keys above the floor are wanted (None: any).
        self.floor: Key | None = None

    def run(self) -> SearchResult | None:
        if len(self.pool) < self.k or not self.required <= set(self.pool):
            return None
        if len(self.required) > self.k:
            return None
        edges = len(self.pattern.edges)
        if self.order_free or edges == 0:
            return self._run_order_free()
        n_classes = len(self.classes.weight)
        if comb(edges + n_classes - 1, n_classes - 1) > MAX_VECTORS:
            return self._run_branch_and_bound()
        self._prepare_budget_search()
        self.lower_twins = self._lower_twins()
        ranked: dict[Key, list[tuple[int, ...]]] = {}
        for vector in _vectors(n_classes, edges):
            if self._obviously_unrealisable(vector):
                continue
            ranked.setdefault(self._vector_key(vector), []).append(vector)
        tried = 0
        for key in sorted(ranked, reverse=True):
            if self.floor is not None and key <= self.floor:
                break
            best: tuple[tuple[int, ...], tuple[int, ...]] | None = None  # (sorted set, order)
            realise_vector = realise_star if self.pattern.name == "star" else realise
            for vector in ranked[key]:
                if self._beyond_tree_bound(vector):
                    continue
                tried += 1
                try:
                    found = realise_vector(self, vector, best)
                except Escalate:
                    self._tighten_tree_bound()
                    if self._beyond_tree_bound(vector):
                        continue
                    found = realise_vector(self, vector, best)
                if found is not None:
                    best = found
            if best is not None:
                return SearchResult(best[1], key, tried, self.nodes)
        return None

    # ---- the easy and the fallback cases ----------------------------------------------------

    def _run_order_free(self) -> SearchResult | None:
        """All orders of a set score the same: search sets only (lexicographic, first best)."""
        if self.pattern.name == "all" and self.k > 2:
            return self._run_all_pairs()
        best_key: Key | None = None
        best_set: tuple[int, ...] | None = None
        count = 0
        for gpus in self.deadline.watch(candidate_sets(self.pool, self.required, self.k)):
            count += 1
            key = evaluate_order(self.host, self.pattern, self.objective, gpus)
            if best_key is None or key > best_key:
                best_key, best_set = key, gpus
        if best_set is None or best_key is None:
            return None
        return SearchResult(best_set, best_key, 0, count)

    def _run_all_pairs(self) -> SearchResult | None:
        """All-to-all: a set's key depends only on how many of its pairs fall in each link
        class. Under the aggregated bandwidth that is a heaviest k-subset: the branch and bound
        of :mod:`gpualloc.placement.sets.search` finds it. Otherwise the walk over sets of
        :mod:`.all_pairs`."""
        if self.objective.name == "aggregated":
            return self._heaviest_set()
        found = best_all_pairs_set(self, self._lower_twins())
        if found is None:
            return None
        return SearchResult(found[1], found[0], 0, self.nodes)

    def _lower_twins(self) -> list[int]:
        """Per GPU, a mask of its lower twins in the pool (the same link class to every other
        GPU), which a realisation places first (:mod:`.realise`): swapping twins keeps every
        edge's class, and the lowest realisation puts the lower twin in the set and on the
        lower rank. A required GPU's lower twin counts only if it is required too (it could
        not replace the required one in the set; two required twins are only reordered, which
        on an exact set, where every GPU is required, is the whole of the symmetry: a PCIe
        host's switches). Only where ranks are visited in index order (the built-in
        patterns) and any set of the pool may be taken (no candidate sets)."""
        n = self.host.gpu_count
        lower = [0] * n
        if self.allowed is not None or self.visit != tuple(range(self.k)):
            return lower
        rep = twin_classes(_pair_labels(self.host)[0], (0,) * n)
        required = self.required
        for g in self.pool:
            for h in self.pool:
                if h < g and rep[h] == rep[g] and (h in required or g not in required):
                    lower[g] |= 1 << h
        return lower

    def _heaviest_set(self) -> SearchResult:
        """All-to-all under the aggregated bandwidth: the lowest set of the most bandwidth over
        its pairs, by :class:`~gpualloc.placement.sets.search.SetSearch` on the distance
        ``widest - bandwidth`` (the set of least distance is the heaviest); the key of a set is
        the count vector's, as in the walk."""
        host, k = self.host, self.k
        labels, distance = _pair_labels(host)
        adjacency = self.classes.adjacency
        n_classes = len(self.classes.weight)

        def key_of(gpus: tuple[int, ...]) -> Key:
            mask = or_masks(1 << g for g in gpus)
            counts = [0] * n_classes
            for g in gpus:
                for c in range(n_classes):
                    counts[c] += (adjacency[c][g] & mask).bit_count()
            return self._vector_key(tuple(count // 2 for count in counts))

        pairs_total = k * (k - 1) // 2 * max(max(row) for row in host.bandwidth)
        search = SetSearch(
            CostOnly(distance), self.pool, self.required, k, key_of,
            lambda cost, _fragmentation, _interference, _free: (rounded(pairs_total - cost),),
            twins=twin_classes(labels, (0,) * host.gpu_count),
        )  # fmt: skip
        best = search.run()
        self.nodes += search.nodes
        return SearchResult(best, key_of(best), 0, self.nodes)

    def _run_branch_and_bound(self) -> SearchResult | None:
        """Plain search over all orders with the widest-link bound (many link classes)."""
        best: list = [None, None]  # key, (sorted set, order)
        k, pool = self.k, self.pool
        bw = self.host.bandwidth
        widest = max((bw[a][b] for a in pool for b in pool if a != b), default=0.0)
        remaining = [0] * (k + 1)
        for s in range(k - 1, -1, -1):
            remaining[s] = remaining[s + 1] + len(self.back[s])
        assigned = [0] * k
        used: set[int] = set()
        host, objective, visit = self.host, self.objective, self.visit
        cls = host.mapa_class
        tick = self.deadline.tick

        def step(s: int, agg: float, counts: tuple[int, int, int], low: float) -> None:
            self.nodes += 1
            tick()
            if s == k:
                order = [0] * k
                for position, vertex in enumerate(visit):
                    order[vertex] = assigned[position]
                key = objective.key(agg, *counts, low)
                candidate = (tuple(sorted(assigned)), tuple(order))
                if best[0] is None or key > best[0] or (key == best[0] and candidate < best[1]):
                    best[0], best[1] = key, candidate
                return
            if len(self.required - used) > k - s:
                return
            lower = max((assigned[p] for p in self.after[s]), default=-1)
            upper = min((assigned[p] for p in self.before[s]), default=1 << 30)
            for g in pool:
                if g <= lower or g >= upper or g in used:
                    continue
                na, nlow = agg, low
                c = list(counts)
                for p in self.back[s]:
                    w = bw[g][assigned[p]]
                    na += w
                    nlow = min(nlow, w)
                    c[cls[g][assigned[p]]] += 1
                if (
                    best[0] is not None
                    and objective.name == "aggregated"
                    and rounded(na + remaining[s + 1] * widest) < best[0][0]
                ):
                    continue
                used.add(g)
                assigned[s] = g
                step(s + 1, na, (c[0], c[1], c[2]), nlow)
                used.discard(g)

        step(0, 0.0, (0, 0, 0), math.inf)
        if best[0] is None:
            return None
        return SearchResult(best[1][1], best[0], 0, self.nodes)


@functools.lru_cache(maxsize=8)
def _pair_labels(
    host: HostGraph,
) -> tuple[tuple[tuple[tuple[int, float], ...], ...], tuple[tuple[float, ...], ...]]:
    """Per pair of the host's GPUs, its link class label (MAPA class, rounded bandwidth), and
    the distance ``widest - bandwidth`` of the heaviest-set search (cached per host)."""
    n, bandwidth = host.gpu_count, host.bandwidth
    widest = max((max(row) for row in bandwidth), default=0.0)
    labels = tuple(
        tuple((host.mapa_class[a][b], rounded(bandwidth[a][b])) for b in range(n)) for a in range(n)
    )
    distance = tuple(
        tuple(widest - rounded(bandwidth[a][b]) if a != b else 0.0 for b in range(n))
        for a in range(n)
    )
    return labels, distance
