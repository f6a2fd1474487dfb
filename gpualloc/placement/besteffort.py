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

The original enumerates every partition: 22 million for k = 3 of 16 GPUs. This port walks them in
the same order with branch and bound: a branch is cut when the groups so far plus an upper bound
of the rest (each GPU pairs at best with its k-1 best partners) cannot beat the incumbent
*strictly*. Since the first optimum in enumeration order is kept either way, the answer is the
original's.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

from gpualloc.model.paths import PciePath
from gpualloc.model.request import Placement
from gpualloc.placement.context import DecisionContext
from gpualloc.placement.policy import Alternative, Policy, SetKey

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

    def place(self, ctx: DecisionContext) -> Placement:
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
        padding = (-len(pool)) % k
        slots: list[int | None] = [*pool, *([None] * padding)]
        n = len(pool)
        score = [
            [pair_score(ctx, a, b) if a != b else 0 for b in range(ctx.host.gpu_count)]
            for a in range(ctx.host.gpu_count)
        ]
        best_partners = {
            g: sum(sorted((score[g][h] for h in pool if h != g), reverse=True)[: k - 1])
            for g in pool
        }

        def group_score(group: tuple[int, ...]) -> int:
            real = [slots[i] for i in group if i < n]
            return sum(score[a][b] for a, b in combinations(real, 2))  # type: ignore[index]

        def qualifies(group: tuple[int, ...]) -> bool:
            if any(i >= n for i in group):
                return False
            members = {slots[i] for i in group}
            return required <= members

        best: list = [None, None]  # total, partition (list of position tuples)
        partition: list[tuple[int, ...]] = []

        def walk(remaining: list[int], total: int, satisfied: bool, bound: float) -> None:
            if best[0] is not None and total + bound / 2 <= best[0]:
                return
            if not remaining:
                if satisfied and (best[0] is None or total > best[0]):
                    best[0], best[1] = total, list(partition)
                return
            if not satisfied and not all(any(slots[i] == r for i in remaining) for r in required):
                return
            first, others = remaining[0], remaining[1:]
            for rest in combinations(others, k - 1):
                group = (first, *rest)
                pads = sum(1 for i in group if i >= n)
                if pads not in (0, padding):
                    continue
                left = [i for i in others if i not in rest]
                removed = sum(best_partners[slots[i]] for i in group if i < n)  # type: ignore[index]
                partition.append(group)
                walk(
                    left, total + group_score(group), satisfied or qualifies(group), bound - removed
                )
                partition.pop()

        walk(list(range(len(slots))), 0, False, float(sum(best_partners.values())))
        groups = [g for g in best[1] if qualifies(g)]
        chosen = groups[0]
        for group in groups[1:]:
            if group_score(group) > group_score(chosen):
                chosen = group
        return tuple(sorted(slots[i] for i in chosen))  # type: ignore[type-var]
