"""Step 3 of the exact search (:mod:`.search`): does some ordered placement realise a count
vector, and which is the lowest?

:func:`realise` is a budgeted depth-first search. Its phases, each a named function inside it
(closures, for the speed of local names on the hot path):

1. ``step``: assign the next rank in the pattern's visiting order to a free GPU above the
   symmetry bounds, spending one unit of a link class's budget per pattern edge it closes;
2. ``lookahead_ok`` (with ``deficits_ok`` and ``forest_room``): can every group of link
   classes still take what is left of its budget (the bounds of :mod:`.search_bounds`);
3. ``lowest_reachable_set``: cut a branch whose lowest reachable set cannot beat the incumbent;
4. at the last rank, the tie-break: the lowest sorted set, then the lowest order.

Dead ends are remembered (Held and Karp's dynamic program over subsets, on a ring).
:func:`realise_star` solves the star directly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpualloc.placement.objectives import WEIGHT_SLACK
from gpualloc.placement.pattern_graphs import or_masks

if TYPE_CHECKING:
    from gpualloc.placement.search import PlacementSearch


class Escalate(Exception):
    """The search outgrew its cheap bounds: tighten them, then try the vector again."""


def realise(
    search: PlacementSearch,
    vector: tuple[int, ...],
    incumbent: tuple[tuple[int, ...], tuple[int, ...]] | None,
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The lowest (sorted set, order) realising ``vector`` that beats ``incumbent``.

    Dead ends are remembered: two partial placements that used the same GPUs, hold the same
    GPUs at the ranks later edges and symmetry constraints still refer to, and have the same
    budget left have the same completions, so a state that failed once fails again (the
    incumbent only improves). On a ring this is Held and Karp's dynamic program over subsets.
    Paths to one state differ only in the GPUs of ranks no longer read, so they reach the
    same sets; a subtree is remembered only if no completion in it lost to the incumbent on
    the order alone (same set), the one comparison that depends on those ranks.
    """
    k = search.k
    pool = search.pool
    of_pair = search.classes.of_pair
    back, after, before, live = search.back, search.after, search.before, search.live
    budget = list(vector)
    assigned = [0] * k
    required_mask = search.required_mask
    visit = search.visit
    best: list = [incumbent]
    failed: set[tuple] = set()
    order_ties = [0]  # completions that lost to the incumbent on the order alone

    def lowest_reachable_set(s: int, used: int) -> tuple[int, ...]:
        chosen = assigned[:s]
        need = k - s
        extra = []
        for g in pool:
            if need == 0:
                break
            if not used >> g & 1:
                extra.append(g)
                need -= 1
        return tuple(sorted(chosen + extra))

    group_masks, pending, unanchored = search.group_masks, search.pending, search.unanchored
    tight_groups, remaining_edges = search.tight_groups, search.remaining_edges
    open_degrees, deficit_bound = search.open_degrees, search.deficit_bound
    tree_bound, weights = search.tree_bound, search.classes.weight
    if not search.tree_bound_per_node:
        tree_bound = None
    escalate_at = search.escalate_at
    allowed = search.allowed
    pool_mask = or_masks(1 << g for g in pool)

    def lookahead_ok(s: int, used: int, free: int) -> bool:
        """Each group of classes can still take its remaining budget: an assigned GPU closes
        at most as many of its open edges on the group's links as it has unused neighbours
        on them; an edge between two unassigned ranks may land anywhere."""
        loose = unanchored[s]
        for members, masks, _ in group_masks:
            want = 0
            for c in members:
                want += budget[c]
            if want <= loose:
                continue
            room = loose
            for p, count in pending[s]:
                room += min(count, (masks[assigned[p]] & free).bit_count())
                if room >= want:
                    break
            if room < want:
                return False
        for members, masks, limit in tight_groups:
            want = 0
            for c in members:
                want += budget[c]
            if want and forest_room(s, free, masks, limit) < want:
                return False
        if deficit_bound:
            return deficits_ok(s, free)
        if tree_bound is not None:
            want = 0.0
            for c, w in enumerate(weights):
                want += budget[c] * w
            return tree_bound.remaining(s, assigned, used, free) >= want - WEIGHT_SLACK
        return True

    def deficits_ok(s: int, unused: int) -> bool:
        """Each group of classes against the degree deficit of what is left. A rank of
        degree d on a GPU with t neighbours on the group's links sends at least d - t of
        its edges elsewhere; an edge off the group covers two such deficits at most. The
        unassigned ranks' deficits are least when the highest degrees go to the GPUs with
        the most neighbours (the convexity of max(0, d - t))."""
        reachable = unused
        for p, _ in pending[s]:
            reachable |= 1 << assigned[p]
        degrees = open_degrees[s]
        edges_left = len(remaining_edges[s])
        unused_gpus = []
        rest = unused
        while rest:
            low = rest & -rest
            unused_gpus.append(low.bit_length() - 1)
            rest ^= low
        for members, masks, _ in group_masks:
            want = 0
            for c in members:
                want += budget[c]
            if not want:
                continue
            deficit = 0
            for p, count in pending[s]:
                room = (masks[assigned[p]] & unused).bit_count()
                if count > room:
                    deficit += count - room
            offers = [(masks[g] & reachable).bit_count() for g in unused_gpus]
            offers.sort(reverse=True)
            # More GPUs than ranks may be left: the ranks take the best-connected ones.
            for degree, offer in zip(degrees, offers, strict=False):
                if degree > offer:
                    deficit += degree - offer
            if want > edges_left - (deficit + 1) // 2:
                return False
        return True

    def forest_room(s: int, free: int, masks: tuple[int, ...], limit: int) -> int:
        """The most remaining tree edges on a group whose GPUs have at most ``limit`` links
        in it: greedy from the leaves up, an assigned rank offering its unused neighbours."""
        room: dict[int, int] = {}
        taken = 0
        for p, t in remaining_edges[s]:
            if t not in room:
                room[t] = limit
            if p not in room:
                room[p] = (masks[assigned[p]] & free).bit_count() if p < s else limit
            if room[t] and room[p]:
                room[t] -= 1
                room[p] -= 1
                taken += 1
        return taken

    def step(s: int, used: int) -> bool:
        search.nodes += 1
        if search.nodes > escalate_at:
            raise Escalate
        free = pool_mask & ~used
        if allowed is not None:
            # Only GPUs of the candidate sets that hold every GPU used so far remain.
            reach = 0
            for mask in allowed:
                if not used & ~mask:
                    reach |= mask
            if not reach:
                return False
            free &= reach
        if s == k:
            order = [0] * k
            for position, vertex in enumerate(visit):
                order[vertex] = assigned[position]
            candidate = (tuple(sorted(assigned)), tuple(order))
            if best[0] is not None and candidate >= best[0]:
                order_ties[0] += candidate[0] == best[0][0]
                return False
            best[0] = candidate
            return True
        state = (used, *[assigned[p] for p in live[s]], *budget)
        if state in failed:
            return False
        ties_before = order_ties[0]
        if s and not lookahead_ok(s, used, free):
            failed.add(state)
            return False
        missing = (required_mask & ~used).bit_count()
        if missing > k - s:
            return False
        if best[0] is not None and lowest_reachable_set(s, used) >= best[0][0]:
            return False
        lower, upper = -1, 1 << 30
        for p in after[s]:
            if assigned[p] > lower:
                lower = assigned[p]
        for p in before[s]:
            if assigned[p] < upper:
                upper = assigned[p]
        must_be_required = missing == k - s
        found = False
        for g in pool:
            if g <= lower or not free >> g & 1:
                continue
            if g >= upper:
                break
            if must_be_required and not required_mask >> g & 1:
                continue
            row = of_pair[g]
            spent = []
            ok = True
            for p in back[s]:
                c = row[assigned[p]]
                budget[c] -= 1
                spent.append(c)
                if budget[c] < 0:
                    ok = False
                    break
            if ok:
                assigned[s] = g
                if step(s + 1, used | 1 << g):
                    found = True
            for c in spent:
                budget[c] += 1
            if found and best[0] is not None and lowest_reachable_set(s, used) >= best[0][0]:
                break
        if not found and order_ties[0] == ties_before:
            failed.add(state)
        return found

    if step(0, 0):
        return best[0]
    return None


def realise_star(
    search: PlacementSearch,
    vector: tuple[int, ...],
    incumbent: tuple[tuple[int, ...], tuple[int, ...]] | None,
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """A star's edges all touch its centre: per centre, the leaves of each class are free
    to choose, so the lowest ones of each class give the lowest set (O(n) per centre)."""
    of_pair = search.classes.of_pair
    best = incumbent
    search.nodes += 1
    for center in search.pool:
        need = list(vector)
        leaves: list[int] = []
        for r in sorted(search.required - {center}):
            need[of_pair[center][r]] -= 1
            leaves.append(r)
        if min(need) < 0:
            continue
        for g in search.pool:
            if g == center or g in search.required:
                continue
            c = of_pair[center][g]
            if need[c] > 0:
                need[c] -= 1
                leaves.append(g)
        if any(need):
            continue
        leaves.sort()
        candidate = (tuple(sorted((center, *leaves))), (center, *leaves))
        if best is None or candidate < best:
            best = candidate
    return best if best is not incumbent else None
