"""``drb``: topology-aware placement by utility (Amaral et al., SC'17, seed 000, section 4).

The physical graph (section 4.1.2, Fig. 7) has levels host, socket (NUMA node), PCIe switch tree,
GPU, with NVLink edges between GPUs; its shortest paths give the communication cost of Eq. 3
(:mod:`gpualloc.placement.sets.utility`). Algorithm 2 bi-partitions that graph recursively (host
into sockets, a socket into switch trees, a switch tree into GPUs) and Algorithm 3 sends the job's
tasks to the side of higher utility U (Eq. 2) under the capacity constraint.

Algorithm 3 decides one task at a time, so it can split a job across sockets before it learns
that the other side had room for all of it. gpualloc evaluates the choice Algorithm 3 makes
exactly: every split of the job down the hierarchy, i.e. every candidate set, is compared by the
utility of the finished mapping (communication cost, interference of the jobs already running on
the same sockets and switches, fragmentation), so the answer is the set of highest U; ties go to
the lowest indices. The weights alpha default to 1/3 each (section 5.1) and are settable. The
utility is Eq. 2 on the paper's scale, so that a minimum utility (TOPO-AWARE-P, section 4.4)
means what the paper's Table 1 meant; among sets of equal utility the higher normalised utility
wins (gpualloc's placement-sensitive reading of fragmentation; see
:mod:`gpualloc.placement.sets.utility`). The chosen set is ordered for the job's pattern.

Complexity: O(C(n, k) (k^2 + d)) for d hierarchy domains at worst; the branch and bound of
:mod:`gpualloc.placement.sets.search` scores a few hundred of the sets on the bundled hosts.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpualloc.model.request import Placement
from gpualloc.placement.context import DecisionContext
from gpualloc.placement.policies.policy import Alternative, Policy, SetKey, gpu_list
from gpualloc.placement.sets.search import SetSearch


class DrbPolicy(Policy):
    name = "drb"
    summary = "highest DRB utility: communication cost, interference, fragmentation"
    reference = "DRB (SC'17) section 4, Algorithms 2-3, Eq. 2-5"
    scores_partial_sets = True
    keys_sets_alone = True

    def search(self, ctx: DecisionContext) -> Placement:
        chosen = self.choose_set(ctx)
        return ctx.placement(self.name, self.order_of(ctx, chosen), self.objective(ctx))

    def choose_set(self, ctx: DecisionContext) -> tuple[int, ...]:
        """The lowest candidate set of the highest (U, U_n)
        (:mod:`gpualloc.placement.sets.search`)."""
        model, k = ctx.utility_model, ctx.k
        return SetSearch(
            model, ctx.pool, ctx.request.required, k,
            exact_key=model.set_key,
            bound_key=lambda cost, fragmentation, interference, free: model.bound_key(
                k, cost, fragmentation, interference, free
            ),
        ).run()  # fmt: skip

    def objective(self, ctx: DecisionContext) -> str:
        w = ctx.utility_model.weights
        return (
            f"max DRB utility (Eq. 2; weights communication {w.communication:.2f}, "
            f"interference {w.interference:.2f}, fragmentation {w.fragmentation:.2f})"
        )

    def set_key(self, ctx: DecisionContext, order: Sequence[int]) -> SetKey:
        parts = ctx.utility_model.parts(sorted(order))
        return (round(parts.utility, 6), round(parts.normalised, 6))

    def reason(
        self, ctx: DecisionContext, placement: Placement, runner_up: Alternative | None
    ) -> str:
        parts = ctx.utility_model.parts(sorted(placement.gpus))
        text = (
            f"utility {parts.utility:.3f} (Eq. 2; {parts.system_free:.2f} of the sockets left "
            f"free), normalised {parts.normalised:.3f} (communication cost "
            f"{parts.communication_cost:.2f}, interference {parts.interference:.2f}, "
            f"fragmentation {parts.fragmentation:.2f}, each normalised, lower is better)"
        )
        if runner_up:
            text += f"; runner-up {gpu_list(runner_up.gpus)} scores {runner_up.scores.utility:.3f}"
        return text
