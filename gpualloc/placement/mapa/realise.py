"""Step 3 of the exact search (:mod:`.search`): does some ordered placement realise a count
vector, and which is the lowest?

:func:`realise` runs a :class:`Realisation`, a budgeted depth-first search whose phases are its
methods: extend by one rank (``step``, in the pattern's visiting order, spending one unit of a
link class's budget per pattern edge closed, above the symmetry bounds), narrow the GPUs a rank
may take (``window``: unused, and in a candidate set), prune what cannot take its budget
(``lookahead_ok``, the bounds of :mod:`.search_bounds`) or cannot beat the incumbent
(``lowest_reachable_set``), and apply the tie-break to a whole placement (``complete``). Dead
ends are remembered (Held and Karp's dynamic program over subsets, on a ring).
:func:`realise_star` solves the star directly.

Set-level bounds (:mod:`.set_capacity`): a placement's whole set must carry the
vector, whatever the order. A set spread over ``g`` components of a group of link classes loses
``g - 1`` pattern edges to other classes (``g`` on a ring), so the GPUs used so far, with the
required ones, fix components the set cannot avoid; and once an incumbent exists, a better set
is the incumbent's own (in a lower order, against an incumbent from an earlier vector) or leaves
it first at some GPU ``d`` outside it, so it holds the incumbent's GPUs below ``d`` and no
other: each such ``d`` is checked (``pcie-32gpu-2socket``'s 16-GPU ring on a busy host, 292,338
nodes to 101). On rings, when the sets still reachable are few, each is checked against every
group's bounds and the next GPU comes from those that pass.

Both take the search as a :class:`~.search_bounds.VectorBounds`, the half of
:class:`~.search.PlacementSearch` that declares all they read: :mod:`.search`
imports this module, so this one does not import it back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpualloc.placement.mapa.objectives import WEIGHT_SLACK
from gpualloc.placement.mapa.pattern_graphs import or_masks
from gpualloc.placement.mapa.set_capacity import SetCapacity
from gpualloc.placement.mapa.symmetry import orbit_masks

if TYPE_CHECKING:
    from gpualloc.placement.mapa.search_bounds import VectorBounds


ROOT_ORBITS_AFTER_NODES = 500
"""Failed roots rule out their orbits only once a search has visited this many nodes: finding
a host's symmetries is a search of its own over permutations of the GPUs
(:func:`~.symmetry.orbit_masks`), worth paying only once the search is not a small one."""


class Escalate(Exception):
    """The search outgrew its cheap bounds: tighten them, then try the vector again."""


Ranked = tuple[tuple[int, ...], tuple[int, ...]]
"""A realisation as the tie-break ranks it: (sorted set, order)."""


def realise(
    search: VectorBounds, vector: tuple[int, ...], incumbent: Ranked | None
) -> Ranked | None:
    """The lowest (sorted set, order) realising ``vector`` that beats ``incumbent``, or None."""
    return Realisation(search, vector, incumbent).run()


class Realisation:
    """One budgeted depth-first search for one count vector (step 3 of :mod:`.search`).

    Dead ends are remembered: two partial placements that used the same GPUs, hold the same
    GPUs at the ranks later edges and symmetry constraints still refer to, and have the same
    budget left have the same completions, so a state that failed once fails again (the
    incumbent only improves). On a ring this is Held and Karp's dynamic program over subsets.
    Paths to one state differ only in the GPUs of ranks no longer read, so they reach the
    same sets; a subtree is remembered only if no completion in it lost to the incumbent on
    the order alone (same set), the one comparison that depends on those ranks.

    The phases are methods: :meth:`step` extends a partial placement by one rank,
    :meth:`window` narrows the GPUs it may take, :meth:`lookahead_ok` (with
    :meth:`deficits_ok` and :meth:`forest_room`) prunes what cannot take its budget,
    :meth:`lowest_reachable_set` prunes what cannot beat the incumbent, and :meth:`complete`
    applies the tie-break to a whole placement. The hot ones copy the attributes they read into
    local names first: the search visits up to thousands of nodes per decision.
    """

    def __init__(
        self, search: VectorBounds, vector: tuple[int, ...], incumbent: Ranked | None
    ) -> None:
        self.search = search
        self.k = search.k
        self.pool = search.pool
        self.pool_mask = or_masks(1 << g for g in search.pool)
        self.of_pair = search.classes.of_pair
        self.weights = search.classes.weight
        self.back, self.after, self.before = search.back, search.after, search.before
        self.live, self.visit = search.live, search.visit
        self.required_mask = search.required_mask
        self.lower_twins = search.lower_twins
        self.allowed = search.allowed
        self.escalate_at = search.escalate_at
        self.tick = search.deadline.tick
        self.group_masks, self.pending = search.group_masks, search.pending
        self.unanchored, self.tight_groups = search.unanchored, search.tight_groups
        self.remaining_edges, self.open_degrees = search.remaining_edges, search.open_degrees
        self.degree_sums = search.degree_sums
        self.deficit_bound = search.deficit_bound
        self.tree_bound = search.tree_bound if search.tree_bound_per_node else None
        self.budget = list(vector)
        """What each link class may still carry."""
        self.assigned = [0] * search.k
        """The GPU of each position of the visiting order, up to the current step."""
        self.best = incumbent
        self.own_best = False
        """Whether the incumbent was found by this search, which visits orders lowest first."""
        self.in_order = search.visit == tuple(range(search.k))
        self.forced = self._forced()
        self.best_mask = 0
        self.outside: list[int] = []
        self._incumbent_sets()
        self.offers: dict[tuple[int, int], int] = {}
        """:meth:`offered`'s answers by (GPUs used, floor): -1 for None, -2 for none."""
        self.spread_known: dict[tuple[int, int], bool] = {}
        """:meth:`spread_ok`'s answers by (GPUs used, floor)."""
        connected = search.simple_pattern and search.ring_like is not None
        sets = self._set_capacity(vector) if search.allowed is None and connected else None
        self.spread = sets if sets is not None and sets.spread_checks else None
        # Listing the sets a placement can still reach: rings only (on trees they stay too
        # many to list, and the check cost 4 %).
        self.capacity = sets if search.ring_like else None
        # Roots (the GPU of position 0) that no realisation has; only where position 0 is not
        # ordered against another rank (a ring's rank 0 is its lowest GPU).
        self.dead_roots = 0
        self.root_free = search.allowed is None and not any(
            0 in p for p in (*search.after, *search.before)
        )
        self.failed: set[tuple] = set()
        # Per step s, for each position still to place the assigned ones it must exceed (None
        # where some position has none: nothing is known above).
        self.floors: list[tuple[tuple[int, ...], ...] | None] = []
        for s in range(search.k + 1):
            later = [tuple(p for p in self.after[t] if p < s) for t in range(s, search.k)]
            self.floors.append(tuple(later) if later and all(later) else None)
        self.order_ties = 0
        """Completions that lost to the incumbent on the order alone."""

    def _set_capacity(self, vector: tuple[int, ...]) -> SetCapacity:
        """What the sets a partial placement may become can carry of ``vector``
        (:mod:`.set_capacity`)."""
        search = self.search
        return SetCapacity(
            self.pool_mask,
            search.group_masks,
            vector,
            search.open_degrees[0],
            len(search.pattern.edges),
            search.ring_like,
        )

    def run(self) -> Ranked | None:
        return self.best if self.step(0, 0) else None

    # ---- extending by one rank ---------------------------------------------------------------

    def step(self, s: int, used: int) -> bool:
        """Try every GPU for position ``s`` after ``used``; whether a better placement was found
        below."""
        search = self.search
        search.nodes += 1
        self.tick()
        if search.nodes > self.escalate_at:
            raise Escalate
        free = self.window(used)
        if free is None:
            return False
        k = self.k
        if s == k:
            return self.complete()
        assigned, budget = self.assigned, self.budget
        state = (used, *[assigned[p] for p in self.live[s]], *budget)
        failed = self.failed
        if state in failed:
            return False
        ties_before = self.order_ties
        if s and not self.lookahead_ok(s, used, free):
            failed.add(state)
            return False
        required_mask = self.required_mask | self.forced
        missing = (required_mask & ~used).bit_count()
        if missing > k - s:
            return False
        if self.spread is not None and s and not self.spread_ok(s, used):
            return False
        if self.best is not None:
            if self.beaten(s, used):
                return False
            if s and self.capacity is not None:
                offered = self.offered(s, used)
                if offered is not None:
                    if not offered:
                        return False
                    free &= offered
        lower, upper = -1, 1 << 30
        for p in self.after[s]:
            if assigned[p] > lower:
                lower = assigned[p]
        for p in self.before[s]:
            if assigned[p] < upper:
                upper = assigned[p]
        must_be_required = missing == k - s
        of_pair, back = self.of_pair, self.back[s]
        lower_twins = self.lower_twins
        found = False
        for g in self.pool:
            if g <= lower or not free >> g & 1:
                continue
            if g >= upper:
                break
            if must_be_required and not required_mask >> g & 1:
                continue
            if lower_twins[g] & ~used:
                continue  # a lower twin is left out or comes later: a lower placement exists
            if not s and self.dead_roots >> g & 1:
                continue  # a symmetric root failed: no realisation puts position 0 here
            row = of_pair[g]
            spent = []
            ok = True
            for p in back:
                c = row[assigned[p]]
                budget[c] -= 1
                spent.append(c)
                if budget[c] < 0:
                    ok = False
                    break
            if ok:
                assigned[s] = g
                if self.step(s + 1, used | 1 << g):
                    found = True
                elif not s and self.best is None and self.root_free:
                    self.kill_root_orbit(g)
            for c in spent:
                budget[c] += 1
            if found and self.best is not None and self.beaten(s, used):
                break
        if not found and self.order_ties == ties_before:
            failed.add(state)
        return found

    def kill_root_orbit(self, g: int) -> None:
        """Root ``g`` was searched to the end with no incumbent (nothing cut for the
        tie-break) and no realisation puts position 0 on it; so none puts it on a symmetric
        GPU either (a symmetry keeps every link class, the pool and the required GPUs; the
        sibling and twin rules only reorder GPUs off the root). Those roots are
        skipped: 4 of a 4x4 torus's 16 roots are searched to refute a vector on the whole
        host."""
        search = self.search
        if search.nodes < ROOT_ORBITS_AFTER_NODES:
            return  # a small search does not pay for the host's symmetries
        if search.root_orbits is None:  # once per search, on the pool and required GPUs
            search.root_orbits = orbit_masks(search.host, self.pool_mask, self.required_mask)
        self.dead_roots |= search.root_orbits[g]

    def window(self, used: int) -> int | None:
        """The GPUs the next position may take (a mask), or None when none may: the pool's
        unused ones, and with candidate sets (``allowed``) only those of the sets that hold
        every GPU used so far."""
        free = self.pool_mask & ~used
        if self.allowed is None:
            return free
        reach = 0
        for mask in self.allowed:
            if not used & ~mask:
                reach |= mask
        return free & reach if reach else None

    def complete(self) -> bool:
        """A whole placement: keep it if it beats the incumbent (the lowest sorted set, then
        the lowest order)."""
        assigned = self.assigned
        order = [0] * self.k
        for position, vertex in enumerate(self.visit):
            order[vertex] = assigned[position]
        candidate = (tuple(sorted(assigned)), tuple(order))
        if self.best is not None and candidate >= self.best:
            self.order_ties += candidate[0] == self.best[0]
            return False
        self.best = candidate
        self.own_best = self.in_order
        self.forced = self._forced()
        self._incumbent_sets()
        self.offers.clear()
        self.spread_known.clear()
        return True

    def spread_ok(self, s: int, used: int) -> bool:
        """:meth:`SetCapacity.spread_ok` for the GPUs used, the required ones, those a lower
        set must hold, and the pool's GPUs the positions still to place may take; remembered
        per GPUs used until the incumbent changes."""
        above = self._floor(s)
        key = (used, above)
        known = self.spread_known.get(key)
        if known is None:
            fixed = used | self.forced | self.required_mask
            open_mask = self.pool_mask & ~fixed & ~((2 << above) - 1 if above >= 0 else 0)
            known = self.spread_known[key] = self._lower_set_spreads(fixed, open_mask)
        return known

    def _floor(self, s: int) -> int:
        """A GPU every position still to place at step ``s`` lies above (each must exceed
        placed ones, :attr:`floors`), or -1 where some position has no such bound."""
        floors = self.floors[s]
        if floors is None:
            return -1
        assigned = self.assigned
        return min(max(assigned[p] for p in after) for after in floors)

    def _lower_set_spreads(self, fixed: int, open_mask: int) -> bool:
        """Whether a set holding ``fixed`` and taking the rest from ``open_mask`` passes the
        components bound, and beats the incumbent's set if there is one: then it is the
        incumbent's set itself (in another order), or it first leaves it at a GPU ``d``
        outside it, holding the incumbent's GPUs below ``d`` and no other GPU below ``d``
        (a 16-GPU ring of whole switches on a PCIe host has no lower set once the switches
        below its lowest are broken)."""
        spread, k = self.spread, self.k
        assert spread is not None
        if self.best is None:
            return spread.spread_ok(fixed, open_mask, k)
        star = self.best_mask
        # The same set in a lower order: only against an incumbent found before this search
        # (this one meets the orders of a set lowest first when ranks are visited in order).
        if not self.own_best and not fixed & ~star and spread.spread_ok(star, 0, k):
            return True
        outside_fixed = fixed & ~star
        limit = (outside_fixed & -outside_fixed).bit_length() - 1 if outside_fixed else 1 << 30
        placeable = fixed | open_mask
        for d in self.outside:
            if d > limit:
                break
            bit = 1 << d
            if not placeable & bit:
                continue
            below = bit - 1
            need = star & below
            if need & ~placeable:
                continue  # an incumbent GPU below d can no longer be placed
            held = fixed | need | bit
            if held.bit_count() > k:
                continue  # not monotone in d: a later d may be a GPU already used
            if spread.spread_ok(held, open_mask & ~below & ~held, k):
                return True
        return False

    def offered(self, s: int, used: int) -> int | None:
        """The GPUs of the sets that a completion beating the incumbent can still have and
        that can carry the vector (:mod:`.set_capacity`), or None when they are too many to
        list; remembered per GPUs used until the incumbent changes."""
        above = self._floor(s)
        key = (used, above)
        known = self.offers.get(key, 0)
        if known:
            return None if known == -1 else 0 if known == -2 else known
        fixed = used | self.forced | self.required_mask
        best = self.best
        assert best is not None and self.capacity is not None
        if fixed & ~used & ((1 << (above + 1)) - 1):
            union: int | None = 0  # a GPU every such set holds cannot be placed any more
        else:
            union = self.capacity.completions(self.pool, fixed, above, self.k, best[0])
        self.offers[key] = -1 if union is None else union or -2
        return union

    def _incumbent_sets(self) -> None:
        """The incumbent's set as a mask, and the pool's GPUs outside it, ascending."""
        if self.best is None:
            self.best_mask, self.outside = 0, []
            return
        self.best_mask = or_masks(1 << g for g in self.best[0])
        self.outside = [g for g in self.pool if not self.best_mask >> g & 1]

    def _forced(self) -> int:
        """The GPUs every placement that beats the incumbent holds (a mask): a lower set
        agrees with the incumbent's up to its first GPU outside it, which is no lower than the
        pool's lowest GPU outside it, so it holds every GPU of the incumbent's set below that
        one (an 11-GPU ring's set on an empty ``torus-2d-16`` starts with GPUs 0-7, and a
        lower one must hold them too)."""
        if self.best is None:
            return 0
        chosen = set(self.best[0])
        outside = next((g for g in self.pool if g not in chosen), 1 << 30)
        return or_masks(1 << g for g in self.best[0] if g < outside)

    # ---- pruning -----------------------------------------------------------------------------

    def lowest_reachable_set(self, s: int, used: int, above: int = -1) -> tuple[int, ...]:
        """The lowest sorted set any completion of the first ``s`` positions can have, when
        every GPU still to place is above ``above``."""
        chosen = self.assigned[:s]
        need = self.k - s
        extra = []
        for g in self.pool:
            if need == 0:
                break
            if g > above and not used >> g & 1:
                extra.append(g)
                need -= 1
        if need:
            return (1 << 30,)  # too few GPUs above: no completion at all
        return tuple(sorted(chosen + extra))

    def beaten(self, s: int, used: int) -> bool:
        """Whether no completion of the first ``s`` positions can beat the incumbent's set.

        The lowest reachable set at or above the incumbent's, or strictly above it once the
        GPUs still to place must exceed an assigned one (a ring's rank 0 holds its lowest GPU,
        so a ring rooted above the incumbent's lowest GPU cannot come first: on
        ``cube-mesh-16`` a third of the proof that an 8-GPU NV1 ring is the lowest lies under
        roots above GPU 0).
        """
        best = self.best
        assert best is not None
        if self.lowest_reachable_set(s, used) >= best[0]:
            return True
        above = self._floor(s)
        return above >= 0 and self.lowest_reachable_set(s, used, above) > best[0]

    def lookahead_ok(self, s: int, used: int, free: int) -> bool:
        """Each group of classes can still take its remaining budget: an assigned GPU closes
        at most as many of its open edges on the group's links as it has unused neighbours
        on them; an edge between two unassigned ranks may land anywhere."""
        budget, assigned, pending = self.budget, self.assigned, self.pending[s]
        loose = self.unanchored[s]
        for members, masks, _ in self.group_masks:
            want = 0
            for c in members:
                want += budget[c]
            if want <= loose:
                continue
            room = loose
            for p, count in pending:
                room += min(count, (masks[assigned[p]] & free).bit_count())
                if room >= want:
                    break
            if room < want:
                return False
        for members, masks, limit in self.tight_groups:
            want = 0
            for c in members:
                want += budget[c]
            if want and self.forest_room(s, free, masks, limit) < want:
                return False
        if self.deficit_bound:
            return self.deficits_ok(s, free)
        if self.tree_bound is not None:
            weight = 0.0
            for c, w in enumerate(self.weights):
                weight += budget[c] * w
            return self.tree_bound.remaining(s, assigned, used, free) >= weight - WEIGHT_SLACK
        return True

    def deficits_ok(self, s: int, unused: int) -> bool:
        """Each group of classes against the degree deficit of what is left. A rank of
        degree d on a GPU with t neighbours on the group's links sends at least d - t of
        its edges elsewhere; an edge off the group covers two such deficits at most. The
        unassigned ranks' deficits are least when the highest degrees go to the GPUs with
        the most neighbours (the convexity of max(0, d - t)).

        A group whose budget the largest deficit possible (no GPU with any neighbour) could
        not refute is skipped before its neighbour counts are taken (most groups, at most
        nodes)."""
        budget, assigned, pending = self.budget, self.assigned, self.pending[s]
        degrees = self.open_degrees[s]
        edges_left = len(self.remaining_edges[s])
        most = self.degree_sums[s]
        unused_gpus: list[int] | None = None
        reachable = unused
        for members, masks, _ in self.group_masks:
            want = 0
            for c in members:
                want += budget[c]
            if not want:
                continue
            deficit = 0
            for p, count in pending:
                room = (masks[assigned[p]] & unused).bit_count()
                if count > room:
                    deficit += count - room
            if want <= edges_left - (deficit + most + 1) // 2:
                continue
            if unused_gpus is None:
                for p, _ in pending:
                    reachable |= 1 << assigned[p]
                unused_gpus = []
                rest = unused
                while rest:
                    low = rest & -rest
                    unused_gpus.append(low.bit_length() - 1)
                    rest ^= low
            offers = [(masks[g] & reachable).bit_count() for g in unused_gpus]
            offers.sort(reverse=True)
            # More GPUs than ranks may be left: the ranks take the best-connected ones.
            for degree, offer in zip(degrees, offers, strict=False):
                if degree > offer:
                    deficit += degree - offer
            if want > edges_left - (deficit + 1) // 2:
                return False
        return True

    def forest_room(self, s: int, free: int, masks: tuple[int, ...], limit: int) -> int:
        """The most remaining tree edges on a group whose GPUs have at most ``limit`` links
        in it: greedy from the leaves up, an assigned rank offering its unused neighbours."""
        assigned = self.assigned
        room: dict[int, int] = {}
        taken = 0
        for p, t in self.remaining_edges[s]:
            if t not in room:
                room[t] = limit
            if p not in room:
                room[p] = (masks[assigned[p]] & free).bit_count() if p < s else limit
            if room[t] and room[p]:
                room[t] -= 1
                room[p] -= 1
                taken += 1
        return taken


def realise_star(
    search: VectorBounds,
    vector: tuple[int, ...],
    incumbent: tuple[tuple[int, ...], tuple[int, ...]] | None,
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """A star's edges all touch its centre: per centre, the leaves of each class are free
    to choose, so the lowest ones of each class give the lowest set (O(n) per centre)."""
    of_pair = search.classes.of_pair
    best = incumbent
    search.nodes += 1
    search.deadline.tick()
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
