"""All-to-all under an objective other than the aggregated bandwidth: the walk over sets of the
exact search (:mod:`.search`, step 1: a set's key depends only on how many of its pairs fall in
each link class).

Sets are walked depth first in lexicographic order, the class counts updated with one popcount
per class and GPU added, and keys cached per count vector; of twin GPUs a set takes the lower
first (the same counts, and the lower set). The first set of the highest key wins.

Under the slowest-link objective (the general effective estimate: the slowest pair, then the
aggregated bandwidth; MAPA, Ranganath et al. SC'21, section 3.5.2, off the DGX-1's classes) the
walk is a branch and bound, not a listing of every set (24,310 sets of 8 of 16 GPUs on an
empty ``cube-mesh-16``). A branch is cut when no completion can beat the incumbent's key:

- its slowest pair so far is already slower than the incumbent's slowest (a pair never leaves);
- or it can at best tie on the slowest pair, and even the most bandwidth it can reach stays
  under the incumbent's: each GPU still to add brings its links to the chosen ones plus at most
  half of its ``r - 1`` widest links to the other candidates (each shared link has two ends).

A cut branch holds no set that would replace the incumbent when the walk reached it (keys only
rise), so the answer and its tie-break are the walk's.
"""

from __future__ import annotations

from itertools import accumulate
from typing import TYPE_CHECKING

from gpualloc.placement.mapa.objectives import WEIGHT_SLACK, Key

if TYPE_CHECKING:
    from gpualloc.placement.mapa.search_bounds import VectorBounds


def best_all_pairs_set(
    search: VectorBounds, lower_twins: list[int]
) -> tuple[Key, tuple[int, ...]] | None:
    """The highest key of an all-to-all set of ``search.k`` GPUs of the pool with the required
    ones, and the lowest set that has it; None if there is none. Counts nodes on ``search``."""
    k, pool = search.k, search.pool
    adjacency = search.classes.adjacency
    weight = search.classes.weight
    n_classes = len(weight)
    required_mask = search.required_mask
    bounded = search.objective.name == "bottleneck"
    # Per GPU, the bandwidth of its links to the chosen GPUs (kept as GPUs come and go).
    to_chosen = [0.0] * search.host.gpu_count
    of_pair = search.classes.of_pair
    widest: dict[int, list[list[float]]] = {}

    def widest_from(start: int) -> list[list[float]]:
        """Per GPU of ``pool[start:]``, the sums of its j widest links to the others there."""
        cached = widest.get(start)
        if cached is None:
            rest = pool[start:]
            cached = widest[start] = [
                list(
                    accumulate(
                        sorted((weight[of_pair[a][b]] for b in rest if b != a), reverse=True),
                        initial=0.0,
                    )
                )
                for a in rest
            ]
        return cached

    keys: dict[tuple[int, ...], Key] = {}
    best: list = [None, None]
    chosen: list[int] = []
    tick = search.deadline.tick

    def cut(start: int, need: int, agg: float, low: float) -> bool:
        """Whether no completion of the branch can beat the incumbent (bottleneck keys)."""
        best_low, best_agg = best[0][0], best[0][1]
        if low < best_low - WEIGHT_SLACK:
            return True
        if low == float("inf") or low > best_low + WEIGHT_SLACK:
            return False  # the slowest pair may still end above the incumbent's
        own = widest_from(start)
        gains = sorted(
            (to_chosen[g] + own[i][need - 1] / 2 for i, g in enumerate(pool[start:])),
            reverse=True,
        )
        return agg + sum(gains[:need]) < best_agg - WEIGHT_SLACK

    def walk(start: int, mask: int, counts: tuple[int, ...], agg: float, low: float) -> None:
        search.nodes += 1
        tick()
        if len(chosen) == k:
            if required_mask & ~mask:
                return
            key = keys.get(counts)
            if key is None:
                key = keys[counts] = search._vector_key(counts)
            if best[0] is None or key > best[0]:
                best[0], best[1] = key, tuple(chosen)
            return
        need = k - len(chosen)
        if bounded and best[0] is not None and cut(start, need, agg, low):
            return
        for index in range(start, len(pool) - need + 1):
            g = pool[index]
            # A required GPU cannot be skipped: every later set would miss it.
            if (required_mask & ~mask) & ((1 << g) - 1):
                break
            if lower_twins[g] & ~mask:
                continue
            chosen.append(g)
            new_counts = tuple(
                counts[c] + (adjacency[c][g] & mask).bit_count() for c in range(n_classes)
            )
            new_low, new_agg = low, agg + to_chosen[g]
            if bounded:
                for c in range(n_classes):
                    if new_counts[c] != counts[c] and weight[c] < new_low:
                        new_low = weight[c]
                row = of_pair[g]
                for h in pool:
                    if h != g:
                        to_chosen[h] += weight[row[h]]
            walk(index + 1, mask | 1 << g, new_counts, new_agg, new_low)
            if bounded:
                row = of_pair[g]
                for h in pool:
                    if h != g:
                        to_chosen[h] -= weight[row[h]]
            chosen.pop()

    walk(0, 0, (0,) * n_classes, 0.0, float("inf"))
    if best[1] is None:
        return None
    return best[0], best[1]
