"""The best candidate set under pack's and DRB's set objectives, by branch and bound over twins.

pack (the least communication cost ``t`` of DRB's Eq. 3, then the least fragmentation, Eq. 5)
and DRB (the utility ``U`` of Eq. 2, then ``U_n``; :mod:`.utility`) score a *set*, and want the
lexicographically first set of the best key among C(n, k) candidates: 12,870 for 8 of 16 GPUs,
601 million for 16 of 32. This search returns that set without scoring them all (Amaral et al.,
SC'17, section 4.4, Algorithm 3 evaluated exactly; the branch and bound is the textbook one for
min-sum k-subsets, e.g. Land and Doig's, with the bounds below):

- **Twins.** GPUs no term can tell apart (the same distance to every other GPU, the same socket
  and PCIe switch tree: the four GPUs under one switch of a PCIe host) form a class, and a set
  takes each class's GPUs lowest first: a class of m twins offers m + 1 choices, not 2^m, and
  among sets of equal key the lowest is still the one found. Required GPUs are taken at once.
- **Lexicographic depth first.** Classes are decided in index order, each's count from the most
  down, so complete sets come in lexicographic order (where each class's GPUs are consecutive
  among the candidates, which twins are on every bundled host; otherwise a branch is only cut on
  a strictly worse bound). A branch whose bound does not beat the best set found is cut.
- **Bounds** on what the ``r`` GPUs still to come can reach: their cost is at least the ``r``
  smallest of (distance to the chosen GPUs + half the sum of the ``r - 1`` shortest distances
  to the candidates still to come), each pair among them counted from both ends; where fewer
  candidates are left to leave out (``e``) than to take, the same bound on the complement:
  ``cost(S) = cost(all) - reach(E) + cost(E)`` for the GPUs ``E`` left out, and the ``e`` still
  to leave out reach at most the ``e`` largest of (reach - distance to those left out - half
  the ``e - 1`` shortest distances), which is tight for large jobs; each domain's
  fragmentation is the least that any number of its remaining candidates can leave; the
  interference at least the slowdowns already there over the most jobs the set can still
  touch; the share of each socket left free at most that of taking the rest from the largest.

A leaf is scored by the policy's own key function, so the answer is the brute force's (the
optimality tests compare them). Complexity: exponential in the worst case; on the bundled
hosts a few hundred nodes of O(n) each (PCIe hosts: a node per switch count).
"""

from __future__ import annotations

import contextlib
import functools
import math
from bisect import insort
from collections.abc import Callable, Iterable, Sequence
from itertools import accumulate
from typing import Protocol

from gpualloc.placement import deadline

Key = tuple[float, ...]
BoundKey = Callable[[float, float, float, float], Key]
"""(least cost, least fragmentation, least interference, most system free) -> the best key."""

_SLACK = 1e-9


@functools.lru_cache(maxsize=16)
def twin_classes(
    distance: tuple[tuple[float, ...], ...], labels: tuple[object, ...]
) -> tuple[int, ...]:
    """Per GPU, the lowest GPU of its twin class: GPUs with the same label (socket and switch
    tree) and the same distance to every other GPU. Cached per host."""
    n = len(distance)
    rep = list(range(n))
    for g in range(n):
        for h in range(g):
            if rep[h] != h or labels[g] != labels[h]:
                continue
            row_g, row_h = distance[g], distance[h]
            if all(row_g[x] == row_h[x] for x in range(n) if x != g and x != h):
                rep[g] = h
                break
    return tuple(rep)


class SetTerms(Protocol):
    """What the search reads of :class:`~.utility.UtilityModel` (declared
    here: utility imports this module, so this one does not import it back)."""

    distance: tuple[tuple[float, ...], ...]
    socket_bits: tuple[int, ...]
    switch_bits: tuple[int, ...]
    domain_counts: list[tuple[int, int, int]]
    """(GPU mask, size, free GPUs) of each domain, for the fragmentation term."""
    socket_counts: list[tuple[int, int, int]]
    """(GPU mask, size, free GPUs) of each socket, for the share left free."""
    jobs: list[tuple[int, int, float]]
    """(switch mask, socket mask, victim factor) of each running job."""

    def slowdown_sum(self, sockets: int, switches: int) -> tuple[float, int]: ...


class CostOnly:
    """The terms of a search that scores the communication cost alone (DRB's t_min): no
    sockets, switch trees, domains or running jobs (the interface of
    :class:`~.utility.UtilityModel` that :class:`SetSearch` reads)."""

    def __init__(self, distance: tuple[tuple[float, ...], ...]) -> None:
        self.distance = distance
        self.socket_bits = self.switch_bits = (0,) * len(distance)
        self.domain_counts: list[tuple[int, int, int]] = []
        self.socket_counts: list[tuple[int, int, int]] = []
        self.jobs: list[tuple[int, int, float]] = []

    def slowdown_sum(self, sockets: int, switches: int) -> tuple[float, int]:
        return 0.0, 0


class _Stop(Exception):
    """The search has visited its ``max_nodes``."""


class SetSearch:
    """One search: the model's host and state, a pool, the required GPUs and k. With
    ``max_nodes``, the best set found within that many nodes (a count, so deterministic)."""

    def __init__(
        self,
        model: SetTerms,
        pool: Sequence[int],
        required: frozenset[int],
        k: int,
        exact_key: Callable[[tuple[int, ...]], Key],
        bound_key: BoundKey,
        max_nodes: float = math.inf,
        twins: tuple[int, ...] | None = None,
    ) -> None:
        self.model, self.k, self.max_nodes = model, k, max_nodes
        self.twins = twins
        """Per GPU, the lowest GPU of its twin class, where the caller knows them (the key
        reads more than the distances); else found from the distances, sockets and switches."""
        self.exact_key, self.bound_key = exact_key, bound_key
        self.required = tuple(sorted(required))
        self._classes(pool)
        self.near: list[list[list[float]]] | None = None
        """[x][y - x]: the sums of the t shortest distances (t = 0, 1, ...) from a GPU of class
        y to the other GPUs of the classes from x on, the GPUs still to come at class x (built
        when a bound first needs pairs among the GPUs to come: never for one or two GPUs)."""
        self._domain_tables()
        self._start()
        self.best: tuple[Key, tuple[int, ...]] | None = None
        self.best_chosen: tuple[int, ...] = ()
        self.nodes = 0
        self.tick = deadline.current().tick

    def _classes(self, pool: Sequence[int]) -> None:
        """The twin classes of the candidates (the pool less the required GPUs), in the order of
        their lowest GPU, and the distances between and within them."""
        model, d = self.model, self.model.distance
        rep = self.twins
        if rep is None:
            rep = twin_classes(d, tuple(zip(model.socket_bits, model.switch_bits, strict=True)))
        members: dict[int, list[int]] = {}
        for g in pool:
            if g not in self.required:
                members.setdefault(rep[g], []).append(g)
        self.classes = classes = sorted(members.values())
        self.candidates = [g for group in classes for g in group]
        self.in_order = self.candidates == sorted(self.candidates)
        """Whether each class's GPUs are consecutive among the candidates: then the walk meets
        complete sets in lexicographic order."""
        reps = [group[0] for group in classes]
        self.within = [d[group[0]][group[1]] if len(group) > 1 else 0.0 for group in classes]
        self.between = [[d[a][b] for b in reps] for a in reps]
        for x in range(len(classes)):
            self.between[x][x] = self.within[x]
        self.sizes = [len(group) for group in classes]

    def _domain_tables(self) -> None:
        """The domains (fragmentation) and sockets (system free) each class lies in, and per
        class x what the classes from x on offer: GPUs per domain, socket and switch bits."""
        model, classes, m = self.model, self.classes, len(self.classes)
        self.domains, self.sockets = model.domain_counts, model.socket_counts
        self.class_domains = [
            [i for i, (mask, _, _) in enumerate(self.domains) if mask >> group[0] & 1]
            for group in classes
        ]
        self.class_socket = [
            next((i for i, (mask, _, _) in enumerate(self.sockets) if mask >> group[0] & 1), -1)
            for group in classes
        ]
        self.suffix_domain = [[0] * len(self.domains) for _ in range(m + 1)]
        self.suffix_bits = [(0, 0)] * (m + 1)
        self.suffix_room = [0] * (m + 1)
        for x in range(m - 1, -1, -1):
            counts = list(self.suffix_domain[x + 1])
            for i in self.class_domains[x]:
                counts[i] += self.sizes[x]
            self.suffix_domain[x] = counts
            sockets, switches = self.suffix_bits[x + 1]
            g = classes[x][0]
            self.suffix_bits[x] = (sockets | model.socket_bits[g], switches | model.switch_bits[g])
            self.suffix_room[x] = self.suffix_room[x + 1] + self.sizes[x]
        largest = max((size for _, size, _ in self.sockets), default=1)
        self.per_gpu_free = 1 / (largest * len(self.sockets)) if self.sockets else 0.0

    def _start(self) -> None:
        """The state of the walk at its root: the required GPUs chosen, nothing left out."""
        d, required, m = self.model.distance, self.required, len(self.classes)
        self.counts = [0] * m
        self.to_class = [sum(d[group[0]][q] for q in required) for group in self.classes]
        self.cost = sum(d[a][b] for i, a in enumerate(required) for b in required[i + 1 :])
        self.taken_domain = [
            sum(1 for q in required if mask >> q & 1) for mask, _, _ in self.domains
        ]
        self.taken_socket = [
            sum(1 for q in required if mask >> q & 1) for mask, _, _ in self.sockets
        ]
        self.touched = (
            _or(self.model.socket_bits[q] for q in required),
            _or(self.model.switch_bits[q] for q in required),
        )
        # The complement: cost(S) = cost(all) - gain(left out), gain(E) = reach(E) - cost(E).
        everyone = (*self.candidates, *required)
        self.total_cost = sum(d[a][b] for i, a in enumerate(everyone) for b in everyone[i + 1 :])
        self.reach = [sum(d[group[0]][h] for h in everyone) for group in self.classes]
        self.to_left = [0.0] * m
        self.gain = 0.0

    def run(self) -> tuple[int, ...]:
        with contextlib.suppress(_Stop):
            self._walk(0, self.k - len(self.required))
        assert self.best is not None  # the context checked feasibility
        return self.best[1]

    # ---- the walk ----------------------------------------------------------------------------

    def _walk(self, x: int, r: int) -> None:
        self.nodes += 1
        self.tick()
        if self.nodes > self.max_nodes and self.best is not None:
            raise _Stop
        if r == 0:
            self._leaf()
            return
        if self.best is not None and self._cut(x, r):
            return
        size = self.sizes[x]
        room_after = self.suffix_room[x + 1]
        between, within = self.between[x], self.within[x]
        to_class, to_left = self.to_class, self.to_left
        m = len(to_class)
        for c in range(min(size, r), -1, -1):
            if r - c > room_after:
                break
            u = size - c  # left out
            if c:
                self.cost += c * to_class[x] + c * (c - 1) // 2 * within
                for y in range(m):
                    to_class[y] += c * between[y]
                self._count(x, c)
            if u:
                self.gain += u * (self.reach[x] - to_left[x]) - u * (u - 1) // 2 * within
                for y in range(m):
                    to_left[y] += u * between[y]
            self.counts[x] = c
            self._walk(x + 1, r - c)
            if u:
                for y in range(m):
                    to_left[y] -= u * between[y]
                self.gain -= u * (self.reach[x] - to_left[x]) - u * (u - 1) // 2 * within
            if c:
                self._count(x, -c)
                for y in range(m):
                    to_class[y] -= c * between[y]
                self.cost -= c * to_class[x] + c * (c - 1) // 2 * within
        self.counts[x] = 0

    def _count(self, x: int, c: int) -> None:
        for i in self.class_domains[x]:
            self.taken_domain[i] += c
        s = self.class_socket[x]
        if s >= 0:
            self.taken_socket[s] += c

    def _chosen(self) -> tuple[int, ...]:
        """The candidates chosen so far, lowest of each class first."""
        picked = []
        for group, c in zip(self.classes, self.counts, strict=False):
            picked += group[:c]
        return tuple(picked)

    def _leaf(self) -> None:
        chosen = self._chosen()
        gpus = tuple(sorted((*self.required, *chosen)))
        key = self.exact_key(gpus)
        best = self.best
        # Sets that hold the same required GPUs compare as their other GPUs do.
        if best is None or key > best[0] or (key == best[0] and gpus < best[1]):
            self.best = (key, gpus)
            self.best_chosen = chosen

    def _cut(self, x: int, r: int) -> bool:
        """Whether no completion of the branch beats the best set found."""
        assert self.best is not None
        bound = self.bound_key(
            self._least_cost(x, r) - _SLACK,
            self._least_fragmentation(x, r) - _SLACK,
            self._least_interference(x) - _SLACK,
            self._most_free(r) + _SLACK,
        )
        best_key = self.best[0]
        if bound < best_key:
            return True
        if bound > best_key or not self.in_order:
            return False
        # Equal: cut when every set of the branch comes after the best one. The branch has
        # decided the candidates below class x's first GPU; its sets come after the best one
        # when the lowest of those it decided otherwise is one the best set holds.
        bound_gpu = self.classes[x][0]
        mine = set(self._chosen())
        theirs = {g for g in self.best_chosen if g < bound_gpu}
        differ = mine ^ theirs
        return bool(differ) and min(differ) in theirs

    def _least_cost(self, x: int, r: int) -> float:
        """A lower bound on the cost of any completion: from the GPUs to come (when fewer are
        to come than to be left out), else from the complement."""
        sizes = self.sizes
        e = self.suffix_room[x] - r
        if min(r, e) < 2:
            near = [[0.0, 0.0]] * (len(sizes) - x)  # no pair among them: no table needed
        else:
            if self.near is None:
                self.near = self._nearest_sums()
            near = self.near[x]
        if r <= e:
            to_class = self.to_class
            offers = []
            for y in range(x, len(sizes)):
                offers += [to_class[y] + near[y - x][r - 1] / 2] * min(sizes[y], r)
            offers.sort()
            return self.cost + sum(offers[:r])
        # The e candidates still to leave out gain at most the e largest of (their reach less
        # their distance to those left out, less half their e - 1 nearest candidates).
        to_left, reach = self.to_left, self.reach
        gains = []
        for y in range(x, len(sizes)):
            gains += [reach[y] - to_left[y] - near[y - x][e - 1] / 2] * min(sizes[y], e)
        gains.sort(reverse=True)
        return self.total_cost - self.gain - sum(gains[:e])

    def _nearest_sums(self) -> list[list[list[float]]]:
        """The table of ``near``: per class y, its distances to the classes after it, then to
        each class before it down to x, kept sorted."""
        sizes, m = self.sizes, len(self.sizes)
        table: list[list[list[float]]] = [[[] for _ in range(m - x)] for x in range(m)]
        for y in range(m):
            row = self.between[y]
            running = sorted(
                value for z in range(y, m) for value in [row[z]] * (sizes[z] - (z == y))
            )
            table[y][0] = list(accumulate(running, initial=0.0))
            for x in range(y - 1, -1, -1):
                for _ in range(sizes[x]):
                    insort(running, row[x])
                table[x][y - x] = list(accumulate(running, initial=0.0))
        return table

    def _least_fragmentation(self, x: int, r: int) -> float:
        if not self.domains:
            return 0.0
        total = 0.0
        remaining = self.suffix_domain[x]
        for i, (_, size, free_before) in enumerate(self.domains):
            high = free_before - self.taken_domain[i]
            low = high - min(r, remaining[i])
            if low > 0 and high < size:
                total += low / size
        return total / len(self.domains)

    def _least_interference(self, x: int) -> float:
        model = self.model
        if not model.jobs:
            return 0.0
        sockets, switches = self._touched_bits()
        numerator, touched = model.slowdown_sum(sockets, switches)
        reach_sockets, reach_switches = self.suffix_bits[x]
        more = 0
        for job_switches, job_sockets, _ in model.jobs:
            if not (job_switches & switches or job_sockets & sockets) and (
                job_switches & reach_switches or job_sockets & reach_sockets
            ):
                more += 1
        return numerator / (touched + 1 + more)

    def _touched_bits(self) -> tuple[int, int]:
        sockets, switches = self.touched
        socket_bit, switch_bit = self.model.socket_bits, self.model.switch_bits
        for group, c in zip(self.classes, self.counts, strict=False):
            if c:
                sockets |= socket_bit[group[0]]
                switches |= switch_bit[group[0]]
        return sockets, switches

    def _most_free(self, r: int) -> float:
        if not self.sockets:
            return 0.0
        shares = 0.0
        for i, (_, size, free_before) in enumerate(self.sockets):
            shares += (free_before - self.taken_socket[i]) / size
        return shares / len(self.sockets) - r * self.per_gpu_free


def _or(bits: Iterable[int]) -> int:
    mask = 0
    for bit in bits:
        mask |= bit
    return mask


@functools.lru_cache(maxsize=64)
def cheapest_communication(distance: tuple[tuple[float, ...], ...], size: int) -> float:
    """t_min(k): the lowest communication cost (Eq. 3) of any ``size`` GPUs of the host.

    Exact, by this branch and bound on the cost alone
    (twins taken lowest first, bounds from the GPUs to come or from those left out). Cached per
    host and size.

    The search visits at most :data:`T_MIN_NODES` nodes; beyond that it returns the cheapest set
    found, an upper bound on t_min that is deterministic (a count, not a clock), so a score is
    the same wherever it is computed. Every bundled host stays exact
    (``tests/test_placement_budget.py``)."""
    n = len(distance)
    if size < 2 or size > n:
        return 0.0

    def cost_of(gpus: tuple[int, ...]) -> tuple[float]:
        return (-sum(distance[a][b] for i, a in enumerate(gpus) for b in gpus[i + 1 :]),)

    search = SetSearch(
        CostOnly(distance), range(n), frozenset(), size, cost_of,
        lambda cost, _fragmentation, _interference, _free: (-cost,),
        max_nodes=T_MIN_NODES,
    )  # fmt: skip
    return -cost_of(search.run())[0]


T_MIN_NODES = 4096
"""How many nodes :func:`cheapest_communication` visits at most."""
