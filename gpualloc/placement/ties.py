"""The tie rule of gpualloc's own policies, applied after each policy's objective.

Among the placements a policy's objective rates equal (the same :meth:`Policy.set_key`), the
placement taken is the one that

1. spans the **fewest NUMA nodes**: a job split over sockets crosses the CPUs' interconnect on
   every PCIe transfer and cannot have all its CPUs and memory local (DRB, seed 000, section
   4.1.2: the socket level of the physical graph; ``nvidia-smi topo -m``'s SYS);
2. then the **fewest PCIe root complexes** (host bridges): what falls back to PCIe stays below
   one bridge (PHB rather than NODE);
3. then **keeps the most NVLink bandwidth among the GPUs left free** for later jobs (MAPA, seed
   003, section 3.5.1, Eq. 3: the Preserve metric);
4. then has the **lowest GPU indices** (the sorted set, lexicographically).

On an NVSwitch board every pair of GPUs has the same bandwidth, so every objective ties across
sockets there and the lowest indices alone used to decide: with GPUs 1-3 of an HGX H100 held, a
2-GPU job got GPUs 0 and 4, one on each socket, while 4-7 shared one
(``tests/test_placement_ties.py``).

The search is exact and works on regions, so that it costs a few restricted searches rather
than one per tied set. A tied set spanning ``m`` NUMA nodes lies inside the union of those
``m`` nodes; the policy's own search restricted to a union (the other GPUs excluded, still free
for the scores) finds whether the union holds a tied set, and its lowest one. Unions are tried by
increasing size from the least that can hold the job, each first bounded from below by
criteria 2-4 (the fewest root complexes its GPUs can fill the job from, the most NVLink
bandwidth any of its sets can leave free, its lowest set) and skipped when that bound cannot
beat the best placement found so far; a policy's bound of its own key on a region
(:meth:`Policy.key_bound`) skips regions no tied set lies in. Inside a union the same is done
for root complexes; then its sets with the best two counts are walked depth first for criteria
3 and 4, cut by a bound of the NVLink bandwidth they leave free, and each that would rank
first is tried. A policy whose key reads the set alone is scored without a search. At most
:data:`MAX_SEARCHES` restricted searches and :data:`MAX_RANKED_STEPS` steps of that walk run
per decision; either limit, or the decision's time budget, is said in the placement's notes.

Policies that reproduce another tool (``besteffort``, ``slurm``, ``baseline``) keep that tool's
own tie-break: their answers are what a user of that tool gets.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import accumulate, combinations
from typing import NamedTuple, Protocol

from msgspec import structs

from gpualloc.model.printable import count_of
from gpualloc.model.request import Placement
from gpualloc.placement import deadline
from gpualloc.placement.context import DecisionContext

SetKey = tuple[float, ...]


class Policy(Protocol):
    """What the tie rule reads of a policy (:class:`gpualloc.placement.policies.policy.Policy`)."""

    def search(self, ctx: DecisionContext) -> Placement: ...

    def set_key(self, ctx: DecisionContext, order: Sequence[int]) -> SetKey | None: ...

    def key_bound(self, ctx: DecisionContext, gpus: Sequence[int]) -> SetKey | None: ...

    @property
    def keys_sets_alone(self) -> bool: ...


MAX_RANKED_STEPS = 6_000
"""The most steps (partial sets) of the walk that ranks one region's sets by criteria 3 and 4:
a few hundred on a socket of an 8- or 16-GPU board, every set of 3 of a 32-GPU mesh; on a
16-GPU single-socket mesh, where thousands of sets may leave more NVLink free than the
policy's answer, the walk may stop there, and says so (a step is one partial set and its bound,
O(n log n) in the region's n GPUs)."""

MAX_SEARCHES = 48
"""The most restricted searches of the policy one decision's tie rule runs."""

_SLACK = 2e-6
"""Keys are rounded to 1e-6 (:func:`gpualloc.placement.mapa.objectives.rounded`)."""


class TieKey(NamedTuple):
    """A set's standing under the tie rule; :meth:`rank` is lower for the better set."""

    numa_nodes: int
    root_complexes: int
    preserved_gbps: float
    gpus: tuple[int, ...]

    def rank(self) -> tuple[int, int, float, tuple[int, ...]]:
        return (self.numa_nodes, self.root_complexes, -round(self.preserved_gbps, 6), self.gpus)


def tie_key(ctx: DecisionContext, gpus: Iterable[int]) -> TieKey:
    """Where ``gpus`` stand under the tie rule on the host and free GPUs of ``ctx``."""
    chosen = tuple(sorted(gpus))
    host = ctx.host
    return TieKey(
        numa_nodes=len({host.socket[g] for g in chosen}),
        root_complexes=len({host.root_complex[g] for g in chosen}),
        preserved_gbps=round(_preserved(ctx, chosen), 6),
        gpus=chosen,
    )


def decided_by(winner: TieKey, other: TieKey) -> str:
    """The first criterion of the tie rule on which ``winner`` beats ``other``, in words."""
    if winner.numa_nodes != other.numa_nodes:
        return (
            f"fewer NUMA nodes ({winner.numa_nodes} against {other.numa_nodes} for "
            f"{_listed(other.gpus)})"
        )
    if winner.root_complexes != other.root_complexes:
        return (
            f"fewer PCIe root complexes ({winner.root_complexes} against "
            f"{other.root_complexes} for {_listed(other.gpus)})"
        )
    if abs(winner.preserved_gbps - other.preserved_gbps) > _SLACK:
        return (
            f"more NVLink bandwidth left free ({winner.preserved_gbps:g} against "
            f"{other.preserved_gbps:g} GB/s for {_listed(other.gpus)})"
        )
    return f"lower GPU indices (than {_listed(other.gpus)})"


def ties(key: SetKey, other: SetKey | None) -> bool:
    """Whether two keys of a policy are equal (within the rounding of keys)."""
    if other is None or len(key) != len(other):
        return False
    return all(abs(a - b) <= _SLACK for a, b in zip(key, other, strict=True))


def break_ties(policy: Policy, ctx: DecisionContext, found: Placement) -> Placement:
    """``found``, the policy's answer, or the placement the tie rule prefers among those its
    objective rates equal; ``decided_by`` names the criterion where another tied placement was
    seen. The decision's time budget stops the rule where it stands (said in the notes)."""
    if found.cut_short or len(ctx.pool) <= ctx.k:
        return found
    key = policy.set_key(ctx, found.gpus)
    if key is None:
        return found
    rule = _TieSearch(policy, ctx, key, found)
    try:
        rule.run()
    except deadline.OverBudget:
        rule.limits.append("the decision's time budget ran out")
    return rule.answer()


class _TieSearch:
    def __init__(self, policy: Policy, ctx: DecisionContext, key: SetKey, found: Placement):
        self.policy, self.ctx, self.key = policy, ctx, key
        self.k, self.required = ctx.k, ctx.request.required
        self.placements: dict[tuple[int, ...], Placement] = {tuple(sorted(found.gpus)): found}
        self.best = self.answered = tie_key(ctx, found.gpus)
        """The best set so far, and the policy's own answer: the lowest tied set of all, so
        the lowest of any region that holds it."""
        self.seen: list[TieKey] = [self.best]
        """Every tied set found, the policy's own answer first."""
        self.keyed: set[tuple[int, ...]] = set()
        """Tied sets known by their key alone (:meth:`_tied_set`), not yet placed."""
        self.searches = 0
        self.limits: list[str] = []
        free = sorted(ctx.state.free)
        self.nv = nv = ctx.host.nvlink_bandwidth
        self.degree = {g: sum(nv[g][u] for u in free if u != g) for g in ctx.pool}
        self.total_free_gbps = sum(nv[a][b] for i, a in enumerate(free) for b in free[i + 1 :])

    # ---- the walk ----------------------------------------------------------------------------

    def run(self) -> None:
        socket = self.ctx.host.socket
        for region in self._unions(self.ctx.pool, socket, self.best.numa_nodes):
            self._within_numa_nodes(region)

    def _unions(
        self, pool: Sequence[int], group_of: Sequence[int], at_most: int
    ) -> Iterable[tuple[int, ...]]:
        """The GPUs of each union of up to ``at_most`` groups of ``pool`` (by ``group_of``)
        that holds the required GPUs' groups and room for the job, fewest groups first; none of
        more groups than the best set so far spans."""
        members: dict[int, list[int]] = {}
        for g in pool:
            members.setdefault(group_of[g], []).append(g)
        needed = {group_of[g] for g in self.required}
        optional = sorted(set(members) - needed)
        for size in range(max(len(needed), 1), at_most + 1):
            if size - len(needed) > len(optional):
                return
            for extra in combinations(optional, size - len(needed)):
                gpus = tuple(sorted(g for group in (*needed, *extra) for g in members[group]))
                if len(gpus) >= self.k:
                    yield gpus
            if len({group_of[g] for g in self.best.gpus}) <= size:
                return

    def _within_numa_nodes(self, region: tuple[int, ...]) -> None:
        """Criteria 2-4 among the sets of one union of NUMA nodes."""
        host = self.ctx.host
        numa = len({host.socket[g] for g in region})
        if not self._may_beat(numa, region):
            return
        inside = self._lowest_tied(region)
        if inside is None:
            return
        lowest = inside
        if self._fewest_root_complexes(region) < inside.root_complexes:
            for sub in self._unions(region, host.root_complex, inside.root_complexes - 1):
                if not self._may_beat(len({host.socket[g] for g in sub}), sub):
                    continue
                found = self._lowest_tied(sub)
                if found is not None and found.rank() < lowest.rank():
                    lowest = found
        self._ranked(region, inside, lowest)

    def _ranked(self, region: tuple[int, ...], inside: TieKey, lowest: TieKey) -> None:
        """Criteria 3 and 4 over the sets of ``region`` with ``lowest``'s two counts, depth
        first in lexicographic order: each set that would rank before the best so far is
        tried, and one that ties becomes the best, so that later sets must leave more NVLink
        free. None below ``inside``, the region's own answer, ties: the policy returns its
        lowest tied set.

        A set removes MAPA Eq. 3's loss from the free GPUs' NVLink bandwidth; a branch is cut
        when what it must still add exceeds what the best set lost: each GPU added removes its
        links to the free GPUs, less those to the chosen ones and at most half its ``need - 1``
        widest links in the region (each link to a later member is counted at both ends), as
        :class:`~gpualloc.placement.policies.mapa.LossSearch` bounds the same loss. The walk takes
        at most :data:`MAX_RANKED_STEPS` steps; past that the rule says it stopped."""
        best = self.best
        counts = (lowest.numa_nodes, lowest.root_complexes)
        if counts != (best.numa_nodes, best.root_complexes):
            return  # best ranks before every set of these counts (it ranks before lowest)
        if not self._preserve_may_beat(region, best) and lowest.rank() >= best.rank():
            return
        k, nv, degree, required = self.k, self.nv, self.degree, self.required
        # GPUs with the fewest links to free GPUs first: the sets that leave the most free come
        # early, and each tied one tightens the cut for the rest.
        walk = sorted(region, key=lambda g: (degree[g], g))
        place = {g: i for i, g in enumerate(walk)}
        widest = {
            g: [0.0, *accumulate(sorted((nv[g][h] for h in region if h != g), reverse=True))]
            for g in region
        }
        to_chosen = dict.fromkeys(region, 0.0)
        chosen: list[int] = []
        steps = [0]
        tick = deadline.current().tick

        def leaf() -> None:
            gpus = tuple(sorted(chosen))
            if gpus < inside.gpus or not required <= set(gpus):
                return
            standing = self._standing(gpus)
            if (standing.numa_nodes, standing.root_complexes) != counts:
                return
            if standing.rank() < self.best.rank():
                self._lowest_tied(gpus)

        def extend(start: int, lost: float) -> None:
            tick()
            steps[0] += 1
            if steps[0] > MAX_RANKED_STEPS:
                raise _TooMany
            if any(place[r] < start and r not in chosen for r in required):
                return  # a required GPU passed over: no later set holds it
            need = k - len(chosen)
            if need == 0:
                leaf()
                return
            rest = walk[start:]
            if len(rest) < need:
                return
            adds = sorted(degree[g] - to_chosen[g] - widest[g][need - 1] / 2 for g in rest)
            most = self.total_free_gbps - self.best.preserved_gbps  # what the best set lost
            if lost + sum(adds[:need]) > most + 2 * _SLACK:
                return
            for index in range(start, len(walk) - need + 1):
                g = walk[index]
                added = degree[g] - to_chosen[g]
                chosen.append(g)
                row = nv[g]
                for h in region:
                    to_chosen[h] += row[h]
                extend(index + 1, lost + added)
                for h in region:
                    to_chosen[h] -= row[h]
                chosen.pop()

        try:
            extend(0, 0.0)
        except _TooMany:
            self._limit(f"NVLink bandwidth left free compared in {MAX_RANKED_STEPS:,} steps only")

    def _standing(self, chosen: tuple[int, ...]) -> TieKey:
        """:func:`tie_key` of a sorted set, its preserved bandwidth from the free GPUs'
        degrees (MAPA Eq. 3 as ``total - sum of degrees + links among the set``)."""
        host, nv = self.ctx.host, self.nv
        inside = sum(nv[a][b] for i, a in enumerate(chosen) for b in chosen[i + 1 :])
        lost = sum(self.degree[g] for g in chosen) - inside
        return TieKey(
            numa_nodes=len({host.socket[g] for g in chosen}),
            root_complexes=len({host.root_complex[g] for g in chosen}),
            preserved_gbps=round(self.total_free_gbps - lost, 6),
            gpus=chosen,
        )

    # ---- bounds ------------------------------------------------------------------------------

    def _may_beat(self, numa: int, gpus: tuple[int, ...]) -> bool:
        """Whether some set of ``gpus`` spanning ``numa`` nodes may rank before the best set:
        a bound of each criterion in turn (the fewest root complexes, the most preserved
        bandwidth, the lowest set)."""
        best = self.best
        counts = (numa, self._fewest_root_complexes(gpus))
        if counts != (best.numa_nodes, best.root_complexes):
            return counts < (best.numa_nodes, best.root_complexes)
        most = self._most_preserved(gpus)
        if abs(most - best.preserved_gbps) > _SLACK:
            return most > best.preserved_gbps
        return self._lowest_set(gpus) < best.gpus

    def _preserve_may_beat(self, gpus: tuple[int, ...], lowest: TieKey) -> bool:
        return self._most_preserved(gpus) > lowest.preserved_gbps + _SLACK

    def _fewest_root_complexes(self, gpus: tuple[int, ...]) -> int:
        """The fewest root complexes of ``gpus`` that hold the job and its required GPUs."""
        rc = self.ctx.host.root_complex
        sizes: dict[int, int] = {}
        for g in gpus:
            sizes[rc[g]] = sizes.get(rc[g], 0) + 1
        needed = {rc[g] for g in self.required}
        room = sum(sizes[r] for r in needed)
        count = len(needed)
        for size in sorted((sizes[r] for r in sizes if r not in needed), reverse=True):
            if room >= self.k:
                break
            room += size
            count += 1
        return max(count, 1)

    def _most_preserved(self, gpus: tuple[int, ...]) -> float:
        """An upper bound on the NVLink bandwidth a set of ``gpus`` leaves free: a set removes
        each member's links to free GPUs, less those among its members, at most the member's
        ``k - 1`` widest to the others of ``gpus``, counted at both ends (as
        :class:`~gpualloc.placement.policies.mapa.LossSearch` bounds the same loss)."""
        nv, k = self.ctx.host.nvlink_bandwidth, self.k
        least = []
        forced = 0.0
        for g in gpus:
            widest = sorted((nv[g][h] for h in gpus if h != g), reverse=True)[: k - 1]
            removes = self.degree[g] - sum(widest) / 2
            if g in self.required:
                forced += removes
            else:
                least.append(removes)
        least.sort()
        lost = forced + sum(least[: k - len(self.required)])
        return round(self.total_free_gbps - lost, 6)

    def _lowest_set(self, gpus: tuple[int, ...]) -> tuple[int, ...]:
        required = sorted(self.required)
        others = [g for g in gpus if g not in self.required]
        return tuple(sorted(required + others[: self.k - len(required)]))

    # ---- the policy's own search, restricted -------------------------------------------------

    def _lowest_tied(self, gpus: tuple[int, ...]) -> TieKey | None:
        """The policy's answer among ``gpus`` alone, if it ties with its answer over all the
        GPUs (its tie key, noted as a candidate), else None."""
        if set(self.answered.gpus) <= set(gpus):
            return self.answered
        bound = self.policy.key_bound(self.ctx, gpus)
        if bound is not None and _below(bound, self.key):
            return None
        if len(gpus) == self.k and self.policy.keys_sets_alone:
            return self._tied_set(gpus)
        placement = self._within(gpus)
        if placement is None:
            return None
        if not ties(self.key, self.policy.set_key(self.ctx, placement.gpus)):
            return None
        standing = tie_key(self.ctx, placement.gpus)
        if standing.gpus not in self.placements:
            self.placements[standing.gpus] = placement
            self.seen.append(standing)
        if standing.rank() < self.best.rank():
            self.best = standing
        return standing

    def _tied_set(self, gpus: tuple[int, ...]) -> TieKey | None:
        """One set, for a policy whose key reads the set alone: its key, no search (the
        placement, ordered, is searched for only if it wins)."""
        if not ties(self.key, self.policy.set_key(self.ctx, gpus)):
            return None
        standing = tie_key(self.ctx, gpus)
        if standing.gpus not in self.placements and standing.gpus not in self.keyed:
            self.keyed.add(standing.gpus)
            self.seen.append(standing)
        if standing.rank() < self.best.rank():
            self.best = standing
        return standing

    def _within(self, gpus: tuple[int, ...]) -> Placement | None:
        chosen = tuple(sorted(gpus))
        known = self.placements.get(chosen) if len(chosen) == self.k else None
        if known is not None:
            return known
        if self.searches >= MAX_SEARCHES:
            self._limit(f"stopped after {MAX_SEARCHES} searches")
            return None
        deadline.current().check()
        self.searches += 1
        return self._search(chosen)

    def _search(self, chosen: tuple[int, ...]) -> Placement:
        """The policy's own search with every GPU of the pool but ``chosen`` excluded (still
        free: the scores read the free GPUs)."""
        ctx = self.ctx
        outside = frozenset(ctx.pool) - frozenset(chosen)
        request = structs.replace(ctx.request, excluded=ctx.request.excluded | outside)
        narrowed = DecisionContext(
            topology=ctx.topology,
            request=request,
            state=ctx.state,
            effective_model=ctx.effective_model,
            weights=ctx.weights,
        )
        return self.policy.search(narrowed)

    def _placed(self, gpus: tuple[int, ...]) -> Placement:
        """The policy's placement of exactly ``gpus``, ordered as it orders sets: the winner
        the rule knew by its key alone (outside the decision's budget: one set's order)."""
        with deadline.within(None):
            return self._search(gpus)

    def _limit(self, what: str) -> None:
        if what not in self.limits:
            self.limits.append(what)

    # ---- the answer --------------------------------------------------------------------------

    def answer(self) -> Placement:
        placement = self.placements.get(self.best.gpus) or self._placed(self.best.gpus)
        others = [s for s in self.seen if s.gpus != self.best.gpus]
        decided = decided_by(self.best, min(others, key=TieKey.rank)) if others else None
        notes = placement.notes
        if self.limits:
            notes = (
                *notes,
                f"tie rule incomplete ({'; '.join(self.limits)}): the best tied placement "
                "found stands",
            )
        if decided is None and notes == placement.notes:
            return placement
        return structs.replace(placement, decided_by=decided, notes=notes)


class _TooMany(Exception):
    """The ranking walk ran past :data:`MAX_RANKED_STEPS`."""


def _below(bound: SetKey, key: SetKey) -> bool:
    """Whether a key of at most ``bound`` (lexicographically) is below ``key``."""
    for b, v in zip(bound, key, strict=False):
        if b < v - _SLACK:
            return True
        if b > v + _SLACK:
            return False
    return False


def _preserved(ctx: DecisionContext, chosen: Sequence[int]) -> float:
    from gpualloc.placement.mapa.scores import preserved_gbps

    return preserved_gbps(ctx.host, ctx.state.free, chosen)


def _listed(gpus: Sequence[int]) -> str:
    return f"{count_of(len(gpus), 'GPU')} {','.join(map(str, gpus))}"
