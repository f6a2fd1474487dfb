"""``pack``: the best-fit strategy of the DRB paper (Amaral et al., SC'17, seed 000, sections 3
and 5.2, "BF"): GPUs as close together as possible.

Objective, lexicographic: the least communication cost ``t`` (Eq. 3, the sum of shortest-path
distances in the physical graph of section 4.1.2), then the least fragmentation (Eq. 5: taking
GPUs from already broken sockets and switches first, which is what makes it *best fit*), then the
lowest indices. The chosen set is ordered for the job's pattern. Exact; O(C(n, k) k^2).
"""

from __future__ import annotations

from collections.abc import Sequence

from gpualloc.model.request import Placement
from gpualloc.placement.context import DecisionContext
from gpualloc.placement.policy import Policy, SetKey, best_set


class PackPolicy(Policy):
    name = "pack"
    summary = "closest GPUs, best fit into already-used sockets (DRB paper's BF)"
    reference = "DRB (SC'17) sections 3 and 5.2, pack / best fit"

    def place(self, ctx: DecisionContext) -> Placement:
        chosen = best_set(ctx, lambda gpus: self.set_key(ctx, gpus))
        return ctx.placement(self.name, ctx.order_for_set(chosen), self.summary)

    def set_key(self, ctx: DecisionContext, order: Sequence[int]) -> SetKey:
        model = ctx.utility_model
        gpus = sorted(order)
        return (
            -round(model.communication_cost(gpus), 6),
            -round(model.fragmentation(gpus), 6),
        )
