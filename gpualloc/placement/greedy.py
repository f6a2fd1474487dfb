"""The answer when a policy's exact search runs past its time budget
(``tests/test_placement_budget.py``).

:mod:`.deadline` stops a search that would take longer than ``placement.time_budget``; the
decision then falls back on one of two greedy constructions, in O(k n) evaluations:

- For policies that score a *set* of any size (``drb``, ``spread``, ``pack``, ``besteffort``):
  start from the required GPUs and add, one at a time, the free GPU whose addition scores best
  under the policy's own :meth:`~gpualloc.placement.policies.policy.Policy.set_key` (ties to the
  lowest index), the classic greedy of the utility-based placers (DRB, SC'17 section 4.4,
  decides one task at a time the same way).
- For pattern policies (``mapa``, ``mapa-greedy``): place the pattern's ranks one after another,
  each on the free GPU with the most bandwidth to the ranks it talks to that are already placed
  (MAPA, SC'21 section 4, builds its matches the same way, rank by rank).

The fallback has half the budget again (a decision takes at most 1.5 times
``placement.time_budget``, and its scoring); if it runs out too, the GPUs it has are ordered rank
by rank. The placement says it (``Placement.cut_short``).
"""

from __future__ import annotations

from collections.abc import Sequence

from msgspec.structs import replace

from gpualloc.model.request import Placement
from gpualloc.placement import deadline
from gpualloc.placement.context import DecisionContext
from gpualloc.placement.policies.policy import Policy


def budget_note(policy: Policy, budget_s: float) -> str:
    return (
        f"the {policy.name} search ran past its {budget_s:g} s budget (placement.time_budget): "
        "this is a greedy choice, which may be worse than the best"
    )


def greedy_placement(ctx: DecisionContext, policy: Policy, budget_s: float) -> Placement:
    """The policy's greedy answer, with a note saying the exact search was cut short. It has
    half the budget again; if that runs out too, the pattern is placed rank by rank."""
    gpus: tuple[int, ...] = tuple(ctx.pool)
    try:
        with deadline.within(budget_s / 2):
            if not policy.scores_partial_sets:
                raise deadline.OverBudget
            gpus = _greedy_set(ctx, policy)
            order = policy.order_of(ctx, gpus)
    except deadline.OverBudget:
        order = _greedy_order(ctx, gpus)
    placement = ctx.placement(policy.name, order, policy.objective(ctx))
    return replace(placement, cut_short=budget_note(policy, budget_s))


def _greedy_set(ctx: DecisionContext, policy: Policy) -> tuple[int, ...]:
    chosen = sorted(ctx.request.required)
    clock = deadline.current()
    while len(chosen) < ctx.k:
        best_key = None
        best = -1
        for g in ctx.pool:
            if g in chosen:
                continue
            clock.check()  # a set key costs up to a millisecond: read the clock every time
            key = policy.set_key(ctx, sorted([*chosen, g]))
            if best_key is None or (key is not None and key > best_key):
                best_key, best = key, g
        chosen.append(best)
    return tuple(sorted(chosen))


def _greedy_order(ctx: DecisionContext, pool: Sequence[int]) -> tuple[int, ...]:
    """Ranks 0..k-1 in turn, each on the GPU of ``pool`` with the most bandwidth to its placed
    pattern neighbours (then the lowest index); the required GPUs take the first ranks."""
    k, bandwidth = ctx.k, ctx.host.bandwidth
    neighbours: list[list[int]] = [[] for _ in range(k)]
    for a, b in ctx.request.pattern.edges:
        neighbours[max(a, b)].append(min(a, b))
    order = sorted(ctx.request.required)
    for rank in range(len(order), k):
        best, best_gbps = -1, -1.0
        for g in pool:
            if g in order:
                continue
            gbps = sum(bandwidth[g][order[p]] for p in neighbours[rank])
            if gbps > best_gbps:
                best, best_gbps = g, gbps
        order.append(best)
    return tuple(order)
