"""What the rest of gpualloc asks of the exact search (:mod:`.search`): the best ordered
placement of a pattern on a pool, the best among a family of sets, the best order of a set
another objective chose (pack, spread, DRB, the Slurm prolog's ring order).

The tie-break is documented once: the highest key, then the lowest sorted set, then the lowest
order (MAPA's own enumeration order).
"""

from __future__ import annotations

from collections.abc import Sequence
from math import comb

from gpualloc.model.request import CommunicationPattern
from gpualloc.placement.host_graph import HostGraph
from gpualloc.placement.mapa.objectives import EdgeObjective, Key, evaluate_order
from gpualloc.placement.mapa.pattern_graphs import is_star, or_masks
from gpualloc.placement.mapa.search import MAX_VECTORS, PlacementSearch, SearchResult

__all__ = ["best_order_of_set", "best_ordered_placement", "best_placement_among"]


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
        search.allowed = tuple(or_masks(1 << g for g in gpus) for gpus in sets)
        return search.run()
    best: SearchResult | None = None
    best_set: tuple[int, ...] = ()
    star = is_star(pattern)
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


def best_order_of_set(
    host: HostGraph, pattern: CommunicationPattern, objective: EdgeObjective, gpus: Sequence[int]
) -> tuple[int, ...]:
    """The best order of a set chosen by another objective (pack, spread, DRB)."""
    result = PlacementSearch(host, pattern, objective, gpus, gpus).run()
    assert result is not None
    return result.order
