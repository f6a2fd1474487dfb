"""The subtree bound of tree patterns: never below what a real placement carries, and tight
enough to matter on the host it was built for."""

from __future__ import annotations

import random
from itertools import permutations

import pytest

from gpualloc.model.request import HostState, JobRequest
from gpualloc.placement.decide import decision_context
from gpualloc.placement.mapa.objectives import AggregatedObjective
from gpualloc.placement.mapa.patterns import build_pattern
from gpualloc.placement.mapa.search import PlacementSearch
from gpualloc.placement.mapa.treebound import TreeWeightBound, best_children
from gpualloc.topologies import load_bundled


def _random_forest(rng: random.Random, k: int) -> list[int | None]:
    """Parent positions in visiting order: each rank's parent comes earlier (or none)."""
    return [None if s == 0 or rng.random() < 0.15 else rng.randrange(s) for s in range(k)]


def _random_weights(rng: random.Random, n: int) -> list[list[float]]:
    weights = [[0.0] * n for _ in range(n)]
    for a in range(n):
        for b in range(a + 1, n):
            weights[a][b] = weights[b][a] = float(rng.choice((0, 1, 1, 3, 5)))
    return weights


def completions(parent, pool, prefix, allowed=None):
    """Brute force: every injective completion of ``prefix`` (GPUs of the first positions) to
    a full order, whose set is one of ``allowed`` (bitmasks) when given."""
    k, s = len(parent), len(prefix)
    free = [g for g in pool if g not in prefix]
    for rest in permutations(free, k - s):
        order = (*prefix, *rest)
        if allowed is None or sum(1 << g for g in order) in allowed:
            yield order


def added_weight(parent, weights, order, s: int) -> float:
    """The weight of the edges from the positions ``s..k-1`` of ``order`` to their parents."""
    k = len(parent)
    return sum(weights[order[v]][order[parent[v]]] for v in range(s, k) if parent[v] is not None)


def _best_completion(parent, pool, weights, prefix) -> float:
    """The most weight the positions after ``prefix`` add to it, over every completion."""
    return max(
        (added_weight(parent, weights, o, len(prefix)) for o in completions(parent, pool, prefix)),
        default=float("-inf"),
    )


def random_instance(rng: random.Random, most_ranks: int, most_gpus: int):
    """A random forest of 2..most_ranks ranks, a pool of up to most_gpus GPUs (among two more
    that stay out) and random weights: (k, n, pool, weights, parent)."""
    k = rng.randint(2, most_ranks)
    n = rng.randint(k, most_gpus)
    pool = sorted(rng.sample(range(n + 2), n))
    weights = _random_weights(rng, n + 2)
    return k, n, pool, weights, _random_forest(rng, k)


@pytest.mark.parametrize("seed", range(60))
def test_the_bound_is_never_below_a_real_completion(seed):
    rng = random.Random(seed)
    k, _, pool, weights, parent = random_instance(rng, 7, 8)
    bound = TreeWeightBound(parent, pool, weights)
    assert bound.whole() >= _best_completion(parent, pool, weights, ()) - 1e-9
    for _ in range(5):
        s = rng.randint(1, k - 1) if k > 1 else 0
        prefix = tuple(rng.sample(pool, s))
        used = sum(1 << g for g in prefix)
        assert (
            bound.remaining(s, prefix, used)
            >= _best_completion(parent, pool, weights, prefix) - 1e-9
        )


def test_the_bound_is_exact_for_a_path_on_a_path():
    """A locally injective map of a path into a path host never turns back, so the relaxation
    cannot fold the pattern onto itself: 5 ranks in a row carry 4 links, and with the middle
    rank on an end GPU one side keeps its 2 links and the other only 1."""
    n = 5
    weights = [[1.0 if abs(a - b) == 1 else 0.0 for b in range(n)] for a in range(n)]
    bound = TreeWeightBound([None, 0, 1, 2, 3], range(n), weights)
    assert bound.whole() == 4.0
    middle_first = TreeWeightBound([None, 0, 0, 1, 2], range(n), weights)
    assert middle_first.remaining(1, (0,), 1) == 3.0


def test_distinct_children_and_the_parent_gpu_excluded():
    first = ((5.0, 1), (4.0, 2), (1.0, 3))
    second = ((5.0, 1), (2.0, 3))
    assert best_children([first, second], 0) == 9.0  # both want GPU 1: 4 + 5 beats 5 + 2
    assert best_children([first, second], 1 << 1) == 6.0  # GPU 1 taken: 4 + 2
    assert best_children([first], 1 << 1 | 1 << 2) == 1.0
    assert best_children([first, second], 0b1110) == float("-inf")


def test_cube_mesh_binary_tree_is_bounded_below_degree_counting():
    """The case the bound was built for: on cube-mesh-16 the NV2 links form a spanning tree, and
    a 16-rank binary tree carries at most 650.2 GB/s. Degree counting alone allows 750 (every
    edge on NV2); the locally injective relaxation proves 675."""
    topology = load_bundled("cube-mesh-16")
    request = JobRequest(16, build_pattern("tree", 16), False)
    ctx = decision_context(topology, request, HostState.with_busy(16, frozenset()))
    search = PlacementSearch(ctx.host, request.pattern, AggregatedObjective(), range(16))
    search._prepare_budget_search()
    assert search.tree_bound is not None
    assert search.tree_bound.whole() == pytest.approx(675.0)
    result = search.run()
    assert result is not None and result.key == (650.216,)
