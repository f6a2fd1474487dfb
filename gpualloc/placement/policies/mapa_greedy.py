"""``mapa-greedy``: the placement of highest aggregated bandwidth (MAPA, seed 003, section 4,
"Greedy": "selects a matching pattern with the highest Aggregated Bandwidth").

The ordered search of :mod:`gpualloc.placement.mapa.search` finds the exact optimum over every
set and order; ties go to the lowest indices.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpualloc.model.request import Placement
from gpualloc.placement.context import DecisionContext
from gpualloc.placement.mapa.exact import best_ordered_placement
from gpualloc.placement.mapa.objectives import AggregatedObjective, evaluate_order
from gpualloc.placement.policies.policy import Alternative, Policy, SetKey, gpu_list


class MapaGreedyPolicy(Policy):
    name = "mapa-greedy"
    summary = "highest aggregated bandwidth over the pattern's links (MAPA Greedy)"
    reference = "MAPA (SC'21) section 4, Greedy; Eq. 1"
    reads_running_jobs = False  # the free GPUs alone decide

    def search(self, ctx: DecisionContext) -> Placement:
        objective = AggregatedObjective()
        found = best_ordered_placement(
            ctx.host, ctx.request.pattern, objective, ctx.pool, sorted(ctx.request.required)
        )
        assert found is not None
        return ctx.placement(self.name, found.order, objective.describe())

    def set_key(self, ctx: DecisionContext, order: Sequence[int]) -> SetKey:
        return evaluate_order(ctx.host, ctx.request.pattern, AggregatedObjective(), order)

    def key_bound(self, ctx: DecisionContext, gpus: Sequence[int]) -> SetKey | None:
        """The aggregated bound of a fixed set (:func:`.mapa.aggregated_upper_bound`)."""
        from gpualloc.placement.policies.mapa import aggregated_upper_bound

        if len(gpus) != ctx.k:
            return None
        return (aggregated_upper_bound(ctx.host, ctx.request.pattern, gpus),)

    def reason(
        self, ctx: DecisionContext, placement: Placement, runner_up: Alternative | None
    ) -> str:
        aggregated = placement.scores.aggregated_gbps
        text = f"aggregated bandwidth {aggregated:g} GB/s over the pattern's links"
        if runner_up:
            text += (
                f"; runner-up {gpu_list(runner_up.gpus)} has "
                f"{runner_up.scores.aggregated_gbps:g} GB/s"
            )
        return text
