"""Graph facts about communication patterns and link graphs that the exact search's bounds use.

Patterns (:class:`~gpualloc.model.request.CommunicationPattern`): the largest subgraph under a
degree limit, forest structure and diameter, 2-edge-connectivity, the fewest edges inside one
side of a 2-colouring. Link graphs (one bitmask of neighbours per GPU): components and
bipartitions. Each is a small exact computation on at most 16 vertices, run once per search.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gpualloc.model.request import CommunicationPattern


def or_masks(masks: Iterable[int]) -> int:
    result = 0
    for mask in masks:
        result |= mask
    return result


def degree_limited_edges(pattern: CommunicationPattern, limit: int) -> int:
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
    parent = forest_parents(pattern) if simple else None
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


def forest_parents(pattern: CommunicationPattern) -> dict[int, int | None] | None:
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


def fewest_pieces(parent: dict[int, int | None], largest: int) -> int:
    """The fewest connected pieces of at most ``largest`` ranks that a forest pattern (its
    ``parent`` map, BFS order) can be cut into: Kundu and Misra's bottom-up rule (SIAM J.
    Comput. 6(1), 1977), optimal for a size bound: each rank gathers what its children's open
    pieces left, then closes the largest of them until its own fits.

    A group of link classes whose components hold at most ``largest`` GPUs carries only the
    pattern edges inside pieces of at most that many ranks: ``k - fewest_pieces`` of a forest
    (a 16-rank binary tree keeps at most 11 edges on a PCIe host's 4-GPU switches, where
    counting components allows 12 and leaves the search to refute the twelfth)."""
    order = list(parent)  # BFS order: parents before children
    children: dict[int, list[int]] = {v: [] for v in order}
    for v in order:
        up = parent[v]
        if up is not None:
            children[up].append(v)
    open_size: dict[int, int] = {}
    pieces = 0
    for v in reversed(order):
        sizes = sorted((open_size[c] for c in children[v]), reverse=True)
        total = 1 + sum(sizes)
        for size in sizes:
            if total <= largest:
                break
            total -= size
            pieces += 1
        open_size[v] = total
        if parent[v] is None:
            pieces += 1
    return pieces


def component_sizes(pool: Sequence[int], masks: Sequence[int]) -> list[int]:
    """The sizes of the connected components of the graph on ``pool`` whose neighbours of GPU
    g are ``masks[g]`` (restricted to the pool)."""
    return [c.bit_count() for c in components_of(masks, or_masks(1 << g for g in pool))]


def components_of(masks: Sequence[int], within: int) -> tuple[int, ...]:
    """The components of the links ``masks`` on the GPUs of ``within`` (a mask), as masks,
    lowest GPU first."""
    found = []
    left = within
    while left:
        low = left & -left
        frontier, seen = low, low
        while frontier:
            bit = frontier & -frontier
            frontier ^= bit
            reach = masks[bit.bit_length() - 1] & within & ~seen
            seen |= reach
            frontier |= reach
        left &= ~seen
        found.append(seen)
    return tuple(found)


def edges_cut(pieces: int, ring_like: bool | None) -> int:
    """The fewest edges a connected pattern loses when its ranks lie in ``pieces`` parts: one
    fewer than the parts, or as many on a 2-edge-connected one (``ring_like``, a ring)."""
    if pieces <= 1:
        return 0
    return pieces if ring_like else pieces - 1


def forest_diameter(pattern: CommunicationPattern) -> int | None:
    """The most edges on a path of a forest pattern (None for other patterns): from any rank
    the farthest one is an end of a longest path of its tree, and from there the farthest is
    the other end."""
    parents = forest_parents(pattern)
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


def bipartition(pool: Sequence[int], masks: Sequence[int]) -> int | None:
    """A bitmask of one side of the graph on ``pool`` whose neighbours of GPU g are
    ``masks[g]``, or None if the graph has an odd cycle. Each component is coloured from its
    lowest GPU; any proper colouring serves the parity bound."""
    in_pool = or_masks(1 << g for g in pool)
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


def fewest_monochromatic(pattern: CommunicationPattern) -> list[int] | None:
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
    parents = forest_parents(pattern)
    if parents is None:
        cycle = len(edges) == k and all(d == 2 for d in degree) and two_edge_connected(pattern)
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


def two_edge_connected(pattern: CommunicationPattern) -> bool | None:
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


def is_star(pattern: CommunicationPattern) -> bool:
    """Rank 0 talks to every other rank once, and nobody else talks."""
    return sorted(pattern.edges) == [(0, i) for i in range(1, pattern.size)]


def is_forest(pattern: CommunicationPattern) -> bool:
    """Whether the pattern is a forest (a tree, a star): where searching a family of sets
    together (:func:`best_placement_among`) beats searching them one by one."""
    return forest_parents(pattern) is not None
