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
   the weight the unplaced ranks can still add, from :mod:`gpualloc.placement.treebound`,
   must reach what the vector's budget still asks for; a tree search that outgrows
   ``ESCALATE_AFTER_NODES`` tightens that bound with Lagrangian penalties per GPU and checks it
   at every node from then on, which cut the 14-rank tree on 14 GPUs of a torus from 27,544
   nodes to about 4,000). Dead ends
   are remembered by the GPUs used, the GPUs of the ranks still read and the budget left,
   which on a ring is Held and Karp's dynamic program over subsets.
4. **Symmetry and ties.** Orders equivalent under an automorphism of the pattern are skipped
   (:mod:`gpualloc.placement.patterns`: a ring has 2k equivalent orders). Among placements with
   the same key the lexicographically lowest sorted GPU set wins, then the lowest order; the DFS
   visits orders lexicographically and cuts a branch whose lowest reachable set cannot beat the
   incumbent.

Keys are rounded to 1e-6 so that the same links summed in another order tie exactly.

Complexity: the problems are NP-hard (a ring is a travelling-salesman tour), so the worst case is
exponential; on hosts with few link classes the work is a few thousand search nodes per decision.
``benchmarks/bench_placement.py`` measures every bundled host, pattern and size.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import combinations
from math import comb

from msgspec import Struct

from gpualloc.model.request import CommunicationPattern
from gpualloc.placement.host import HostGraph
from gpualloc.placement.patterns import search_shape
from gpualloc.placement.scores import (
    EffectiveModel,
    aggregated_gbps,
    mapa_counts,
    mapa_predicted_gbps,
    pattern_pairs,
)
from gpualloc.placement.treebound import TreeWeightBound, greedy_weight, lagrangian_bound

Key = tuple[float, ...]
_INF = float("inf")
_WEIGHT_SLACK = 1e-6
"""Weights summed in different orders differ in the last bits; bounds compare with this slack."""


def _r(value: float) -> float:
    return round(value, 6)


# ---- objectives ------------------------------------------------------------------------------


class EdgeObjective:
    """What a search maximises, as a function of the pattern edges' link classes."""

    name = "aggregated"

    def key(self, agg: float, x: int, y: int, z: int, low: float) -> Key:
        return (_r(agg),)

    def describe(self) -> str:
        return "max aggregated bandwidth (MAPA Eq. 1)"


class AggregatedObjective(EdgeObjective):
    name = "aggregated"


class MapaObjective(EdgeObjective):
    """Table 2 first, aggregated bandwidth second (MAPA Algorithm 1, with a tie-break)."""

    name = "mapa"

    def key(self, agg: float, x: int, y: int, z: int, low: float) -> Key:
        return (_r(mapa_predicted_gbps(x, y, z)), _r(agg))

    def describe(self) -> str:
        return "max predicted effective bandwidth (MAPA Eq. 2, Table 2), then aggregated"


class BottleneckObjective(EdgeObjective):
    """Slowest pattern link first, aggregated bandwidth second."""

    name = "bottleneck"

    def key(self, agg: float, x: int, y: int, z: int, low: float) -> Key:
        return (_r(low if low < _INF else 0.0), _r(agg))

    def describe(self) -> str:
        return "max slowest pattern link (edge-bottleneck effective bandwidth), then aggregated"


def effective_objective(model: EffectiveModel) -> EdgeObjective:
    """The objective of a sensitive job under a resolved effective-bandwidth model."""
    return MapaObjective() if model is EffectiveModel.MAPA else BottleneckObjective()


def evaluate_order(
    host: HostGraph, pattern: CommunicationPattern, objective: EdgeObjective, order: Sequence[int]
) -> Key:
    """The objective's key of one ordered placement (the brute-force reference)."""
    pairs = pattern_pairs(order, pattern)
    low = min((host.bandwidth[a][b] for a, b in pairs), default=_INF)
    return objective.key(aggregated_gbps(host, pairs), *mapa_counts(host, pairs), low)


# ---- link classes ----------------------------------------------------------------------------


class _Classes(Struct, frozen=True):
    """The distinct (MAPA class, bandwidth) combinations among the pool's pairs."""

    of_pair: tuple[tuple[int, ...], ...]  # class id per GPU pair (-1 on the diagonal)
    mapa: tuple[int, ...]  # MAPA class per class id
    weight: tuple[float, ...]  # bandwidth per class id
    adjacency: tuple[tuple[int, ...], ...]  # per class: bitmask of pool neighbours per GPU


def _link_classes(host: HostGraph, pool: Sequence[int]) -> _Classes:
    n = host.gpu_count
    ids: dict[tuple[int, float], int] = {}
    of_pair = [[-1] * n for _ in range(n)]
    for i, a in enumerate(pool):
        for b in pool[i + 1 :]:
            label = (host.mapa_class[a][b], _r(host.bandwidth[a][b]))
            c = ids.setdefault(label, len(ids))
            of_pair[a][b] = of_pair[b][a] = c
    labels = sorted(ids, key=ids.__getitem__)
    adjacency = [[0] * n for _ in labels]
    for a in pool:
        for b in pool:
            if a != b:
                adjacency[of_pair[a][b]][a] |= 1 << b
    return _Classes(
        of_pair=tuple(tuple(row) for row in of_pair),
        mapa=tuple(label[0] for label in labels),
        weight=tuple(label[1] for label in labels),
        adjacency=tuple(tuple(row) for row in adjacency),
    )


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

ESCALATE_AFTER_NODES = 1500
"""A tree search that has visited this many nodes with the cheap bounds tightens its subtree
bound with Lagrangian penalties (:func:`gpualloc.placement.treebound.lagrangian_bound`, about
15 DP passes) and applies it at every node from then on: worth it on the hard cases only."""
LAGRANGIAN_ROUNDS = 15


class _Escalate(Exception):
    """The search outgrew its cheap bounds: tighten them, then try the vector again."""


# ---- the search ------------------------------------------------------------------------------


class SearchResult(Struct):
    order: tuple[int, ...]
    key: Key
    vectors_tried: int
    nodes: int


class PlacementSearch:
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
        self.classes = _link_classes(host, self.pool)
        self.capacity = self._class_capacities()
        self.required_mask = sum(1 << g for g in self.required)
        # Candidate sets the placement must be one of (None: any k-set of the pool), as masks.
        self.allowed: tuple[int, ...] | None = None
        self.nodes = 0
        self.escalate_at: float = _INF
        # Only keys above the floor are wanted (None: any).
        self.floor: Key | None = None

    # ---- public ------------------------------------------------------------------------------

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
            realise = self._realise_star if self.pattern.name == "star" else self._realise
            for vector in ranked[key]:
                if self._beyond_tree_bound(vector):
                    continue
                tried += 1
                try:
                    found = realise(vector, best)
                except _Escalate:
                    self._tighten_tree_bound()
                    if self._beyond_tree_bound(vector):
                        continue
                    found = realise(vector, best)
                if found is not None:
                    best = found
            if best is not None:
                return SearchResult(best[1], key, tried, self.nodes)
        return None

    def _prepare_budget_search(self) -> None:
        """What the count-vector search needs beyond the other paths: the positions each step
        still reads, the groups of link classes with their bounds, the lookahead's tables."""
        # Positions that later steps still read (edges to close, symmetry constraints).
        self.live = [
            tuple(
                sorted(
                    {
                        p
                        for t in range(s, self.k)
                        for p in (*self.back[t], *self.after[t], *self.before[t])
                    }
                    & set(range(s))
                )
            )
            for s in range(self.k)
        ]
        # For the lookahead, per step s: the edges still to close (earlier position first,
        # children before parents), how many of them leave each live position, and how many
        # join two positions not yet assigned.
        closing = [(p, t) for t in range(self.k) for p in self.back[t]]
        self.remaining_edges = [
            sorted(((p, t) for p, t in closing if t >= s), key=lambda edge: -edge[1])
            for s in range(self.k)
        ]
        self.pending = [
            tuple(
                (p, count)
                for p in self.live[s]
                if (count := sum(1 for q, t in closing if q == p and t >= s))
            )
            for s in range(self.k)
        ]
        self.unanchored = [sum(1 for p, _ in closing if p >= s) for s in range(self.k)]
        # For the degree-deficit bound: the degrees of the ranks not yet assigned, largest first.
        visit_degree = [0] * self.k
        for u, v in self.pattern.edges:
            visit_degree[self.visit.index(u)] += 1
            visit_degree[self.visit.index(v)] += 1
        self.open_degrees = [sorted(visit_degree[s:], reverse=True) for s in range(self.k)]
        # The deficit bound needs each pair of ranks joined once (a 2-GPU ring lists its pair
        # twice); on forests the leaves-up count of the tight groups already covers it and the
        # extra work per node did not pay off. Forests get the subtree bound instead.
        simple = len(set(map(frozenset, self.pattern.edges))) == len(self.pattern.edges)
        simple_forest = simple and _forest_parents(self.pattern) is not None
        self.deficit_bound = simple and not simple_forest
        self.group_masks = self._class_groups(self.host.gpu_count)
        self.group_caps = self._class_group_capacities()
        # Groups whose GPUs have fewer links in them than some rank has edges: on a tree pattern
        # the lookahead also counts how the degree limit caps the edges still to close.
        max_degree = self.max_degree
        self.tight_groups: tuple[tuple[tuple[int, ...], tuple[int, ...], int], ...] = ()
        if simple_forest:
            self.tight_groups = tuple(
                (members, masks, widest)
                for members, masks, widest in self.group_masks
                if widest < max_degree
            )
        self.tree_bound = self._tree_bound() if simple_forest else None
        # Per node the subtree bound pays where it is tight: where the fastest links form a
        # forest (cube-mesh-16's NV2 spanning tree), a relaxed map that keeps its edges on them
        # is a real placement. Where they close cycles (a torus) the relaxation wraps around
        # them, refutes little and costs a fifth of the search; the vectors are still screened
        # with it.
        self.tree_bound_per_node = self.tree_bound is not None and self._fastest_links_acyclic()
        if self.tree_bound is not None:
            self.escalate_at = ESCALATE_AFTER_NODES

    def _tighten_tree_bound(self) -> None:
        """Escalation: the subtree bound with Lagrangian penalties per GPU, checked at every
        node from now on. The relaxation's wrapping around cycles of fast links (which made the
        plain bound too weak per node on a torus) is what the penalties price out; Polyak's
        steps aim at the weight of a greedy placement, a value some placement reaches."""
        self.escalate_at = _INF
        parent, pool, weights = self._tree_bound_inputs()
        aim = greedy_weight(parent, pool, weights, self.k)
        self.tree_bound = lagrangian_bound(
            parent, pool, weights, aim, LAGRANGIAN_ROUNDS, self.allowed
        )
        self.tree_bound_per_node = True

    def _beyond_tree_bound(self, vector: tuple[int, ...]) -> bool:
        """Whether the subtree bound (tightened since the vectors were screened) refutes it."""
        return (
            self.tree_bound is not None
            and self._vector_weight(vector) - _WEIGHT_SLACK > self.tree_bound.whole()
        )

    def _fastest_links_acyclic(self) -> bool:
        """Whether the links of the fastest class form a forest on the pool."""
        weight = self.classes.weight
        fastest = max(range(len(weight)), key=weight.__getitem__)
        adjacency = self.classes.adjacency[fastest]
        links = sum(adjacency[g].bit_count() for g in self.pool) // 2
        return links == len(self.pool) - len(_component_sizes(self.pool, adjacency))

    def _tree_bound(self) -> TreeWeightBound:
        """The subtree bound of :mod:`gpualloc.placement.treebound` (simple forests only)."""
        return TreeWeightBound(*self._tree_bound_inputs())

    def _tree_bound_inputs(self) -> tuple[list[int | None], tuple[int, ...], list[list[float]]]:
        """The parent positions, the pool and the class weights of every pair."""
        parent = [b[0] if b else None for b in self.back]
        n = self.host.gpu_count
        of_pair, weight = self.classes.of_pair, self.classes.weight
        weights = [[weight[of_pair[a][b]] if a != b else 0.0 for b in range(n)] for a in range(n)]
        return parent, self.pool, weights

    # ---- vectors -----------------------------------------------------------------------------

    def _vector_key(self, vector: tuple[int, ...]) -> Key:
        counts = [0, 0, 0]
        agg = 0.0
        low = _INF
        for c, count in enumerate(vector):
            if count:
                counts[self.classes.mapa[c]] += count
                agg += count * self.classes.weight[c]
                low = min(low, self.classes.weight[c])
        return self.objective.key(agg, counts[0], counts[1], counts[2], low)

    def _vector_weight(self, vector: Sequence[int]) -> float:
        """The weight (class bandwidths summed) every realisation of ``vector`` carries."""
        return sum(count * w for count, w in zip(vector, self.classes.weight, strict=True))

    def _class_capacities(self) -> tuple[int, ...]:
        """Per class, the most pattern edges it can carry on k of the pool's GPUs.

        Each pattern vertex has at most ``max_degree`` edges, so a GPU contributes at most
        ``min(max_degree, its class-c neighbours)`` edge ends; a 2-GPU pattern lists its one pair
        as often as it likes, so there any class present suffices.
        """
        k, d = self.k, self.max_degree
        capacities = []
        for adjacency in self.classes.adjacency:
            ends = sorted((min(d, adjacency[g].bit_count()) for g in self.pool), reverse=True)
            if k == 2:
                capacities.append(len(self.pattern.edges) if ends[0] else 0)
            else:
                capacities.append(sum(ends[:k]) // 2)
        return tuple(capacities)

    def _class_groups(
        self, gpu_count: int
    ) -> tuple[tuple[tuple[int, ...], tuple[int, ...], int], ...]:
        """The groups of link classes the bounds look at, each with its per-GPU neighbour masks
        and the most links in the group that one pool GPU has.

        Every proper subset when there are few classes (a DGX-1 has three); with many (a measured
        matrix) the single classes and the j fastest classes together, which is where NVLink-like
        groups sit.
        """
        weight = self.classes.weight
        n_classes = len(weight)
        if n_classes <= 5:
            groups = [
                tuple(c for c in range(n_classes) if mask >> c & 1)
                for mask in range(1, (1 << n_classes) - 1)
            ]
        else:
            fastest = sorted(range(n_classes), key=lambda c: -weight[c])
            groups = [(c,) for c in range(n_classes)]
            groups += [tuple(sorted(fastest[:j])) for j in range(2, n_classes)]
        adjacency = self.classes.adjacency
        result = []
        for members in groups:
            masks = tuple(_or(adjacency[c][g] for c in members) for g in range(gpu_count))
            widest = max((masks[g].bit_count() for g in self.pool), default=0)
            result.append((members, masks, widest))
        return tuple(result)

    def _class_group_capacities(self) -> tuple[tuple[tuple[int, ...], int], ...]:
        """Per group T of classes, the most pattern edges T's links can carry together.

        Two necessary conditions, both computed once per search:

        - *Components.* The pattern edges that land on T's links join GPUs of one connected
          component of T's link graph, so if the k GPUs span ``g`` components, every edge
          between two of them is lost to T. A connected pattern split ``g`` ways loses at least
          ``g - 1`` edges, a 2-edge-connected one (a ring) at least ``g`` when ``g >= 2``; ``g``
          is at least the fewest components that hold k pool GPUs with the required ones.
        - *Degree.* A GPU has at most ``D`` links in T, so the pattern edges on T form a
          subgraph of the pattern whose degrees are at most ``D``: a binary tree of 16 ranks
          fits at most 11 of its 15 edges on NV2 links when every GPU has two of them.
        - *Parity.* When T's link graph is bipartite (the NVLinks of a 2D torus, a hypercube,
          the NV2 links of a DGX-1), colour its sides A and B: a placement colours each rank by
          its GPU's side, and only edges between ranks of different colours can lie on T. With
          ``a`` of the k GPUs on side A, at least ``m(a)`` pattern edges join ranks of one
          colour (:func:`_fewest_monochromatic`): an odd ring never fits on such links, and a
          16-rank binary tree (6 ranks on one side of its own bipartition, 10 on the other)
          keeps at least one edge off a torus's NVLinks, where each side has 8 GPUs.
        - *Paths.* When no GPU has more than two links in T (T's links are paths and cycles,
          like the NV2 rows of a torus), the edges of a tree pattern on T form disjoint paths
          of the pattern, none longer than its diameter ``D``, and each inside one component of
          T's links: a component of ``s`` GPUs holds at most ``max over p of min(s - p, p D)``
          of them. A 14-rank binary tree (``D = 6``) fits at most 6 edges on an 8-GPU NV2
          cycle, where counting alone allows 7.
        """
        two_edge_connected = _two_edge_connected(self.pattern)
        edges = len(self.pattern.edges)
        monochromatic = _fewest_monochromatic(self.pattern)
        diameter = _forest_diameter(self.pattern)
        groups = []
        for members, masks, widest in self.group_masks:
            cap = edges
            if two_edge_connected is not None:
                spanned = self._fewest_components(members)
                if spanned > 1:
                    cap -= spanned if two_edge_connected else spanned - 1
            cap = min(cap, _degree_limited_edges(self.pattern, widest))
            if widest <= 2 and diameter is not None:
                cap = min(cap, self._paths_within_components(masks, diameter))
            if monochromatic is not None:
                cap = min(cap, edges - self._fewest_off_bipartite(masks, monochromatic))
            if cap < edges:
                groups.append((members, max(0, cap)))
        return tuple(groups)

    def _paths_within_components(self, masks: tuple[int, ...], diameter: int) -> int:
        """The *Paths* cap of :meth:`_class_group_capacities`, summed over the components of the
        links ``masks`` on the pool (a set of k of them can only use fewer)."""
        total = 0
        for size in _component_sizes(self.pool, masks):
            total += max((min(size - p, p * diameter) for p in range(1, size + 1)), default=0)
        return total

    def _fewest_off_bipartite(self, masks: tuple[int, ...], monochromatic: list[int]) -> int:
        """The fewest pattern edges that cannot lie on the links ``masks`` (per GPU, its pool
        neighbours on them): 0 unless those links form a bipartite graph (the parity bound of
        :meth:`_class_group_capacities`), else the least ``m(a)`` over the numbers ``a`` of
        side-A GPUs a candidate set can have."""
        side_a = _bipartition(self.pool, masks)
        if side_a is None:
            return 0
        k = self.k
        if self.allowed is not None:
            counts = {(mask & side_a).bit_count() for mask in self.allowed}
        else:
            in_a = sum(1 for g in self.pool if side_a >> g & 1)
            in_b = len(self.pool) - in_a
            required_a = sum(1 for g in self.required if side_a >> g & 1)
            required_b = len(self.required) - required_a
            counts = set(range(max(required_a, k - in_b), min(in_a, k - required_b) + 1))
        return min((monochromatic[a] for a in counts), default=0)

    def _fewest_components(self, members: tuple[int, ...]) -> int:
        """The fewest components of the classes' link graph that hold k pool GPUs (with the
        required ones)."""
        adjacency = self.classes.adjacency
        component_of: dict[int, int] = {}
        sizes: list[int] = []
        for start in self.pool:
            if start in component_of:
                continue
            index = len(sizes)
            stack, size = [start], 0
            component_of[start] = index
            while stack:
                g = stack.pop()
                size += 1
                reach = 0
                for c in members:
                    reach |= adjacency[c][g]
                while reach:
                    low = reach & -reach
                    h = low.bit_length() - 1
                    reach ^= low
                    if h not in component_of:
                        component_of[h] = index
                        stack.append(h)
            sizes.append(size)
        forced = {component_of[r] for r in self.required}
        covered = sum(sizes[i] for i in forced)
        spanned = len(forced)
        for size in sorted((sizes[i] for i in range(len(sizes)) if i not in forced), reverse=True):
            if covered >= self.k:
                break
            covered += size
            spanned += 1
        return max(spanned, 1)

    def _obviously_unrealisable(self, vector: tuple[int, ...]) -> bool:
        if any(count > cap for count, cap in zip(vector, self.capacity, strict=True)):
            return True
        if self._beyond_tree_bound(vector):
            return True
        return any(sum(vector[c] for c in members) > cap for members, cap in self.group_caps)

    # ---- budgeted DFS ------------------------------------------------------------------------

    def _realise(
        self,
        vector: tuple[int, ...],
        incumbent: tuple[tuple[int, ...], tuple[int, ...]] | None,
    ) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """The lowest (sorted set, order) realising ``vector`` that beats ``incumbent``.

        Dead ends are remembered: two partial placements that used the same GPUs, hold the same
        GPUs at the ranks later edges and symmetry constraints still refer to, and have the same
        budget left have the same completions, so a state that failed once fails again (the
        incumbent only improves). On a ring this is Held and Karp's dynamic program over subsets.
        Paths to one state differ only in the GPUs of ranks no longer read, so they reach the
        same sets; a subtree is remembered only if no completion in it lost to the incumbent on
        the order alone (same set), the one comparison that depends on those ranks.
        """
        k = self.k
        pool = self.pool
        of_pair = self.classes.of_pair
        back, after, before, live = self.back, self.after, self.before, self.live
        budget = list(vector)
        assigned = [0] * k
        required_mask = self.required_mask
        visit = self.visit
        best: list = [incumbent]
        failed: set[tuple] = set()
        order_ties = [0]  # completions that lost to the incumbent on the order alone

        def lowest_reachable_set(s: int, used: int) -> tuple[int, ...]:
            chosen = assigned[:s]
            need = k - s
            extra = []
            for g in pool:
                if need == 0:
                    break
                if not used >> g & 1:
                    extra.append(g)
                    need -= 1
            return tuple(sorted(chosen + extra))

        group_masks, pending, unanchored = self.group_masks, self.pending, self.unanchored
        tight_groups, remaining_edges = self.tight_groups, self.remaining_edges
        open_degrees, deficit_bound = self.open_degrees, self.deficit_bound
        tree_bound, weights = self.tree_bound, self.classes.weight
        if not self.tree_bound_per_node:
            tree_bound = None
        escalate_at = self.escalate_at
        allowed = self.allowed
        pool_mask = _or(1 << g for g in pool)

        def lookahead_ok(s: int, used: int, free: int) -> bool:
            """Each group of classes can still take its remaining budget: an assigned GPU closes
            at most as many of its open edges on the group's links as it has unused neighbours
            on them; an edge between two unassigned ranks may land anywhere."""
            loose = unanchored[s]
            for members, masks, _ in group_masks:
                want = 0
                for c in members:
                    want += budget[c]
                if want <= loose:
                    continue
                room = loose
                for p, count in pending[s]:
                    room += min(count, (masks[assigned[p]] & free).bit_count())
                    if room >= want:
                        break
                if room < want:
                    return False
            for members, masks, limit in tight_groups:
                want = 0
                for c in members:
                    want += budget[c]
                if want and forest_room(s, free, masks, limit) < want:
                    return False
            if deficit_bound:
                return deficits_ok(s, free)
            if tree_bound is not None:
                want = 0.0
                for c, w in enumerate(weights):
                    want += budget[c] * w
                return tree_bound.remaining(s, assigned, used, free) >= want - _WEIGHT_SLACK
            return True

        def deficits_ok(s: int, unused: int) -> bool:
            """Each group of classes against the degree deficit of what is left. A rank of
            degree d on a GPU with t neighbours on the group's links sends at least d - t of
            its edges elsewhere; an edge off the group covers two such deficits at most. The
            unassigned ranks' deficits are least when the highest degrees go to the GPUs with
            the most neighbours (the convexity of max(0, d - t))."""
            reachable = unused
            for p, _ in pending[s]:
                reachable |= 1 << assigned[p]
            degrees = open_degrees[s]
            edges_left = len(remaining_edges[s])
            unused_gpus = []
            rest = unused
            while rest:
                low = rest & -rest
                unused_gpus.append(low.bit_length() - 1)
                rest ^= low
            for members, masks, _ in group_masks:
                want = 0
                for c in members:
                    want += budget[c]
                if not want:
                    continue
                deficit = 0
                for p, count in pending[s]:
                    room = (masks[assigned[p]] & unused).bit_count()
                    if count > room:
                        deficit += count - room
                offers = [(masks[g] & reachable).bit_count() for g in unused_gpus]
                offers.sort(reverse=True)
                # More GPUs than ranks may be left: the ranks take the best-connected ones.
                for degree, offer in zip(degrees, offers, strict=False):
                    if degree > offer:
                        deficit += degree - offer
                if want > edges_left - (deficit + 1) // 2:
                    return False
            return True

        def forest_room(s: int, free: int, masks: tuple[int, ...], limit: int) -> int:
            """The most remaining tree edges on a group whose GPUs have at most ``limit`` links
            in it: greedy from the leaves up, an assigned rank offering its unused neighbours."""
            room: dict[int, int] = {}
            taken = 0
            for p, t in remaining_edges[s]:
                if t not in room:
                    room[t] = limit
                if p not in room:
                    room[p] = (masks[assigned[p]] & free).bit_count() if p < s else limit
                if room[t] and room[p]:
                    room[t] -= 1
                    room[p] -= 1
                    taken += 1
            return taken

        def step(s: int, used: int) -> bool:
            self.nodes += 1
            if self.nodes > escalate_at:
                raise _Escalate
            free = pool_mask & ~used
            if allowed is not None:
                # Only GPUs of the candidate sets that hold every GPU used so far remain.
                reach = 0
                for mask in allowed:
                    if not used & ~mask:
                        reach |= mask
                if not reach:
                    return False
                free &= reach
            if s == k:
                order = [0] * k
                for position, vertex in enumerate(visit):
                    order[vertex] = assigned[position]
                candidate = (tuple(sorted(assigned)), tuple(order))
                if best[0] is not None and candidate >= best[0]:
                    order_ties[0] += candidate[0] == best[0][0]
                    return False
                best[0] = candidate
                return True
            state = (used, *[assigned[p] for p in live[s]], *budget)
            if state in failed:
                return False
            ties_before = order_ties[0]
            if s and not lookahead_ok(s, used, free):
                failed.add(state)
                return False
            missing = (required_mask & ~used).bit_count()
            if missing > k - s:
                return False
            if best[0] is not None and lowest_reachable_set(s, used) >= best[0][0]:
                return False
            lower, upper = -1, 1 << 30
            for p in after[s]:
                if assigned[p] > lower:
                    lower = assigned[p]
            for p in before[s]:
                if assigned[p] < upper:
                    upper = assigned[p]
            must_be_required = missing == k - s
            found = False
            for g in pool:
                if g <= lower or not free >> g & 1:
                    continue
                if g >= upper:
                    break
                if must_be_required and not required_mask >> g & 1:
                    continue
                row = of_pair[g]
                spent = []
                ok = True
                for p in back[s]:
                    c = row[assigned[p]]
                    budget[c] -= 1
                    spent.append(c)
                    if budget[c] < 0:
                        ok = False
                        break
                if ok:
                    assigned[s] = g
                    if step(s + 1, used | 1 << g):
                        found = True
                for c in spent:
                    budget[c] += 1
                if found and best[0] is not None and lowest_reachable_set(s, used) >= best[0][0]:
                    break
            if not found and order_ties[0] == ties_before:
                failed.add(state)
            return found

        if step(0, 0):
            return best[0]
        return None

    def _realise_star(
        self,
        vector: tuple[int, ...],
        incumbent: tuple[tuple[int, ...], tuple[int, ...]] | None,
    ) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """A star's edges all touch its centre: per centre, the leaves of each class are free
        to choose, so the lowest ones of each class give the lowest set (O(n) per centre)."""
        of_pair = self.classes.of_pair
        best = incumbent
        self.nodes += 1
        for center in self.pool:
            need = list(vector)
            leaves: list[int] = []
            for r in sorted(self.required - {center}):
                need[of_pair[center][r]] -= 1
                leaves.append(r)
            if min(need) < 0:
                continue
            for g in self.pool:
                if g == center or g in self.required:
                    continue
                c = of_pair[center][g]
                if need[c] > 0:
                    need[c] -= 1
                    leaves.append(g)
            if any(need):
                continue
            leaves.sort()
            candidate = (tuple(sorted((center, *leaves))), (center, *leaves))
            if best is None or candidate < best:
                best = candidate
        return best if best is not incumbent else None

    # ---- the easy and the fallback cases ------------------------------------------------------

    def _run_order_free(self) -> SearchResult | None:
        """All orders of a set score the same: search sets only (lexicographic, first best)."""
        if self.pattern.name == "all" and self.k > 2:
            return self._run_all_pairs()
        best_key: Key | None = None
        best_set: tuple[int, ...] | None = None
        count = 0
        for gpus in candidate_sets(self.pool, self.required, self.k):
            count += 1
            key = evaluate_order(self.host, self.pattern, self.objective, gpus)
            if best_key is None or key > best_key:
                best_key, best_set = key, gpus
        if best_set is None or best_key is None:
            return None
        return SearchResult(best_set, best_key, 0, count)

    def _run_all_pairs(self) -> SearchResult | None:
        """All-to-all: a set's key depends only on how many of its pairs fall in each link
        class. Sets are walked depth first in lexicographic order, the class counts updated
        with one popcount per class and GPU added, and keys cached per count vector."""
        k, pool = self.k, self.pool
        adjacency = self.classes.adjacency
        n_classes = len(self.classes.weight)
        required_mask = self.required_mask
        keys: dict[tuple[int, ...], Key] = {}
        best: list = [None, None]
        chosen: list[int] = []

        def walk(start: int, mask: int, counts: tuple[int, ...]) -> None:
            self.nodes += 1
            if len(chosen) == k:
                if required_mask & ~mask:
                    return
                key = keys.get(counts)
                if key is None:
                    key = keys[counts] = self._vector_key(counts)
                if best[0] is None or key > best[0]:
                    best[0], best[1] = key, tuple(chosen)
                return
            need = k - len(chosen)
            for index in range(start, len(pool) - need + 1):
                g = pool[index]
                # A required GPU cannot be skipped: every later set would miss it.
                if (required_mask & ~mask) & ((1 << g) - 1):
                    break
                chosen.append(g)
                walk(
                    index + 1,
                    mask | 1 << g,
                    tuple(
                        counts[c] + (adjacency[c][g] & mask).bit_count() for c in range(n_classes)
                    ),
                )
                chosen.pop()

        walk(0, 0, (0,) * n_classes)
        if best[1] is None:
            return None
        return SearchResult(best[1], best[0], 0, self.nodes)

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

        def step(s: int, agg: float, counts: tuple[int, int, int], low: float) -> None:
            self.nodes += 1
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
                    and _r(na + remaining[s + 1] * widest) < best[0][0]
                ):
                    continue
                used.add(g)
                assigned[s] = g
                step(s + 1, na, (c[0], c[1], c[2]), nlow)
                used.discard(g)

        step(0, 0.0, (0, 0, 0), _INF)
        if best[0] is None:
            return None
        return SearchResult(best[1][1], best[0], 0, self.nodes)


def _or(masks: Iterable[int]) -> int:
    result = 0
    for mask in masks:
        result |= mask
    return result


def _degree_limited_edges(pattern: CommunicationPattern, limit: int) -> int:
    """The most edges of a subgraph of ``pattern`` in which no rank has more than ``limit``.

    Exact for forests (greedy from the leaves up: taking a leaf's edge never hurts) and rings;
    the degree-sum bound otherwise.
    """
    k, edges = pattern.size, pattern.edges
    degree = [0] * k
    for u, v in edges:
        degree[u] += 1
        degree[v] += 1
    if limit >= max(degree, default=0):
        return len(edges)
    simple = len(set(edges)) == len(edges)
    if pattern.name == "ring" and simple:
        return k if limit >= 2 else (k // 2 if limit == 1 else 0)
    parent = _forest_parents(pattern) if simple else None
    if parent is None:
        return min(len(edges), sum(min(d, limit) for d in degree) // 2)
    room = [limit] * k
    taken = 0
    for v in reversed(parent):  # children before parents
        up = parent[v]
        if up is not None and room[v] > 0 and room[up] > 0:
            room[v] -= 1
            room[up] -= 1
            taken += 1
    return taken


def _forest_parents(pattern: CommunicationPattern) -> dict[int, int | None] | None:
    """Each rank's parent in a breadth-first forest of ``pattern`` (insertion order is BFS
    order), or None if the pattern has a cycle."""
    neighbours: list[list[int]] = [[] for _ in range(pattern.size)]
    for u, v in pattern.edges:
        neighbours[u].append(v)
        neighbours[v].append(u)
    parent: dict[int, int | None] = {}
    for root in range(pattern.size):
        if root in parent:
            continue
        parent[root] = None
        queue = [root]
        while queue:
            v = queue.pop(0)
            for w in neighbours[v]:
                if w == parent[v]:
                    continue
                if w in parent:
                    return None
                parent[w] = v
                queue.append(w)
    return parent


def _component_sizes(pool: Sequence[int], masks: Sequence[int]) -> list[int]:
    """The sizes of the connected components of the graph on ``pool`` whose neighbours of GPU
    g are ``masks[g]`` (restricted to the pool)."""
    in_pool = _or(1 << g for g in pool)
    seen = 0
    sizes = []
    for start in pool:
        if seen >> start & 1:
            continue
        seen |= 1 << start
        stack, size = [start], 0
        while stack:
            size += 1
            reach = masks[stack.pop()] & in_pool & ~seen
            seen |= reach
            while reach:
                low = reach & -reach
                stack.append(low.bit_length() - 1)
                reach ^= low
        sizes.append(size)
    return sizes


def _forest_diameter(pattern: CommunicationPattern) -> int | None:
    """The most edges on a path of a forest pattern (None for other patterns): from any rank
    the farthest one is an end of a longest path of its tree, and from there the farthest is
    the other end."""
    parents = _forest_parents(pattern)
    if parents is None or not pattern.edges:
        return None
    neighbours: list[list[int]] = [[] for _ in range(pattern.size)]
    for u, v in pattern.edges:
        neighbours[u].append(v)
        neighbours[v].append(u)

    def farthest(start: int) -> tuple[int, int]:
        distance = {start: 0}
        queue = [start]
        for v in queue:
            for w in neighbours[v]:
                if w not in distance:
                    distance[w] = distance[v] + 1
                    queue.append(w)
        end = max(distance, key=distance.__getitem__)
        return end, distance[end]

    return max(farthest(farthest(root)[0])[1] for root, up in parents.items() if up is None)


def _bipartition(pool: Sequence[int], masks: Sequence[int]) -> int | None:
    """A bitmask of one side of the graph on ``pool`` whose neighbours of GPU g are
    ``masks[g]``, or None if the graph has an odd cycle. Each component is coloured from its
    lowest GPU; any proper colouring serves the parity bound."""
    in_pool = _or(1 << g for g in pool)
    colour: dict[int, int] = {}
    side_a = 0
    for start in pool:
        if start in colour:
            continue
        colour[start] = 0
        stack = [start]
        while stack:
            g = stack.pop()
            if colour[g] == 0:
                side_a |= 1 << g
            reach = masks[g] & in_pool
            while reach:
                low = reach & -reach
                h = low.bit_length() - 1
                reach ^= low
                if h not in colour:
                    colour[h] = 1 - colour[g]
                    stack.append(h)
                elif colour[h] == colour[g]:
                    return None
    return side_a


def _fewest_monochromatic(pattern: CommunicationPattern) -> list[int] | None:
    """``m[a]`` for a = 0..k: the fewest pattern edges whose two ranks share a colour, over
    the 2-colourings of the ranks with exactly ``a`` of them coloured A. Exact for forests (a
    dynamic program over subtrees) and for a single cycle (k - 2 min(a, k - a) edges: each run
    of A ranks is bounded by two bichromatic edges); None for other patterns (the bound is then
    not used)."""
    k, edges = pattern.size, pattern.edges
    if k == 0 or not edges:
        return None
    degree = [0] * k
    for u, v in edges:
        degree[u] += 1
        degree[v] += 1
    parents = _forest_parents(pattern)
    if parents is None:
        cycle = len(edges) == k and all(d == 2 for d in degree) and _two_edge_connected(pattern)
        if not cycle:
            return None
        return [k - 2 * min(a, k - a) for a in range(k + 1)]
    children: list[list[int]] = [[] for _ in range(k)]
    for v, p in parents.items():
        if p is not None:
            children[p].append(v)
    inf = k + 1

    def subtree(v: int) -> list[list[int]]:
        """best[c][a]: fewest monochromatic edges below v, v coloured c, a ranks coloured A."""
        best = [[0, inf], [inf, 0]]  # v alone: coloured B (no A rank), or A (one)
        for child in children[v]:
            below = subtree(child)
            merged = [[inf] * (len(best[0]) + len(below[0]) - 1) for _ in range(2)]
            for c in range(2):
                for a, cost in enumerate(best[c]):
                    if cost >= inf:
                        continue
                    for cc in range(2):
                        for b, extra in enumerate(below[cc]):
                            total = cost + extra + (c == cc)
                            if total < merged[c][a + b]:
                                merged[c][a + b] = total
            best = merged
        return best

    whole = [0]
    for root in [v for v, p in parents.items() if p is None]:
        part = subtree(root)
        combined = [min(part[0][a], part[1][a]) for a in range(len(part[0]))]
        merged = [inf] * (len(whole) + len(combined) - 1)
        for a, cost in enumerate(whole):
            for b, extra in enumerate(combined):
                merged[a + b] = min(merged[a + b], cost + extra)
        whole = merged
    return whole


def _two_edge_connected(pattern: CommunicationPattern) -> bool | None:
    """Whether a connected pattern survives the loss of any one edge; None if disconnected."""
    k, edges = pattern.size, pattern.edges
    if k < 2 or not edges:
        return None

    def connected(kept: Sequence[tuple[int, int]]) -> bool:
        neighbours: list[list[int]] = [[] for _ in range(k)]
        for u, v in kept:
            neighbours[u].append(v)
            neighbours[v].append(u)
        seen, stack = {0}, [0]
        while stack:
            for w in neighbours[stack.pop()]:
                if w not in seen:
                    seen.add(w)
                    stack.append(w)
        return len(seen) == k

    if not connected(edges):
        return None
    return all(connected(edges[:i] + edges[i + 1 :]) for i in range(len(edges)))


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


def best_ordered_placement(
    host: HostGraph,
    pattern: CommunicationPattern,
    objective: EdgeObjective,
    pool: Sequence[int],
    required: Sequence[int] = (),
) -> SearchResult | None:
    """The best (set, order) of ``pattern`` on ``pool`` under ``objective``; None if infeasible."""
    return PlacementSearch(host, pattern, objective, pool, required).run()


def best_placement_among(
    host: HostGraph,
    pattern: CommunicationPattern,
    objective: EdgeObjective,
    sets: Sequence[tuple[int, ...]],
    floor: Key | None = None,
) -> SearchResult | None:
    """The best (set, order) whose set is one of ``sets``: the highest key, then the lowest
    sorted set, then the lowest order, as if each set were searched on its own; only keys above
    ``floor`` count (None if no placement has one).

    The count-vector search runs once over the union of the sets, each branch restricted to
    the GPUs of the sets that hold everything it used: the vectors above the optimum are
    refuted once, not once per set. That pays on trees, whose refutations are the expensive
    part; rings are refuted quickly on an exact set by the degree-deficit bound, which is
    weaker on a union (see :func:`is_forest`). Order-free patterns, stars and many-class hosts,
    which do not use the count-vector search, go set by set.
    """
    if not sets:
        return None
    union = sorted(set().union(*sets))
    common = sorted(set(sets[0]).intersection(*sets[1:]))
    search = PlacementSearch(host, pattern, objective, union, common)
    edges = len(pattern.edges)
    n_classes = len(search.classes.weight)
    vector_path = (
        not search.order_free
        and edges > 0
        and pattern.name != "star"
        and comb(edges + n_classes - 1, n_classes - 1) <= MAX_VECTORS
    )
    search.floor = floor
    if vector_path and len(sets) > 1:
        search.allowed = tuple(_or(1 << g for g in gpus) for gpus in sets)
        return search.run()
    best: SearchResult | None = None
    best_set: tuple[int, ...] = ()
    star = _is_star(pattern)
    for gpus in sets:
        if star:
            found: SearchResult | None = _best_star_order(host, pattern, objective, gpus)
        else:
            found = best_ordered_placement(host, pattern, objective, gpus, gpus)
        if found is None or (floor is not None and found.key <= floor):
            continue
        ordered = tuple(sorted(gpus))
        if best is None or found.key > best.key or (found.key == best.key and ordered < best_set):
            best, best_set = found, ordered
    return best


def _is_star(pattern: CommunicationPattern) -> bool:
    """Rank 0 talks to every other rank once, and nobody else talks."""
    return sorted(pattern.edges) == [(0, i) for i in range(1, pattern.size)]


def _best_star_order(
    host: HostGraph, pattern: CommunicationPattern, objective: EdgeObjective, gpus: Sequence[int]
) -> SearchResult:
    """The best order of a star on exactly ``gpus``: every edge touches the hub, so the score
    depends on the hub alone; k candidates instead of a search. The hub comes first and the
    leaves ascend, which makes the first best hub the lowest optimal order, as the search
    would return it (MAPA's tie-break among many tied sets calls this once per set)."""
    ordered = sorted(gpus)
    best_order: tuple[int, ...] = ()
    best_key: Key | None = None
    for hub in ordered:
        order = (hub, *(g for g in ordered if g != hub))
        key = evaluate_order(host, pattern, objective, order)
        if best_key is None or key > best_key:
            best_order, best_key = order, key
    assert best_key is not None
    return SearchResult(best_order, best_key, vectors_tried=0, nodes=len(ordered))


def is_forest(pattern: CommunicationPattern) -> bool:
    """Whether the pattern is a forest (a tree, a star): where searching a family of sets
    together (:func:`best_placement_among`) beats searching them one by one."""
    return _forest_parents(pattern) is not None


def best_order_of_set(
    host: HostGraph, pattern: CommunicationPattern, objective: EdgeObjective, gpus: Sequence[int]
) -> tuple[int, ...]:
    """The best order of a set chosen by another objective (pack, spread, DRB)."""
    result = PlacementSearch(host, pattern, objective, gpus, gpus).run()
    assert result is not None
    return result.order
