"""The necessary conditions that let the exact search (:mod:`.search`) discard count vectors
and cut branches without enumerating orders: step 2 of the search's method (class and group
capacities from components, degrees, parity and paths) and the lookahead tables of step 3
(the edges each step still has to close, the open degrees, the subtree bound of
:mod:`.treebound` and its Lagrangian tightening).

:class:`VectorBounds` is a part of :class:`~.search.PlacementSearch`, kept in
its own module because it is the half of the search that proves, not the half that finds; it
reads the search's pool, pattern, link classes and visiting order. It declares (or sets) every
attribute of the search that :mod:`.realise` reads, so that :mod:`.realise` names the search by
this class and need not import :mod:`.search`, which imports it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gpualloc.placement.mapa.objectives import WEIGHT_SLACK, Key
from gpualloc.placement.mapa.pattern_graphs import (
    bipartition,
    component_sizes,
    degree_limited_edges,
    edges_cut,
    fewest_monochromatic,
    fewest_pieces,
    forest_diameter,
    forest_parents,
    or_masks,
    two_edge_connected,
)
from gpualloc.placement.mapa.treebound import TreeWeightBound, greedy_weight, lagrangian_bound

if TYPE_CHECKING:
    from gpualloc.model.request import CommunicationPattern
    from gpualloc.placement.deadline import Deadline
    from gpualloc.placement.host_graph import HostGraph
    from gpualloc.placement.mapa.link_classes import LinkClasses
    from gpualloc.placement.mapa.objectives import EdgeObjective

ESCALATE_AFTER_NODES = 1500
"""A tree search that has visited this many nodes with the cheap bounds tightens its subtree
bound with Lagrangian penalties (:func:`.treebound.lagrangian_bound`, about
15 DP passes) and applies it at every node from then on: worth it on the hard cases only."""
LAGRANGIAN_ROUNDS = 15


class VectorBounds:
    """Bounds on what count vectors a pool can realise (see the module docstring)."""

    # Set by PlacementSearch.__init__ (declared here for the reader and the type checker).
    host: HostGraph
    pattern: CommunicationPattern
    objective: EdgeObjective
    pool: tuple[int, ...]
    required: frozenset[int]
    required_mask: int
    k: int
    visit: tuple[int, ...]
    back: list[tuple[int, ...]]
    after: list[tuple[int, ...]]
    before: list[tuple[int, ...]]
    max_degree: int
    open_degrees: list[list[int]]
    degree_sums: list[int]
    classes: LinkClasses
    capacity: tuple[int, ...]
    allowed: tuple[int, ...] | None
    lower_twins: list[int]
    escalate_at: float
    nodes: int
    deadline: Deadline
    root_orbits: list[int] | None = None
    """Per GPU, its orbit under the host's symmetries that keep the pool and the required GPUs
    (:func:`.symmetry.orbit_masks`), computed when :mod:`.realise` first
    needs it."""
    simple_pattern: bool
    """Each pair of ranks joined once (a 2-GPU ring lists its pair twice)."""
    ring_like: bool | None
    """Whether the pattern survives the loss of any one edge (None: it is not connected)."""

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
        self.degree_sums = [sum(degrees) for degrees in self.open_degrees]
        # The deficit bound needs each pair of ranks joined once (a 2-GPU ring lists its pair
        # twice); on forests the leaves-up count of the tight groups already covers it and the
        # extra work per node did not pay off. Forests get the subtree bound instead.
        simple = len(set(map(frozenset, self.pattern.edges))) == len(self.pattern.edges)
        self.simple_pattern = simple
        self.ring_like = two_edge_connected(self.pattern)
        simple_forest = simple and forest_parents(self.pattern) is not None
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
        self.escalate_at = math.inf
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
            and self._vector_weight(vector) - WEIGHT_SLACK > self.tree_bound.whole()
        )

    def _fastest_links_acyclic(self) -> bool:
        """Whether the links of the fastest class form a forest on the pool."""
        weight = self.classes.weight
        fastest = max(range(len(weight)), key=weight.__getitem__)
        adjacency = self.classes.adjacency[fastest]
        links = sum(adjacency[g].bit_count() for g in self.pool) // 2
        return links == len(self.pool) - len(component_sizes(self.pool, adjacency))

    def _tree_bound(self) -> TreeWeightBound:
        """The subtree bound of :mod:`.treebound` (simple forests only)."""
        return TreeWeightBound(*self._tree_bound_inputs())

    def _tree_bound_inputs(self) -> tuple[list[int | None], tuple[int, ...], list[list[float]]]:
        """The parent positions, the pool and the class weights of every pair."""
        parent = [b[0] if b else None for b in self.back]
        n = self.host.gpu_count
        of_pair, weight = self.classes.of_pair, self.classes.weight
        weights = [[weight[of_pair[a][b]] if a != b else 0.0 for b in range(n)] for a in range(n)]
        return parent, self.pool, weights

    def _vector_key(self, vector: tuple[int, ...]) -> Key:
        counts = [0, 0, 0]
        agg = 0.0
        low = math.inf
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
            masks = tuple(or_masks(adjacency[c][g] for c in members) for g in range(gpu_count))
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
          colour (:func:`fewest_monochromatic`): an odd ring never fits on such links, and a
          16-rank binary tree (6 ranks on one side of its own bipartition, 10 on the other)
          keeps at least one edge off a torus's NVLinks, where each side has 8 GPUs.
        - *Paths.* When no GPU has more than two links in T (T's links are paths and cycles,
          like the NV2 rows of a torus), the edges of a tree pattern on T form disjoint paths
          of the pattern, none longer than its diameter ``D``, and each inside one component of
          T's links: a component of ``s`` GPUs holds at most ``max over p of min(s - p, p D)``
          of them. A 14-rank binary tree (``D = 6``) fits at most 6 edges on an 8-GPU NV2
          cycle, where counting alone allows 7.
        - *Pieces.* On a forest pattern, the edges on T join ranks of one component of T's
          links, so they lie inside connected pieces of at most as many ranks as the largest
          component has GPUs: at most ``k`` less the fewest such pieces
          (:func:`~.pattern_graphs.fewest_pieces`; a 16-rank binary tree keeps
          11 edges on a PCIe host's 4-GPU switches).
        """
        ring_like = self.ring_like
        edges = len(self.pattern.edges)
        monochromatic = fewest_monochromatic(self.pattern)
        diameter = forest_diameter(self.pattern)
        parents = forest_parents(self.pattern) if self.simple_pattern else None
        groups = []
        for members, masks, widest in self.group_masks:
            cap = edges
            if ring_like is not None:
                cap -= edges_cut(self._fewest_components(members), ring_like)
            cap = min(cap, degree_limited_edges(self.pattern, widest))
            if widest <= 2 and diameter is not None:
                cap = min(cap, self._paths_within_components(masks, diameter))
            if parents is not None:
                largest = max(component_sizes(self.pool, masks), default=0)
                if largest < self.k:
                    cap = min(cap, self.k - fewest_pieces(parents, largest))
            if monochromatic is not None:
                cap = min(cap, edges - self._fewest_off_bipartite(masks, monochromatic))
            if cap < edges:
                groups.append((members, max(0, cap)))
        return tuple(groups)

    def _paths_within_components(self, masks: tuple[int, ...], diameter: int) -> int:
        """The *Paths* cap of :meth:`_class_group_capacities`, summed over the components of the
        links ``masks`` on the pool (a set of k of them can only use fewer)."""
        total = 0
        for size in component_sizes(self.pool, masks):
            total += max((min(size - p, p * diameter) for p in range(1, size + 1)), default=0)
        return total

    def _fewest_off_bipartite(self, masks: tuple[int, ...], monochromatic: list[int]) -> int:
        """The fewest pattern edges that cannot lie on the links ``masks`` (per GPU, its pool
        neighbours on them): 0 unless those links form a bipartite graph (the parity bound of
        :meth:`_class_group_capacities`), else the least ``m(a)`` over the numbers ``a`` of
        side-A GPUs a candidate set can have."""
        side_a = bipartition(self.pool, masks)
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
