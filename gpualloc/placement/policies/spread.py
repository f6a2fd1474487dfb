"""``spread``: the spread strategy of the DRB paper (Amaral et al., SC'17, seed 000, section 3):
GPUs from as many sockets as possible, for CPU-to-GPU bandwidth and balance.

Objective, lexicographic: the most sockets (NUMA nodes) used, then the fewest GPUs on the
busiest of them, then the most free GPUs in the sockets used (the least loaded sockets), then the
lowest indices. The chosen set is ordered for the job's pattern.

Every term depends only on how many GPUs the set takes from each socket, and the lowest set with
given counts takes each socket's lowest GPUs (after the required ones), so the search runs over
count vectors: first the most sockets a set can use, then the least the busiest must hold, then
a depth-first walk over the vectors with both, keeping the highest third term and the lowest set
(:func:`spread_set`). Exact; O(s^2 + the vectors of the best two terms) for s sockets, instead
of scoring C(n, k) sets.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from gpualloc.model.request import Placement
from gpualloc.placement.context import DecisionContext
from gpualloc.placement.policies.policy import Alternative, Policy, SetKey, gpu_list


class SpreadPolicy(Policy):
    name = "spread"
    summary = "GPUs spread over as many sockets as possible (DRB paper's spread)"
    reference = "DRB (SC'17) section 3, spread"
    reads_running_jobs = False  # the free GPUs alone decide
    scores_partial_sets = True
    keys_sets_alone = True

    def search(self, ctx: DecisionContext) -> Placement:
        chosen = spread_set(ctx)
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

    def key_bound(self, ctx: DecisionContext, gpus: Sequence[int]) -> SetKey:
        """No set of ``gpus`` spans more sockets than they do (the key's first term)."""
        sockets = len({ctx.host.socket[g] for g in gpus})
        return (float(min(sockets, ctx.k)), math.inf, math.inf)

    def reason(
        self, ctx: DecisionContext, placement: Placement, runner_up: Alternative | None
    ) -> str:
        sockets = sorted({ctx.host.socket[g] for g in placement.gpus})
        return f"spreads over NUMA nodes {gpu_list(sockets)}, the most the free GPUs allow"


def spread_set(ctx: DecisionContext) -> tuple[int, ...]:
    """The lowest set of the highest :meth:`SpreadPolicy.set_key`, by socket counts."""
    socket, k, required = ctx.host.socket, ctx.k, ctx.request.required
    members: dict[int, list[int]] = {}
    for g in ctx.pool:
        members.setdefault(socket[g], []).append(g)
    free_per_socket = Counter(socket[g] for g in ctx.state.free)
    groups = list(members.values())  # in the order of their lowest GPU
    must = [sorted(g for g in group if g in required) for group in groups]
    rest = [[g for g in group if g not in required] for group in groups]
    weight = [free_per_socket[socket[group[0]]] for group in groups]
    low = [len(m) for m in must]
    # The most sockets: every socket with a required GPU, then one GPU from as many others.
    forced = sum(1 for m in must if m)
    used = forced + min(len(groups) - forced, k - sum(low))
    # The least the busiest socket must hold: the least m for which a set of ``used`` sockets
    # (the forced ones and those that can hold the most) can hold k GPUs.
    busiest = max(max(low, default=0), 1)
    while True:
        caps = [min(len(group), max(busiest, low[i])) for i, group in enumerate(groups)]
        others = sorted((caps[i] for i in range(len(groups)) if not must[i]), reverse=True)
        room = sum(caps[i] for i in range(len(groups)) if must[i]) + sum(others[: used - forced])
        if room >= k and all(c <= busiest for c in low):
            break
        busiest += 1
    best: list = [None, None]  # (third term, set)
    counts = [0] * len(groups)

    def walk(i: int, left: int, sockets: int) -> None:
        if i == len(groups):
            if left or sockets != used:
                return
            chosen: list[int] = []
            third = 0
            for j, c in enumerate(counts):
                if c:
                    chosen += must[j] + rest[j][: c - low[j]]
                    third += c * weight[j]
            gpus = tuple(sorted(chosen))
            if best[0] is None or third > best[0] or (third == best[0] and gpus < best[1]):
                best[0], best[1] = third, gpus
            return
        if sockets + (len(groups) - i) < used:
            return
        top = min(len(groups[i]), busiest, left)
        for c in range(top, low[i] - 1, -1):
            if c == 0 and must[i]:
                break
            counts[i] = c
            walk(i + 1, left - c, sockets + (c > 0))
        counts[i] = 0

    walk(0, k, 0)
    assert best[1] is not None  # the context checked feasibility
    return best[1]
