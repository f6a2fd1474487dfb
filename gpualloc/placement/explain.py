"""``plan --explain``: the runner-up placements under the policy's own objective, and a one-line
reason for the choice a user can act on.

Alternatives are every other candidate set when there are at most ``MAX_EXHAUSTIVE`` of them,
else the sets the other policies choose plus every single-GPU swap of the chosen set; each is
ordered as the policy would order it and ranked by the policy's key.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import comb

from gpualloc.model.request import Placement, Scores
from gpualloc.placement.context import DecisionContext
from gpualloc.placement.policy import Policy, SetKey, candidate_sets
from gpualloc.placement.scores import mapa_counts, pattern_pairs

MAX_EXHAUSTIVE = 200


@dataclass(frozen=True)
class Alternative:
    gpus: tuple[int, ...]
    key: SetKey
    scores: Scores


def _neighbourhood(ctx: DecisionContext, chosen: tuple[int, ...]) -> list[tuple[int, ...]]:
    from gpualloc.placement.registry import POLICIES

    sets = {tuple(sorted(p.place(ctx).gpus)) for p in POLICIES.values()}
    chosen_set = set(chosen)
    for out in chosen:
        if out in ctx.request.required:
            continue
        for into in ctx.pool:
            if into not in chosen_set:
                sets.add(tuple(sorted((chosen_set - {out}) | {into})))
    return sorted(sets)


def alternatives(
    ctx: DecisionContext, policy: Policy, placement: Placement, top: int
) -> list[Alternative]:
    chosen = tuple(sorted(placement.gpus))
    if policy.set_key(ctx, placement.gpus) is None:
        return []
    others = len(ctx.pool) - len(ctx.request.required)
    need = ctx.k - len(ctx.request.required)
    if comb(others, need) <= MAX_EXHAUSTIVE:
        sets = list(candidate_sets(ctx))
    else:
        sets = _neighbourhood(ctx, chosen)
    ranked: list[Alternative] = []
    for gpus in sets:
        if gpus == chosen:
            continue
        order = _order_as_policy_would(ctx, policy, gpus)
        key = policy.set_key(ctx, order)
        assert key is not None
        ranked.append(Alternative(order, key, ctx.scores_of(order)))
    ranked.sort(key=lambda alt: alt.key, reverse=True)
    return ranked[:top]


def _order_as_policy_would(
    ctx: DecisionContext, policy: Policy, gpus: tuple[int, ...]
) -> tuple[int, ...]:
    from gpualloc.placement.search import best_order_of_set

    if policy.name == "mapa" and ctx.request.sensitive and ctx.k > 1:
        return best_order_of_set(ctx.host, ctx.request.pattern, ctx.sensitive_objective(), gpus)
    if policy.name in ("baseline", "besteffort", "slurm"):
        return gpus
    return ctx.order_for_set(gpus)


def _gpus(gpus: tuple[int, ...] | list[int]) -> str:
    return ",".join(str(g) for g in gpus)


def _nvlink_pairs_left(ctx: DecisionContext, chosen: tuple[int, ...]) -> list[tuple[int, int]]:
    left = sorted(ctx.state.free - set(chosen))
    nv = ctx.host.nvlink_bandwidth
    pairs = [(a, b) for i, a in enumerate(left) for b in left[i + 1 :] if nv[a][b] > 0]
    pairs.sort(key=lambda p: (-nv[p[0]][p[1]], p))
    return pairs


def reason(
    ctx: DecisionContext, policy: Policy, placement: Placement, others: list[Alternative]
) -> str:
    chosen = placement.gpus
    s = placement.scores
    runner = others[0] if others else None
    versus = f"; runner-up {_gpus(runner.gpus)}" if runner else ""
    name = policy.name
    if name == "mapa" and (not ctx.request.sensitive or ctx.k == 1):
        kept = _nvlink_pairs_left(ctx, chosen)
        if runner:
            theirs = set(_nvlink_pairs_left(ctx, runner.gpus))
            kept = [p for p in kept if p not in theirs] or kept
        links = ctx.host.nvlinks
        shown = ", ".join(f"NV{links[a][b]} {a}-{b}" for a, b in kept[:3])
        text = f"keeps {s.preserved_gbps:g} GB/s of NVLink free for later sensitive jobs"
        if shown:
            text = (
                f"keeps the pairs {shown} free for later sensitive jobs ({s.preserved_gbps:g} GB/s)"
            )
        if runner:
            text += f"; runner-up {_gpus(runner.gpus)} keeps {runner.scores.preserved_gbps:g} GB/s"
        return text
    if name == "mapa":
        pairs = pattern_pairs(chosen, ctx.request.pattern)
        if s.effective_model == "mapa":
            x, y, z = mapa_counts(ctx.host, pairs)
            text = (
                f"predicted effective bandwidth {s.effective_gbps:g} GB/s (Table 2 on {x} "
                f"double-NVLink, {y} single-NVLink, {z} PCIe pattern edges)"
            )
        else:
            text = f"slowest pattern link {s.effective_gbps:g} GB/s"
        if runner:
            text += f"{versus} predicts {runner.scores.effective_gbps:g} GB/s"
        return text
    if name == "mapa-greedy":
        text = f"aggregated bandwidth {s.aggregated_gbps:g} GB/s over the pattern's links"
        if runner:
            text += f"{versus} has {runner.scores.aggregated_gbps:g} GB/s"
        return text
    if name == "drb":
        parts = ctx.utility_model.parts(sorted(chosen))
        text = (
            f"utility {parts.utility:.3f} (communication cost {parts.communication_cost:.2f}, "
            f"interference {parts.interference:.2f}, fragmentation {parts.fragmentation:.2f}, "
            "each normalised, lower is better)"
        )
        if runner:
            text += f"{versus} scores {runner.scores.utility:.3f}"
        return text
    if name == "pack":
        cost = ctx.utility_model.communication_cost(sorted(chosen))
        return f"the closest free GPUs: communication cost {cost:g} (DRB Eq. 3){versus}"
    if name == "spread":
        sockets = sorted({ctx.host.socket[g] for g in chosen})
        return f"spreads over NUMA nodes {_gpus(sockets)}{versus}"
    if name == "besteffort":
        return "the best group of the highest-scoring partition of the free GPUs (go-gpuallocator)"
    if name == "slurm":
        return f"anchored on GPU {min(chosen)}, the first usable, then the most NVLinks to it"
    return "the lowest usable GPU indices"
