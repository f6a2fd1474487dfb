"""``baseline``: the lowest free GPU indices.

What ``CUDA_VISIBLE_DEVICES=0,1`` users and nvidia-docker get, and MAPA's "Baseline" policy (seed
003, section 4: "allocates GPU by ID by selecting the lowest IDs"). Required GPUs are taken first,
then the lowest others; the order is ascending. O(n).
"""

from __future__ import annotations

from collections.abc import Sequence

from gpualloc.model.request import Placement
from gpualloc.placement.context import DecisionContext
from gpualloc.placement.policies.policy import Alternative, Policy, SetKey


class BaselinePolicy(Policy):
    name = "baseline"
    summary = "lowest free GPU indices (what CUDA_VISIBLE_DEVICES=0,1 users get)"
    reference = "MAPA (SC'21) section 4, Baseline; nvidia-docker"
    reads_running_jobs = False  # the free GPUs alone decide
    breaks_ties = False  # as the tool it reproduces breaks them
    scores_partial_sets = True

    def search(self, ctx: DecisionContext) -> Placement:
        required = sorted(ctx.request.required)
        others = [g for g in ctx.pool if g not in ctx.request.required]
        chosen = sorted(required + others[: ctx.k - len(required)])
        return ctx.placement(self.name, chosen, self.summary)

    def set_key(self, ctx: DecisionContext, order: Sequence[int]) -> SetKey:
        return tuple(-g for g in sorted(order))

    def order_of(self, ctx: DecisionContext, gpus: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(sorted(gpus))

    def reason(
        self, ctx: DecisionContext, placement: Placement, runner_up: Alternative | None
    ) -> str:
        return "the lowest usable GPU indices"
