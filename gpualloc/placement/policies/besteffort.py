"""``besteffort``: NVIDIA go-gpuallocator's best-effort policy, as the Kubernetes device plugin
uses it (``gpuallocator/besteffort_policy.go``), reproduced answer for answer.

Scores (``calculateGPUPairScore``): a pair scores the sum of its link records, PCIe class
``SYS`` 10, ``NODE`` 20, ``PHB`` 30, ``PXB`` 40, ``PIX`` 50, same board 60, plus 100 per direct
NVLink. NVML reports an NVSwitch-attached GPU's links as going to the switch, not to a peer, so
go-gpuallocator counts no NVLink between NVSwitch GPUs; so does this port. A set scores the sum
over its pairs.

Procedure: the available GPUs, ascending, padded with empty slots up to a multiple of k, are
partitioned into groups of k in every way (the first remaining GPU with each (k-1)-combination of
the others in index order, recursively; a group holds none or all of the padding); the partition
of highest total wins, the first found on a tie; of its groups that hold every required GPU and
no padding, the best-scoring one is returned, the first on a tie. A partition is considered only
if it has such a group. k = 1 returns the lowest free index.

The original enumerates every partition: 22 million for k = 3 of 16 GPUs. This port finds the
same partition with :class:`~gpualloc.placement.besteffort.partition.PartitionSearch` (the same
order, branch and bound on strict improvement, a transposition table), without listing them.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

from gpualloc.model.paths import PciePath
from gpualloc.model.request import Placement
from gpualloc.placement.besteffort.partition import PartitionSearch
from gpualloc.placement.context import DecisionContext
from gpualloc.placement.policies.policy import Alternative, Policy, SetKey

PCIE_SCORE = {
    PciePath.SYS: 10,
    PciePath.NODE: 20,
    PciePath.PHB: 30,
    PciePath.PXB: 40,
    PciePath.PIX: 50,
    PciePath.BOARD: 60,
}
NVLINK_SCORE = 100


def pair_score(ctx: DecisionContext, a: int, b: int) -> int:
    host = ctx.host
    path = host.pcie[a][b]
    score = PCIE_SCORE[path] if path is not None else 0
    if not host.nvswitch[a][b]:
        score += NVLINK_SCORE * host.nvlinks[a][b]
    return score


class BestEffortPolicy(Policy):
    name = "besteffort"
    summary = "NVIDIA go-gpuallocator best-effort (Kubernetes device plugin)"
    reference = "NVIDIA/go-gpuallocator besteffort_policy.go"
    reads_running_jobs = False  # the free GPUs alone decide
    breaks_ties = False  # as the tool it reproduces breaks them
    scores_partial_sets = True

    def search(self, ctx: DecisionContext) -> Placement:
        return ctx.placement(self.name, self.choose(ctx), self.summary)

    def set_key(self, ctx: DecisionContext, order: Sequence[int]) -> SetKey:
        return (float(sum(pair_score(ctx, a, b) for a, b in combinations(order, 2))),)

    def order_of(self, ctx: DecisionContext, gpus: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(sorted(gpus))

    def reason(
        self, ctx: DecisionContext, placement: Placement, runner_up: Alternative | None
    ) -> str:
        score = self.set_key(ctx, placement.gpus)[0]
        return (
            f"the best group (pair score {score:g}) of the highest-scoring partition of the free "
            "GPUs, as go-gpuallocator picks it; other sets may score higher alone"
        )

    def choose(self, ctx: DecisionContext) -> tuple[int, ...]:
        k, pool = ctx.k, list(ctx.pool)
        required = ctx.request.required
        if k == 1:
            return (sorted(required)[0],) if required else (pool[0],)
        if len(pool) == k:
            return tuple(pool)
        weights = [[pair_score(ctx, a, b) if a != b else 0 for b in pool] for a in pool]
        search = PartitionSearch(weights, k, frozenset(pool.index(g) for g in required))
        groups = [
            mask for mask, padded in search.best_partition() if search.qualifies(mask, padded)
        ]
        chosen = groups[0]
        for group in groups[1:]:
            if search.score(group) > search.score(chosen):
                chosen = group
        return tuple(g for i, g in enumerate(pool) if chosen >> i & 1)
