"""``mapa``: MAPA's Preserve policy (Ranganath et al., SC'21, seed 003, section 3.5.2, Algorithm 1).

- A bandwidth-sensitive job gets the placement of highest predicted effective bandwidth: Table 2
  (Eq. 2) on hosts whose links are the DGX-1 classes it was fitted on, else the edge-bottleneck
  estimate (:mod:`gpualloc.placement.scores`); ``--score`` chooses explicitly.
- A bandwidth-insensitive job, and every 1-GPU job, gets the set that *preserves* the most NVLink
  bandwidth among the GPUs left free (Eq. 3), so that later sensitive jobs find NVLinked GPUs.
- Ties go to the higher aggregated bandwidth (Eq. 1), then to the lowest indices.

Unlike the reference code, a placement is never refused because its predicted bandwidth does not
exceed the empty allocation's 12.335 GB/s: if GPUs are free, the best of them is returned.

Preserve search: the NVLink bandwidth a set S removes from the free pool is
``lost(S) = sum_{v in S} d(v) - internal(S)`` (``d`` = a GPU's NVLink bandwidth to free GPUs), so
the search walks the candidate sets depth first, adding one GPU at a time in O(degree), and cuts a
branch when even the cheapest completion cannot lose less than the incumbent. Complexity: O(C(n, k))
sets in the worst case (a host whose every set loses the same), each in O(NVLink degree).
"""

from __future__ import annotations

from collections.abc import Sequence

from gpualloc.model.request import CommunicationPattern, Placement
from gpualloc.placement.context import DecisionContext
from gpualloc.placement.host import HostGraph
from gpualloc.placement.policy import Alternative, Policy, SetKey, gpu_list
from gpualloc.placement.scores import mapa_counts, pattern_pairs, preserved_gbps
from gpualloc.placement.search import (
    AggregatedObjective,
    best_order_of_set,
    best_ordered_placement,
    evaluate_order,
)

_SLACK = 2e-6


class MapaPolicy(Policy):
    name = "mapa"
    summary = "MAPA Preserve: best predicted bandwidth if sensitive, else preserve NVLinks"
    reference = "MAPA (SC'21) section 3.5.2, Algorithm 1; Eq. 2, Eq. 3"

    def _preserves(self, ctx: DecisionContext) -> bool:
        return not ctx.request.sensitive or ctx.k == 1

    def objective(self, ctx: DecisionContext) -> str:
        if self._preserves(ctx):
            return "max preserved NVLink bandwidth (MAPA Eq. 3), then aggregated"
        return ctx.sensitive_objective().describe()

    def place(self, ctx: DecisionContext) -> Placement:
        if self._preserves(ctx):
            order = self._preserve(ctx)
        else:
            found = best_ordered_placement(
                ctx.host,
                ctx.request.pattern,
                ctx.sensitive_objective(),
                ctx.pool,
                sorted(ctx.request.required),
            )
            assert found is not None
            order = found.order
        return ctx.placement(self.name, order, self.objective(ctx))

    def set_key(self, ctx: DecisionContext, order: Sequence[int]) -> SetKey:
        pattern = ctx.request.pattern
        if self._preserves(ctx):
            aggregated = evaluate_order(ctx.host, pattern, AggregatedObjective(), order)
            preserved = preserved_gbps(ctx.host, ctx.state.free, order)
            return (round(preserved, 6), *aggregated)
        return evaluate_order(ctx.host, pattern, ctx.sensitive_objective(), order)

    def order_of(self, ctx: DecisionContext, gpus: tuple[int, ...]) -> tuple[int, ...]:
        if self._preserves(ctx):
            return ctx.order_for_set(gpus)
        return best_order_of_set(ctx.host, ctx.request.pattern, ctx.sensitive_objective(), gpus)

    def reason(
        self, ctx: DecisionContext, placement: Placement, runner_up: Alternative | None
    ) -> str:
        s = placement.scores
        if self._preserves(ctx):
            return _preserve_reason(ctx, placement, runner_up)
        if s.effective_model == "mapa":
            x, y, z = mapa_counts(ctx.host, pattern_pairs(placement.gpus, ctx.request.pattern))
            text = (
                f"predicted effective bandwidth {s.effective_gbps:g} GB/s (Table 2 on {x} "
                f"double-NVLink, {y} single-NVLink, {z} PCIe pattern edges)"
            )
        else:
            text = f"slowest pattern link {s.effective_gbps:g} GB/s"
        if runner_up:
            text += (
                f"; runner-up {gpu_list(runner_up.gpus)} predicts "
                f"{runner_up.scores.effective_gbps:g} GB/s"
            )
        return text

    # ---- Preserve ----------------------------------------------------------------------------

    def _preserve(self, ctx: DecisionContext) -> tuple[int, ...]:
        ties = min_loss_sets(ctx)
        if ctx.k == 1 or len(ctx.request.pattern.edges) == 0:
            return ties[0]
        # Among the sets that preserve the most, the highest aggregated bandwidth, then the first.
        # Sets are searched in decreasing order of a cheap upper bound on their aggregated
        # bandwidth, and the walk stops when no set left can reach the best found.
        objective = AggregatedObjective()
        pattern = ctx.request.pattern
        bounded = sorted((-aggregated_upper_bound(ctx.host, pattern, gpus), gpus) for gpus in ties)
        best_key: tuple[float, ...] | None = None
        best_order: tuple[int, ...] = ties[0]
        best_set: tuple[int, ...] = ties[0]
        for negative_bound, gpus in bounded:
            if best_key is not None and (
                -negative_bound < best_key[0]
                or (-negative_bound == best_key[0] and gpus > best_set)
            ):
                break
            found = best_ordered_placement(ctx.host, pattern, objective, gpus, gpus)
            assert found is not None
            if (
                best_key is None
                or found.key > best_key
                or (found.key == best_key and gpus < best_set)
            ):
                best_key, best_order, best_set = found.key, found.order, gpus
        return best_order


def aggregated_upper_bound(
    host: HostGraph, pattern: CommunicationPattern, gpus: Sequence[int]
) -> float:
    """An upper bound on the aggregated bandwidth of ``pattern`` on the set ``gpus``, in any order.

    Each rank has at most ``d`` pattern edges (``d`` the pattern's largest degree), so each GPU
    contributes at most its ``d`` widest links within the set, and every edge has two ends; and
    the pattern's ``E`` edges are at most the ``E`` widest pairs (a pair listed twice, as in the
    2-GPU ring, at most the widest pair each time). Rounded like the search's keys.
    """
    bw = host.bandwidth
    edges = len(pattern.edges)
    pairs = sorted((bw[a][b] for i, a in enumerate(gpus) for b in gpus[i + 1 :]), reverse=True)
    if len(set(pattern.edges)) < edges:  # a pair listed twice: the widest pair each time
        return round(edges * (pairs[0] if pairs else 0.0), 6)
    degree: dict[int, int] = {}
    for u, v in pattern.edges:
        degree[u] = degree.get(u, 0) + 1
        degree[v] = degree.get(v, 0) + 1
    d = max(degree.values(), default=0)
    rows = [sorted((bw[a][b] for b in gpus if b != a), reverse=True) for a in gpus]
    by_degree = sum(sum(row[:d]) for row in rows) / 2
    by_pairs = sum(pairs[:edges])
    return round(min(by_degree, by_pairs), 6)


def min_loss_sets(ctx: DecisionContext) -> list[tuple[int, ...]]:
    """Every candidate set that removes the least NVLink bandwidth, in lexicographic order."""
    host, k = ctx.host, ctx.k
    free = sorted(ctx.state.free)
    nv = host.nvlink_bandwidth
    degree = {v: sum(nv[v][u] for u in free if u != v) for v in ctx.pool}
    neighbours = {v: [u for u in free if u != v and nv[v][u] > 0] for v in ctx.pool}
    required = ctx.request.required
    pool = ctx.pool
    best: list = [float("inf"), []]
    chosen: list[int] = []
    chosen_set: set[int] = set()

    def extend(start: int, lost: float) -> None:
        if len(chosen) == k:
            if not required <= chosen_set:
                return
            value = round(lost, 6)
            if value < best[0]:
                best[0], best[1] = value, [tuple(chosen)]
            elif value == best[0]:
                best[1].append(tuple(chosen))
            return
        need = k - len(chosen)
        for index in range(start, len(pool) - need + 1):
            g = pool[index]
            # A required GPU cannot be skipped: every later set would miss it.
            if any(r < g and r not in chosen_set for r in required):
                break
            inside = sum(nv[g][u] for u in neighbours[g] if u in chosen_set)
            new_lost = lost + degree[g] - inside
            # Adding GPUs never lowers the loss below the loss so far minus what the remaining
            # picks could share with each other and with the chosen GPUs; with non-negative
            # contributions (degree >= links into the set) the loss is monotone.
            if round(new_lost, 6) > best[0]:
                continue
            chosen.append(g)
            chosen_set.add(g)
            extend(index + 1, new_lost)
            chosen.pop()
            chosen_set.discard(g)

    extend(0, 0.0)
    return best[1]


def _nvlink_pairs_left(ctx: DecisionContext, chosen: Sequence[int]) -> list[tuple[int, int]]:
    """NVLinked pairs among the GPUs the placement leaves free, widest first."""
    left = sorted(ctx.state.free - set(chosen))
    nv = ctx.host.nvlink_bandwidth
    pairs = [(a, b) for i, a in enumerate(left) for b in left[i + 1 :] if nv[a][b] > 0]
    pairs.sort(key=lambda p: (-nv[p[0]][p[1]], p))
    return pairs


def _preserve_reason(
    ctx: DecisionContext, placement: Placement, runner_up: Alternative | None
) -> str:
    kept = _nvlink_pairs_left(ctx, placement.gpus)
    if runner_up:
        theirs = set(_nvlink_pairs_left(ctx, runner_up.gpus))
        kept = [p for p in kept if p not in theirs] or kept
    links = ctx.host.nvlinks
    preserved = placement.scores.preserved_gbps
    shown = ", ".join(f"NV{links[a][b]} {a}-{b}" for a, b in kept[:3])
    text = f"keeps {preserved:g} GB/s of NVLink free for later sensitive jobs"
    if shown:
        text = f"keeps the pairs {shown} free for later sensitive jobs ({preserved:g} GB/s)"
    if runner_up:
        text += (
            f"; runner-up {gpu_list(runner_up.gpus)} keeps {runner_up.scores.preserved_gbps:g} GB/s"
        )
    return text
