"""The placement engine's entry points: :func:`plan`, :func:`compare`, :func:`explain`.

Pure computation on a :class:`~gpualloc.model.Topology` (no ledger, no exec): the same calls
serve ``gpualloc plan``, the launcher, the waiting queue and the simulator.
"""

from __future__ import annotations

from msgspec import Struct

from gpualloc.model.request import HostState, JobRequest, Placement
from gpualloc.model.topology import Topology
from gpualloc.placement import deadline
from gpualloc.placement.context import DecisionContext
from gpualloc.placement.explain import alternatives, reason
from gpualloc.placement.mapa.scores import EffectiveModel
from gpualloc.placement.policies.policy import Alternative, Policy
from gpualloc.placement.policies.registry import DEFAULT_POLICY, all_policies, get_policy
from gpualloc.placement.sets.utility import UtilityWeights


def decision_context(
    topology: Topology,
    request: JobRequest,
    state: HostState | None = None,
    *,
    effective_model: EffectiveModel = EffectiveModel.AUTO,
    weights: UtilityWeights | None = None,
) -> DecisionContext:
    """Validate a request against a host; raises RequestError / NoFeasiblePlacement."""
    return DecisionContext(
        topology=topology,
        request=request,
        state=state or HostState.all_free(topology.gpu_count),
        effective_model=effective_model,
        weights=weights or UtilityWeights(),
    )


def plan(
    topology: Topology,
    request: JobRequest,
    state: HostState | None = None,
    *,
    policy: str = DEFAULT_POLICY,
    effective_model: EffectiveModel = EffectiveModel.AUTO,
    weights: UtilityWeights | None = None,
) -> Placement:
    """The placement ``policy`` chooses for ``request`` on ``topology`` in ``state``."""
    chosen = get_policy(policy)
    ctx = decision_context(
        topology, request, state, effective_model=effective_model, weights=weights
    )
    return chosen.place(ctx)


def compare(ctx: DecisionContext, *, budget_s: float | None = None) -> list[Placement]:
    """What every registered policy chooses for the same request."""
    return [place(policy, ctx, budget_s) for policy in all_policies()]


def place(policy: Policy, ctx: DecisionContext, budget_s: float | None = None) -> Placement:
    """``policy``'s placement; with ``budget_s``, its search stops after that many seconds and
    a greedy placement is returned instead, saying so in ``Placement.cut_short``
    (:mod:`.greedy`). ``None`` (the simulator, the benchmarks, the
    optimality tests): the exact answer, however long it takes."""
    if budget_s is None:
        return policy.place(ctx)
    try:
        with deadline.within(budget_s):
            return policy.place(ctx)
    except deadline.OverBudget:
        from gpualloc.placement.greedy import greedy_placement

        return greedy_placement(ctx, policy, budget_s)


class Explanation(Struct, frozen=True):
    placement: Placement
    reason: str
    alternatives: list[Alternative]


def explain(
    ctx: DecisionContext,
    policy: str = DEFAULT_POLICY,
    top: int = 5,
    *,
    budget_s: float | None = None,
) -> Explanation:
    """The policy's choice, its best alternatives under its own objective, and why; with
    ``budget_s``, each of the two searches stops after that long (see :func:`place`)."""
    chosen_policy = get_policy(policy)
    placement = place(chosen_policy, ctx, budget_s)
    try:
        with deadline.within(budget_s):
            others = alternatives(ctx, chosen_policy, placement, top)
    except deadline.OverBudget:
        others = []
    return Explanation(placement, reason(ctx, chosen_policy, placement, others), others)
