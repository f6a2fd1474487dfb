"""``plan --explain``: the runner-up placements under the policy's own objective, and a one-line
reason for the choice (:meth:`Policy.reason`).

Alternatives are every other candidate set when there are at most ``MAX_EXHAUSTIVE`` of them,
else every single-GPU swap of the chosen set (its neighbourhood: what a user would try by hand);
each is ordered as the policy orders sets and ranked by the policy's key. Running the other
policies to find alternatives would cost more than the decision itself on 16-GPU hosts.
"""

from __future__ import annotations

from math import comb

from gpualloc.model.request import Placement
from gpualloc.placement.candidates import candidate_sets
from gpualloc.placement.context import DecisionContext
from gpualloc.placement.policy import Alternative, Policy

MAX_EXHAUSTIVE = 200


def _single_swaps(ctx: DecisionContext, chosen: tuple[int, ...]) -> list[tuple[int, ...]]:
    chosen_set = set(chosen)
    sets = {
        tuple(sorted((chosen_set - {out}) | {into}))
        for out in chosen
        if out not in ctx.request.required
        for into in ctx.pool
        if into not in chosen_set
    }
    return sorted(sets)


def alternatives(
    ctx: DecisionContext, policy: Policy, placement: Placement, top: int
) -> list[Alternative]:
    if policy.set_key(ctx, placement.gpus) is None:
        return []
    chosen = tuple(sorted(placement.gpus))
    required = ctx.request.required
    if comb(len(ctx.pool) - len(required), ctx.k - len(required)) <= MAX_EXHAUSTIVE:
        sets = list(candidate_sets(ctx.pool, required, ctx.k))
    else:
        sets = _single_swaps(ctx, chosen)
    ranked: list[Alternative] = []
    for gpus in sets:
        if gpus == chosen:
            continue
        order = policy.order_of(ctx, gpus)
        key = policy.set_key(ctx, order)
        assert key is not None
        ranked.append(Alternative(order, key, ctx.scores_of(order)))
    ranked.sort(key=lambda alt: alt.key, reverse=True)
    return ranked[:top]


def reason(
    ctx: DecisionContext, policy: Policy, placement: Placement, others: list[Alternative]
) -> str:
    return policy.reason(ctx, placement, others[0] if others else None)
