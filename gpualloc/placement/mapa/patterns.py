"""Job communication graphs (MAPA paper section 3.1, Fig. 8) and their symmetries.

A pattern is a graph over ranks ``0..k-1``; a placement maps rank ``i`` to GPU ``order[i]``. The
built-in patterns are the ones NCCL builds:

- ``ring``: ``i -> i+1`` and ``k-1 -> 0``. A 2-GPU ring lists its one pair twice, as MAPA's
  scorer does (``getEdges`` in the reference code), so a 2-GPU job's link counts for both
  directions.
- ``all``: every pair (all-to-all, and what a "fully connected" job needs).
- ``tree``: the binary tree NCCL's tree all-reduce uses, rank ``i``'s parent is ``(i-1)//2``.
- ``star``: rank 0 talks to every other rank (a parameter server, a broadcast root).

A custom pattern is a JSON edge list over ``0..k-1`` (``[[0, 1], [1, 2]]`` or
``{"edges": [[0, 1], ...]}``).

Symmetry breaking. Two orders that differ by an automorphism of the pattern score the same, so
the search only visits one per class: each pattern carries ``less_than`` constraints
``(i, j)`` meaning "``order[i] < order[j]``" that keep exactly the lexicographically smallest
order of each class for the built-in patterns (ring: dihedral group, ``2k`` orders per class;
all: ``k!``; star: ``(k-1)!``; tree: swaps of isomorphic sibling subtrees). Custom patterns get
no constraints, which is always correct but slower.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from msgspec import Struct

from gpualloc.errors import RequestError
from gpualloc.job_options import MAX_GPUS
from gpualloc.model.printable import count_of
from gpualloc.model.request import CommunicationPattern, max_edges
from gpualloc.user_files import names_anything, shown_value

BUILTIN_PATTERNS = ("ring", "all", "tree", "star")


class PatternError(RequestError):
    """A ``--pattern`` value or pattern file cannot be used."""


class SearchShape(Struct, frozen=True):
    """How the order search walks a pattern: vertex visiting order and symmetry constraints."""

    visit: tuple[int, ...]
    """Pattern vertices in the order the search assigns them (each after the first has an
    already-assigned neighbour when the pattern is connected)."""
    less_than: tuple[tuple[int, int], ...]
    """Pairs ``(i, j)``: only orders with ``order[i] < order[j]`` are visited."""
    order_free: bool = False
    """True when every order of a set scores the same (all-to-all, or fewer than 2 edges)."""


def ring(k: int) -> CommunicationPattern:
    if k == 1:
        edges: tuple[tuple[int, int], ...] = ()
    elif k == 2:
        edges = ((0, 1), (0, 1))
    else:
        edges = tuple((i, (i + 1) % k) for i in range(k))
    return CommunicationPattern("ring", k, edges)


def all_to_all(k: int) -> CommunicationPattern:
    return CommunicationPattern("all", k, tuple((i, j) for i in range(k) for j in range(i + 1, k)))


def tree(k: int) -> CommunicationPattern:
    return CommunicationPattern("tree", k, tuple(((i - 1) // 2, i) for i in range(1, k)))


def star(k: int) -> CommunicationPattern:
    return CommunicationPattern("star", k, tuple((0, i) for i in range(1, k)))


_BUILDERS = {"ring": ring, "all": all_to_all, "tree": tree, "star": star}


def build_pattern(spec: str, k: int) -> CommunicationPattern:
    """A built-in pattern by name, or a custom one from a JSON file path.

    ``k`` is checked first: a pattern's size grows with it (``all`` quadratically), so a count
    above :data:`~gpualloc.job_options.MAX_GPUS` is refused before anything is built, whoever
    passed it (``tests/test_hostile_numbers.py``)."""
    if not 1 <= k <= MAX_GPUS:
        asks = f"more than {MAX_GPUS}" if k > MAX_GPUS else str(k)
        raise PatternError(
            f"the job asks for {asks} GPUs; a pattern has 1 to {MAX_GPUS} ranks",
            hint=f"ask for 1 to {MAX_GPUS} GPUs (-n), and no more than the host has",
        )
    if spec in _BUILDERS:
        return _BUILDERS[spec](k)
    path = Path(spec)
    # A value that looks like a path, or names something, is a file to read: the reading says
    # why it cannot be (exit 8, as every file option: tests/test_user_files.py), not "unknown
    # pattern".
    if not (os.sep in spec or spec.endswith(".json") or names_anything(path)):
        import difflib

        close = difflib.get_close_matches(spec, BUILTIN_PATTERNS, n=1)
        raise PatternError(
            f"unknown pattern {shown_value(spec)}: not one of {', '.join(BUILTIN_PATTERNS)} "
            "and not a file",
            hint=f"did you mean {close[0]}?"
            if close
            else "a pattern file holds a JSON edge list over the ranks, e.g. [[0, 1], [1, 2]]",
        )
    from gpualloc.user_files import json_document, read_user_text

    text = read_user_text(path, "pattern file", error=PatternError)
    try:
        data = json_document(text)  # a RecursionError on [[[[... is a parse error too
    except json.JSONDecodeError as exc:
        raise PatternError(
            f"{spec}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from exc
    return pattern_from_edges(data, k, name=f"file:{path.name}", origin=spec)


def pattern_from_edges(data: object, k: int, *, name: str, origin: str) -> CommunicationPattern:
    """Validate a JSON edge list (or ``{"edges": [...]}``) over ``0..k-1``."""
    edges_data = data.get("edges") if isinstance(data, dict) else data
    if not isinstance(edges_data, list):
        raise PatternError(
            f'{origin}: a pattern file holds a list of [u, v] pairs or {{"edges": [...]}}'
        )
    edges: list[tuple[int, int]] = []
    seen: set[tuple[int, int]] = set()
    for position, item in enumerate(edges_data):
        if not (
            isinstance(item, list)
            and len(item) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) for x in item)
        ):
            raise PatternError(f"{origin}: edge #{position} is {item!r}, not a pair of integers")
        u, v = item
        if u == v:
            raise PatternError(f"{origin}: edge #{position} joins rank {u} to itself")
        if not (0 <= u < k and 0 <= v < k):
            raise PatternError(
                f"{origin}: edge #{position} ({u}, {v}) leaves ranks 0..{k - 1}",
                hint=f"the job asks for {count_of(k, 'GPU')} (-n); a pattern's vertices are "
                f"0..{k - 1}",
            )
        pair = (min(u, v), max(u, v))
        if pair in seen and k > 2:  # the search assumes one edge a pair beyond the 2-GPU ring
            raise PatternError(
                f"{origin}: edge #{position} ({u}, {v}) names ranks {pair[0]} and {pair[1]} again",
                hint="list each pair of ranks that talk once: its link carries both directions",
            )
        seen.add(pair)
        edges.append(pair)
        if len(edges) > max_edges(k):
            raise PatternError(
                f"{origin}: more than {count_of(max_edges(k), 'edge')} for {count_of(k, 'rank')}",
                hint="list each pair of ranks that talk once",
            )
    try:
        return CommunicationPattern(name, k, tuple(edges))
    except ValueError as bad:
        raise PatternError(
            f"{origin}: {bad}", hint="list each pair of ranks that talk once"
        ) from None


def search_shape(pattern: CommunicationPattern) -> SearchShape:
    """The visiting order and symmetry-breaking constraints for ``pattern``."""
    k = pattern.size
    distinct_pairs = set(pattern.edges)
    if pattern.name == "all" or (len(distinct_pairs) <= 1 and _all_vertices_equivalent(pattern)):
        return SearchShape(tuple(range(k)), _chain(range(k)), order_free=True)
    if pattern.name == "ring":
        # Dihedral symmetry: rank 0 holds the smallest GPU, and rank 1 < rank k-1.
        constraints = [(0, j) for j in range(1, k)]
        if k >= 3:
            constraints.append((1, k - 1))
        return SearchShape(tuple(range(k)), tuple(constraints))
    if pattern.name == "star":
        return SearchShape(tuple(range(k)), _chain(range(1, k)))
    if pattern.name == "tree":
        return SearchShape(tuple(range(k)), _tree_sibling_constraints(k))
    return SearchShape(_connected_visit(pattern), ())


def _all_vertices_equivalent(pattern: CommunicationPattern) -> bool:
    """True for patterns whose every order scores the same: no edge, or one edge and 2 ranks."""
    return not pattern.edges or pattern.size == 2


def _chain(vertices: range) -> tuple[tuple[int, int], ...]:
    items = list(vertices)
    return tuple((items[i], items[i + 1]) for i in range(len(items) - 1))


def _tree_sibling_constraints(k: int) -> tuple[tuple[int, int], ...]:
    """Order the two children of a node when their subtrees have the same shape.

    In the heap-shaped tree, the subtrees of siblings ``2p+1`` and ``2p+2`` are isomorphic exactly
    when they have the same shape; swapping them (and their descendants) is an automorphism. We
    require the left child's GPU below the right child's.
    """

    def shape(v: int) -> tuple:
        children = [c for c in (2 * v + 1, 2 * v + 2) if c < k]
        return tuple(shape(c) for c in children)

    constraints = []
    for parent in range(k):
        left, right = 2 * parent + 1, 2 * parent + 2
        if right < k and shape(left) == shape(right):
            constraints.append((left, right))
    return tuple(constraints)


def _connected_visit(pattern: CommunicationPattern) -> tuple[int, ...]:
    """Breadth-first from the highest-degree vertex, so that edges close early (bounds bite)."""
    k = pattern.size
    neighbours: dict[int, set[int]] = {v: set() for v in range(k)}
    for u, v in pattern.edges:
        neighbours[u].add(v)
        neighbours[v].add(u)
    seen: list[int] = []
    remaining = set(range(k))
    while remaining:
        start = max(sorted(remaining), key=lambda v: len(neighbours[v]))
        queue = [start]
        remaining.discard(start)
        while queue:
            v = queue.pop(0)
            seen.append(v)
            for w in sorted(neighbours[v], key=lambda w: -len(neighbours[w])):
                if w in remaining:
                    remaining.discard(w)
                    queue.append(w)
    return tuple(seen)
