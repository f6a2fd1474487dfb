"""``plan --explain``: the runner-up placements under the policy's own objective, and a one-line
reason for the choice (:meth:`Policy.reason`).

Alternatives are every other candidate set when there are at most ``MAX_EXHAUSTIVE`` of them,
else every single-GPU swap of the chosen set (its neighbourhood: what a user would try by hand);
each is ordered as the policy orders sets and ranked by the policy's key, then, among equal keys,
by the tie rule of :mod:`.ties` (the lowest set, for a policy that keeps its tool's tie-break).
Running the other policies to find alternatives would cost more than the decision itself on
16-GPU hosts.
"""

from __future__ import annotations

from math import comb

from gpualloc.model.request import Placement
from gpualloc.placement.context import DecisionContext
from gpualloc.placement.policies.policy import Alternative, Policy
from gpualloc.placement.sets.candidates import candidate_sets
from gpualloc.placement.ties import decided_by, tie_key, ties

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
    ranked.sort(key=lambda alt: tuple(-v for v in alt.key))
    if policy.breaks_ties:
        standing = {alt.gpus: tie_key(ctx, alt.gpus).rank() for alt in ranked}
        ranked.sort(key=lambda alt: (tuple(-v for v in alt.key), standing[alt.gpus]))
    return ranked[:top]


def reason(
    ctx: DecisionContext, policy: Policy, placement: Placement, others: list[Alternative]
) -> str:
    """The policy's reason, and what decided where the runner-up ties on the objective."""
    runner_up = others[0] if others else None
    text = policy.reason(ctx, placement, runner_up)
    key = policy.set_key(ctx, placement.gpus)
    if runner_up is None or key is None or not ties(key, runner_up.key):
        return text
    if not policy.breaks_ties:
        return f"{text}; it ties on the objective: {policy.name} takes the lower GPU indices"
    criterion = decided_by(tie_key(ctx, placement.gpus), tie_key(ctx, runner_up.gpus))
    return f"{text}; it ties on the objective: chosen by {criterion}"
