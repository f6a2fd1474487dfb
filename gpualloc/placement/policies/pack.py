"""``pack``: the best-fit strategy of the DRB paper (Amaral et al., SC'17, seed 000, sections 3
and 5.2, "BF"): GPUs as close together as possible.

Objective, lexicographic: the least communication cost ``t`` (Eq. 3, the sum of shortest-path
distances in the physical graph of section 4.1.2), then the least fragmentation (Eq. 5: taking
GPUs from already broken sockets and switches first, which is what makes it *best fit*), then the
lowest indices. The chosen set is ordered for the job's pattern. Exact, by the branch and bound
of :mod:`gpualloc.placement.sets.search` (O(C(n, k) k^2) at worst).
"""

from __future__ import annotations

from collections.abc import Sequence

from gpualloc.model.request import Placement
from gpualloc.placement.context import DecisionContext
from gpualloc.placement.policies.policy import Alternative, Policy, SetKey, gpu_list
from gpualloc.placement.sets.search import SetSearch


class PackPolicy(Policy):
    name = "pack"
    summary = "closest GPUs, best fit into already-used sockets (DRB paper's BF)"
    reference = "DRB (SC'17) sections 3 and 5.2, pack / best fit"
    scores_partial_sets = True
    keys_sets_alone = True
    reads_running_jobs = False  # cost and fragmentation read the free GPUs alone

    def search(self, ctx: DecisionContext) -> Placement:
        chosen = self.choose_set(ctx)
        return ctx.placement(self.name, self.order_of(ctx, chosen), self.summary)

    def choose_set(self, ctx: DecisionContext) -> tuple[int, ...]:
        """The lowest candidate set of the highest :meth:`set_key`
        (:mod:`gpualloc.placement.sets.search`)."""
        return SetSearch(
            ctx.utility_model, ctx.pool, ctx.request.required, ctx.k,
            exact_key=lambda gpus: self.set_key(ctx, gpus),
            bound_key=lambda cost, fragmentation, _i, _f: (
                -round(cost, 6), -round(fragmentation, 6)
            ),
        ).run()  # fmt: skip

    def set_key(self, ctx: DecisionContext, order: Sequence[int]) -> SetKey:
        model = ctx.utility_model
        gpus = sorted(order)
        return (
            -round(model.communication_cost(gpus), 6),
            -round(model.fragmentation(gpus), 6),
        )

    def reason(
        self, ctx: DecisionContext, placement: Placement, runner_up: Alternative | None
    ) -> str:
        cost = ctx.utility_model.communication_cost(sorted(placement.gpus))
        text = f"the closest usable GPUs: communication cost {cost:g} (DRB Eq. 3)"
        if runner_up:
            text += f"; runner-up {gpu_list(runner_up.gpus)} costs {-runner_up.key[0]:g}"
        return text
