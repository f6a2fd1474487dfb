"""The optimum of each policy's own objective by brute force, the reference the placement
tests hold the engine to: every candidate set and, for order-dependent objectives, every
order of it, then the documented tie-break (the highest key, then the tie rule of
:mod:`gpualloc.placement.ties`, then the lowest order)."""

from __future__ import annotations

import random
from itertools import combinations, permutations

from gpualloc.model.request import HostState, JobRequest
from gpualloc.placement.decide import decision_context
from gpualloc.placement.mapa.objectives import AggregatedObjective, evaluate_order
from gpualloc.placement.mapa.patterns import build_pattern
from gpualloc.placement.policies.registry import get_policy
from gpualloc.placement.ties import tie_key
from gpualloc.topologies import load_bundled

PATTERNS = ["ring", "tree", "star", "all"]


def _sets(ctx):
    required = ctx.request.required
    for gpus in combinations(ctx.pool, ctx.k):
        if required <= set(gpus):
            yield gpus


_BRUTE: dict = {}
"""Brute-force answers by what they depend on: the same host, pool, pattern and objective
recur across sensitivities and policies (an empty host's contexts are alike), and each costs
k! orders per set."""


def _memo(key, compute):
    if key not in _BRUTE:
        _BRUTE[key] = compute()
    return _BRUTE[key]


def _brute_ordered(ctx, objective):
    key = (
        "ordered", ctx.topology.name, ctx.pool, tuple(sorted(ctx.request.required)),
        ctx.request.pattern.edges, ctx.k, objective.describe(), ctx.state.free,
    )  # fmt: skip
    return _memo(key, lambda: _brute_ordered_now(ctx, objective))


def _brute_ordered_now(ctx, objective):
    best = None
    for gpus in _sets(ctx):
        rank = tie_key(ctx, gpus).rank()
        for order in permutations(gpus):
            key = evaluate_order(ctx.host, ctx.request.pattern, objective, order)
            candidate = (tuple(-v for v in key), rank, order)
            if best is None or candidate < best:
                best = candidate
    return best[2]


def _brute_set(ctx, key_of):
    """Highest set key, then the tie rule; then the best aggregated order, lowest order."""
    best = None
    for gpus in _sets(ctx):
        candidate = (tuple(-v for v in key_of(gpus)), tie_key(ctx, gpus).rank())
        if best is None or candidate < best:
            best = candidate
    return best[1][-1]


def _best_aggregated_order(ctx, gpus):
    key = ("order", ctx.topology.name, tuple(gpus), ctx.request.pattern.edges)
    return _memo(key, lambda: _best_aggregated_order_now(ctx, gpus))


def _best_aggregated_order_now(ctx, gpus):
    objective = AggregatedObjective()
    return min(
        permutations(gpus),
        key=lambda order: (
            tuple(-v for v in evaluate_order(ctx.host, ctx.request.pattern, objective, order)),
            order,
        ),
    )


def contexts(host_name: str, seed: int, max_k: int = 8):
    """Decisions on the bundled ``host_name``: each job size up to ``max_k``, each pattern and
    sensitivity, on the empty host and on a random busy one (``seed``), now and then with a
    GPU required."""
    topology = load_bundled(host_name)
    n = topology.gpu_count
    rng = random.Random(seed)
    for k in range(1, min(n, max_k) + 1):
        for pattern in PATTERNS:
            for sensitive in (True, False):
                for trial in range(2):
                    busy = (
                        frozenset()
                        if trial == 0
                        else frozenset(rng.sample(range(n), rng.randint(0, n - k)))
                    )
                    required = frozenset()
                    free = sorted(set(range(n)) - busy)
                    if trial == 1 and rng.random() < 0.5 and free:
                        required = frozenset([rng.choice(free)])
                    request = JobRequest(k, build_pattern(pattern, k), sensitive, required)
                    yield decision_context(topology, request, HostState.with_busy(n, busy))


def optimum(ctx, policy_name: str):
    """The GPUs, in rank order, that ``policy_name`` must return for ``ctx``."""
    policy = get_policy(policy_name)
    if policy_name == "mapa-greedy":
        return _brute_ordered(ctx, AggregatedObjective())
    if policy_name == "mapa":
        if ctx.request.sensitive and ctx.k > 1:
            return _brute_ordered(ctx, ctx.sensitive_objective())
        chosen = _brute_set(
            ctx, lambda gpus: policy.set_key(ctx, _best_aggregated_order(ctx, gpus))
        )
        return _best_aggregated_order(ctx, chosen) if ctx.k > 1 else chosen
    chosen = _brute_set(ctx, lambda gpus: policy.set_key(ctx, gpus))
    return _best_aggregated_order(ctx, chosen)
