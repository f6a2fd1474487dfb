"""``spread``: the spread strategy of the DRB paper (Amaral et al., SC'17, seed 000, section 3):
GPUs from as many sockets as possible, for CPU-to-GPU bandwidth and balance.

Objective, lexicographic: the most sockets (NUMA nodes) used, then the fewest GPUs on the
busiest of them, then the most free GPUs in the sockets used (the least loaded sockets), then the
lowest indices. The chosen set is ordered for the job's pattern. Exact; O(C(n, k) k).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from gpualloc.model.request import Placement
from gpualloc.placement.context import DecisionContext
from gpualloc.placement.policy import Alternative, Policy, SetKey, best_set, gpu_list


class SpreadPolicy(Policy):
    name = "spread"
    summary = "GPUs spread over as many sockets as possible (DRB paper's spread)"
    reference = "DRB (SC'17) section 3, spread"
    scores_partial_sets = True

    def place(self, ctx: DecisionContext) -> Placement:
        chosen = best_set(ctx, lambda gpus: self.set_key(ctx, gpus))
        return ctx.placement(self.name, self.order_of(ctx, chosen), self.summary)

    def set_key(self, ctx: DecisionContext, order: Sequence[int]) -> SetKey:
        socket = ctx.host.socket
        per_socket = Counter(socket[g] for g in order)
        free_per_socket = Counter(socket[g] for g in ctx.state.free)
        return (
            float(len(per_socket)),
            -float(max(per_socket.values())),
            float(sum(free_per_socket[socket[g]] for g in order)),
        )

    def reason(
        self, ctx: DecisionContext, placement: Placement, runner_up: Alternative | None
    ) -> str:
        sockets = sorted({ctx.host.socket[g] for g in placement.gpus})
        return f"spreads over NUMA nodes {gpu_list(sockets)}, the most the free GPUs allow"
