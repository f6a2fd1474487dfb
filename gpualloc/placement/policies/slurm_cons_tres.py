"""``slurm``: what Slurm 22.05's ``cons_tres`` picks for a single-node GPU request.

Slurm reads NVLink counts from ``gres.conf`` ``Links=`` and, for one node, takes the first free
GPU by index as an anchor, then adds the GPUs with the most NVLinks to the anchor, level by level
(most links first), in index order within a level (``gres_select_filter`` /
``_pick_best_gres_by_links`` style). Verified on a real Slurm: with NVLink pairs 0-1 and 2-3 and
GPU 0 busy, ``--gres=gpu:2`` gave 1,2, not 2,3. Required GPUs (not a Slurm notion) become the
anchor and are kept. The order is ascending, as Slurm sets ``CUDA_VISIBLE_DEVICES``. O(n log n).
"""

from __future__ import annotations

from gpualloc.model.request import Placement
from gpualloc.placement.context import DecisionContext
from gpualloc.placement.policies.policy import Alternative, Policy


class SlurmPolicy(Policy):
    name = "slurm"
    summary = "Slurm 22.05 cons_tres: first free GPU, then most NVLinks to it"
    reference = "Slurm 22.05 select/cons_tres with gres.conf Links="
    reads_running_jobs = False  # the free GPUs alone decide
    breaks_ties = False  # as the tool it reproduces breaks them

    def search(self, ctx: DecisionContext) -> Placement:
        required = sorted(ctx.request.required)
        anchor = required[0] if required else ctx.pool[0]
        links = ctx.host.nvlinks[anchor]
        chosen = [anchor, *required[1:]]
        rest = [g for g in ctx.pool if g not in chosen]
        rest.sort(key=lambda g: (-links[g], g))
        chosen += rest[: ctx.k - len(chosen)]
        return ctx.placement(self.name, sorted(chosen), self.summary)

    def order_of(self, ctx: DecisionContext, gpus: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(sorted(gpus))

    def reason(
        self, ctx: DecisionContext, placement: Placement, runner_up: Alternative | None
    ) -> str:
        return f"anchored on GPU {min(placement.gpus)}, the first usable, then most NVLinks to it"
