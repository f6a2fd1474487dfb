"""The subtree bound with Lagrangian penalties per GPU: never below a real placement whatever
the penalties, tight where the plain bound wraps around a torus, and a search that escalates to
it returns what the search without it returns."""

from __future__ import annotations

import random

import pytest

from gpualloc.model.request import HostState, JobRequest
from gpualloc.placement.decide import decision_context
from gpualloc.placement.host_graph import HostGraph
from gpualloc.placement.mapa import search_bounds
from gpualloc.placement.mapa.objectives import AggregatedObjective
from gpualloc.placement.mapa.patterns import build_pattern
from gpualloc.placement.mapa.search import PlacementSearch
from gpualloc.placement.mapa.treebound import TreeWeightBound, greedy_weight, lagrangian_bound
from gpualloc.placement.policies.registry import get_policy
from gpualloc.topologies import load_bundled

from .test_tree_bound import (
    _random_forest,
    _random_weights,
    added_weight,
    completions,
    random_instance,
)

TORUS_SET = (1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13, 14, 15)  # torus-2d-16 without 0 and 9


@pytest.mark.parametrize("seed", range(80))
def test_a_penalised_bound_is_never_below_a_real_completion(seed: int) -> None:
    """Any penalties, of either sign, with or without candidate sets: the credit (the largest
    penalties a completion can reach) keeps the bound above every real completion."""
    rng = random.Random(seed)
    k, n, pool, weights, parent = random_instance(rng, 6, 7)
    penalty = [rng.uniform(-4, 4) if rng.random() < 0.8 else 0.0 for _ in range(n + 2)]
    allowed = None
    if rng.random() < 0.5:
        allowed = sorted(
            {sum(1 << g for g in rng.sample(pool, k)) for _ in range(rng.randint(1, 5))}
        )
    bound = TreeWeightBound(parent, pool, weights, penalty, allowed)
    best = max(
        (
            added_weight(parent, weights, order, 0)
            for order in completions(parent, pool, (), allowed)
        ),
        default=float("-inf"),
    )
    assert bound.whole() >= best - 1e-9
    for _ in range(5):
        s = rng.randint(1, k - 1) if k > 1 else 0
        prefix = tuple(rng.sample(pool, s))
        used = sum(1 << g for g in prefix)
        found = list(completions(parent, pool, prefix, allowed))
        if not found:
            continue
        free = 0
        for order in found:
            free |= sum(1 << g for g in order)
        free &= ~used
        best = max(added_weight(parent, weights, order, s) for order in found)
        assert bound.remaining(s, prefix, used, free) >= best - 1e-9, (prefix, penalty)


@pytest.mark.parametrize("seed", range(20))
def test_the_relaxed_optimum_places_every_rank_and_the_greedy_one_is_real(seed: int) -> None:
    rng = random.Random(seed)
    k = rng.randint(2, 6)
    n = rng.randint(k, 7)
    pool = sorted(rng.sample(range(n), n))
    weights = _random_weights(rng, n)
    parent = _random_forest(rng, k)
    bound = TreeWeightBound(parent, pool, weights, [rng.uniform(-3, 3) for _ in range(n)])
    use = bound.relaxed_use()
    assert sum(use) == k and all(use[g] == 0 for g in range(n) if g not in pool)
    best = max(
        added_weight(parent, weights, order, 0) for order in completions(parent, pool, (), None)
    )
    assert greedy_weight(parent, pool, weights, k) <= best + 1e-9
    assert lagrangian_bound(parent, pool, weights, 0.0, 10).whole() >= best - 1e-9


def _torus_tree_inputs():
    host = HostGraph.from_topology(load_bundled("torus-2d-16"))
    weights = [list(row) for row in host.bandwidth]
    parent = [None] + [(i - 1) // 2 for i in range(1, 14)]
    return host, parent, weights


def test_penalties_stop_the_relaxation_wrapping_around_the_torus() -> None:
    """A 14-rank binary tree on 14 GPUs of torus-2d-16 carries at most 512.824 GB/s. The plain
    relaxation wraps the tree around the NV2 cycle and allows 562.608; 15 subgradient steps
    bring it under 530, below every count vector the search had to refute one by one."""
    host, parent, weights = _torus_tree_inputs()
    plain = TreeWeightBound(parent, TORUS_SET, weights)
    assert plain.whole() == pytest.approx(562.608)
    aim = greedy_weight(parent, TORUS_SET, weights, 14)
    assert aim <= 512.824
    tightened = lagrangian_bound(parent, TORUS_SET, weights, aim, 15)
    assert 512.824 <= tightened.whole() < 530.0
    result = PlacementSearch(
        host, build_pattern("tree", 14), AggregatedObjective(), TORUS_SET, TORUS_SET
    ).run()
    assert result is not None and result.key == (512.824,)


def test_a_hard_search_escalates_and_visits_far_fewer_nodes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    host, _, _ = _torus_tree_inputs()
    pattern = build_pattern("tree", 14)
    default = search_bounds.ESCALATE_AFTER_NODES

    def run(escalate_after: float):
        monkeypatch.setattr(search_bounds, "ESCALATE_AFTER_NODES", escalate_after)
        finder = PlacementSearch(host, pattern, AggregatedObjective(), TORUS_SET, TORUS_SET)
        return finder.run()

    plain = run(float("inf"))
    escalated = run(default)
    at_once = run(0)
    assert plain is not None and escalated is not None and at_once is not None
    assert plain.order == escalated.order == at_once.order
    assert plain.key == escalated.key == at_once.key == (512.824,)
    assert escalated.nodes * 3 < plain.nodes


@pytest.mark.slow
@pytest.mark.parametrize("host_name", ["dgx1-v100", "torus-2d-16", "cube-mesh-16"])
def test_escalating_at_once_changes_no_answer(
    monkeypatch: pytest.MonkeyPatch, host_name: str
) -> None:
    """Every tree search tightened from its first node: the same placements as never
    tightening, for every policy that orders a tree, on random busy sets."""
    topology = load_bundled(host_name)
    n = topology.gpu_count
    rng = random.Random(host_name)
    cases = []
    for _ in range(6):
        k = rng.randint(3, min(n, 10))
        busy = frozenset(rng.sample(range(n), rng.randint(0, n - k)))
        cases.append((k, busy, rng.choice([True, False])))

    def answers(escalate_after: float) -> list:
        monkeypatch.setattr(search_bounds, "ESCALATE_AFTER_NODES", escalate_after)
        got = []
        for k, busy, sensitive in cases:
            request = JobRequest(k, build_pattern("tree", k), sensitive)
            ctx = decision_context(topology, request, HostState.with_busy(n, busy))
            for policy in ("mapa", "mapa-greedy", "pack", "spread"):
                got.append(get_policy(policy).place(ctx).gpus)
        return got

    assert answers(0) == answers(float("inf"))
