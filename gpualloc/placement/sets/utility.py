"""DRB's utility of a GPU set (Amaral et al., SC'17, seed 000, sections 4.3 and 4.4), on the
paper's scale.

The paper scores a candidate with the convex utility of Eq. 2,

    U = a_cc (1/t) + a_b (1/I) + a_d (1/w),   a_cc + a_b + a_d = 1 (1/3 each in section 5.1),

each term the inverse of a cost in units of its best value, so every term and U lie in [0, 1]
and a job's minimum utility (TOPO-AWARE-P's postponement threshold, section 4.4; Table 1 gives
0.3 for 1-GPU and 0.5 for 2-GPU jobs) means what it meant in the paper and its reference
simulator (HiEST/gpu-topo-aware, ``shared/reference/drb_topologies.json``):

- **Communication, 1/t** (Eq. 3): ``t`` is the sum over the set's pairs of the shortest-path
  distance in the physical graph of Fig. 7 (section 4.1.2: GPUs below PCIe switches, edge weight
  1; switches below sockets, 20; sockets below the host, 40; NVLink edges join GPUs directly,
  weight 1 for the host's widest bond, ``max_links / links`` for narrower ones). The term is
  ``t_min(k) / t``, ``t_min(k)`` the cheapest k-set of the host: the reference code's
  MIN_COMM_COST (on its Minsky: 1 for two GPUs, 41 for three). An NVLinked pair scores 1, a
  pair across Minsky's sockets 1/122.
- **Interference, 1/I** (Eq. 4): ``I`` the average slowdown factor (co-located over solo run
  time) of the new job and the running jobs that share a socket or a PCIe switch tree with it,
  so the term is the average of solo over co-located time, 1 without interference. Without
  measured profiles a job's slowdown is the sum over the other jobs it shares a domain with of
  ``SWITCH_SLOWDOWN`` (a shared PCIe switch) or ``SOCKET_SLOWDOWN`` (a shared socket only),
  halved for a bandwidth-insensitive victim, capped at 1. (The reference code inverted it:
  there, less slowdown scored lower.)
- **System fragmentation, w** (Eq. 5): the average over sockets of the share of their GPUs left
  free by the placement. On one host it depends only on how many GPUs the job takes, which is
  what makes the threshold bite as the host fills: a 2-GPU job that would take the last two GPUs
  of Minsky across its sockets scores about 0.3 and waits for an NVLinked pair, as Job 3 does
  in the paper's prototype (section 5.2.2).

Among candidate sets of one job (the same ``w``), the paper's utility is decided by
communication and interference; ties go to the higher **normalised** utility, gpualloc's
placement-sensitive reading of the same three costs:

    U_n = a_t (1 - t_n) + a_I (1 - I_n) + a_w (1 - w_n)

with ``t_n = (t - P d_min) / (P (d_max - d_min))`` over the ``P = k(k-1)/2`` pairs, ``I_n`` the
average slowdown above, and ``w_n`` the average over domains (sockets and PCIe switch trees with
at least two GPUs) of the share of the domain left free, counted only for domains the placement
leaves *partly* used: taking GPUs from an already-broken domain lowers it, breaking a whole one
raises it ("map GPUs from the most fragmented domains"; the reference code's term did not depend
on the placement on one machine).

Complexity: O(n^3) once per host for the distances (Floyd-Warshall, n <= 32 in practice) and
the branch and bound of :mod:`.search` once per host and job size for
``t_min`` (at most :data:`~.search.T_MIN_NODES` nodes); then O(k^2 + n) per set scored.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from msgspec import Struct

from gpualloc.model.paths import PciePath
from gpualloc.model.request import HostState, RunningJob
from gpualloc.placement.host_graph import HostGraph
from gpualloc.placement.sets.search import cheapest_communication

SWITCH_EDGE, SOCKET_EDGE, HOST_EDGE = 1.0, 20.0, 40.0
"""Edge weights of the physical graph per level (Fig. 7: 1 right above the GPUs, 20 above)."""

SWITCH_SLOWDOWN = 0.20
SOCKET_SLOWDOWN = 0.08
"""Default co-location slowdowns, of the order DRB's Minsky profiles show for small batches
(``shared/reference/drb_profiles.json``: AlexNet batch 1 runs 8 % slower beside another job)."""

_PATH_DISTANCE = {
    PciePath.BOARD: 2 * SWITCH_EDGE,
    PciePath.PIX: 2 * SWITCH_EDGE,
    PciePath.PXB: 4 * SWITCH_EDGE,
    PciePath.PHB: 2 * (SWITCH_EDGE + SOCKET_EDGE),
    PciePath.NODE: 2 * (SWITCH_EDGE + SOCKET_EDGE) + 2 * SWITCH_EDGE,
    PciePath.SYS: 2 * (SWITCH_EDGE + SOCKET_EDGE + HOST_EDGE),
}


class UtilityWeights(Struct, frozen=True):
    """alpha_cc, alpha_b, alpha_d of Eq. 1/2; normalised to sum to 1."""

    communication: float = 1 / 3
    interference: float = 1 / 3
    fragmentation: float = 1 / 3

    def normalised(self) -> UtilityWeights:
        total = self.communication + self.interference + self.fragmentation
        if total <= 0 or min(self.communication, self.interference, self.fragmentation) < 0:
            raise ValueError("utility weights must be non-negative and not all zero")
        return UtilityWeights(
            self.communication / total, self.interference / total, self.fragmentation / total
        )


class UtilityParts(Struct, frozen=True):
    """A set's costs and utilities (see the module docstring)."""

    communication_cost: float
    """t_n: 0 for the host's closest pairs, 1 for its farthest."""
    interference: float
    """I_n: the average slowdown, 0 without interference."""
    fragmentation: float
    """w_n: the share of partly used domains left stranded."""
    utility: float
    """U of Eq. 2, the paper's scale: what a minimum utility is compared with."""
    normalised: float
    """U_n, which breaks the paper's ties between sets."""
    system_free: float
    """w of Eq. 5: the average share of each socket left free."""


@functools.lru_cache(maxsize=8)
def physical_distances(host: HostGraph) -> tuple[tuple[float, ...], ...]:
    """Shortest-path distances between GPUs in DRB's physical graph (section 4.1.2)."""
    n = host.gpu_count
    dist = [[0.0] * n for _ in range(n)]
    for a in range(n):
        for b in range(n):
            if a == b:
                continue
            path = host.pcie[a][b]
            d = _PATH_DISTANCE[path] if path is not None else _PATH_DISTANCE[PciePath.SYS]
            links = host.nvlinks[a][b]
            if links:
                d = min(d, SWITCH_EDGE * host.max_nvlinks / links)
            dist[a][b] = d
    for k in range(n):
        row_k = dist[k]
        for a in range(n):
            row_a = dist[a]
            via = row_a[k]
            for b in range(n):
                if via + row_k[b] < row_a[b]:
                    row_a[b] = via + row_k[b]
    return tuple(tuple(row) for row in dist)


class UtilityModel:
    """Evaluates U for sets on one host in one state; built once per decision.

    Sets are handled as bitmasks inside (of GPUs, of sockets touched, of PCIe switch trees
    touched). :meth:`set_key` is DRB's key of a set, which :meth:`best_set` ranks candidates by
    and the set search (:mod:`.search`) scores its leaves with, bounding
    the rest by :meth:`bound_key`; :meth:`parts` and :meth:`utility` use the same arithmetic.
    """

    def __init__(
        self,
        host: HostGraph,
        state: HostState,
        sensitive: bool,
        weights: UtilityWeights | None = None,
    ) -> None:
        self.host = host
        self.state = state
        self.sensitive = sensitive
        self.weights = (weights or UtilityWeights()).normalised()
        facts = _host_facts(host)
        self.distance, self.d_min, self.d_max = facts.distance, facts.d_min, facts.d_max
        self.domains, self.socket_bits, self.switch_bits = (
            facts.domains,
            facts.socket_bits,
            facts.switch_bits,
        )
        self.domain_counts = [
            (mask, len(members), sum(1 for g in members if g in state.free))
            for members, mask in zip(self.domains, facts.domain_masks, strict=True)
        ]
        self.touches = facts.touches
        self.jobs = _job_terms(state.running, self.touches, self.switch_bits, self.socket_bits)
        self._own_factor = 1.0 if sensitive else 0.5
        self._cheapest: dict[int, float] = {}
        self.socket_counts = [
            (mask, len(members), sum(1 for g in members if g in state.free))
            for members, mask in facts.sockets
        ]

    # ---- the three terms, per set ----------------------------------------------------------

    def communication_cost(self, gpus: Sequence[int]) -> float:
        """Eq. 3: the sum of shortest-path distances over the set's pairs."""
        d = self.distance
        return sum(d[a][b] for i, a in enumerate(gpus) for b in gpus[i + 1 :])

    def interference(self, gpus: Sequence[int]) -> float:
        """Eq. 4 (intent): average slowdown of the new job and the running jobs it touches
        (a shared PCIe switch tree slows by ``SWITCH_SLOWDOWN``, a shared socket by
        ``SOCKET_SLOWDOWN``; an insensitive job suffers half)."""
        return self._interference(
            _or(self.socket_bits[g] for g in gpus), _or(self.switch_bits[g] for g in gpus)
        )

    def fragmentation(self, gpus: Sequence[int]) -> float:
        """Eq. 5 (intent): average share of a domain left stranded in a partly used domain."""
        return self._fragmentation(_or(1 << g for g in gpus))

    def parts(self, gpus: Sequence[int]) -> UtilityParts:
        cost = self.communication_cost(gpus)
        t = self._normalised(cost, len(gpus))
        interference = self.interference(gpus)
        mask = _or(1 << g for g in gpus)
        fragmentation = self._fragmentation(mask)
        free = self._system_free(mask)
        return UtilityParts(
            communication_cost=t,
            interference=interference,
            fragmentation=fragmentation,
            utility=self._published(cost, len(gpus), interference, free),
            normalised=self._combine(t, interference, fragmentation),
            system_free=free,
        )

    def utility(self, gpus: Sequence[int]) -> float:
        return self.parts(gpus).utility

    # ---- the best set ------------------------------------------------------------------------

    def best_set(self, candidates: Iterable[tuple[int, ...]]) -> tuple[int, ...]:
        """The first of ``candidates`` (sorted sets) of highest utility, then highest normalised
        utility, each rounded to 1e-6: the answer of scoring each with :meth:`parts`, with
        less work: a set's communication cost and masks extend the memoised ones of its prefix
        by one GPU."""
        d, socket_bit, switch_bit = self.distance, self.socket_bits, self.switch_bits
        # prefix -> (communication cost, GPU mask, socket mask, switch mask)
        prefixes: dict[tuple[int, ...], tuple[float, int, int, int]] = {(): (0.0, 0, 0, 0)}

        def state(gpus: tuple[int, ...]) -> tuple[float, int, int, int]:
            known = prefixes.get(gpus)
            if known is None:
                head, last = gpus[:-1], gpus[-1]
                cost, mask, sockets, switches = state(head)
                row = d[last]
                known = (
                    cost + sum(row[x] for x in head),
                    mask | 1 << last,
                    sockets | socket_bit[last],
                    switches | switch_bit[last],
                )
                prefixes[gpus] = known
            return known

        best: tuple[int, ...] | None = None
        best_key = (-1.0, -1.0)
        for gpus in candidates:
            key = self._key(len(gpus), *state(gpus))
            if key > best_key:
                best_key, best = key, gpus
        if best is None:
            raise ValueError("no candidate set")
        return best

    def set_key(self, gpus: Sequence[int]) -> tuple[float, float]:
        """The key :meth:`best_set` ranks the sorted set ``gpus`` by: (U, U_n), rounded."""
        d = self.distance
        cost, mask, sockets, switches = 0.0, 0, 0, 0
        for i, g in enumerate(gpus):
            row = d[g]
            cost = cost + sum(row[x] for x in gpus[:i])
            mask |= 1 << g
            sockets |= self.socket_bits[g]
            switches |= self.switch_bits[g]
        return self._key(len(gpus), cost, mask, sockets, switches)

    def bound_key(self, size: int, cost: float, fragmentation: float, interference: float,
                  free: float) -> tuple[float, float]:  # fmt: skip
        """The key of a set of ``size`` GPUs with these costs and share free: monotone in each
        (the higher ``free`` and the lower the others, the higher), so bounds on them bound it."""
        return (
            round(self._published(cost, size, interference, free), 6),
            round(self._combine(self._normalised(cost, size), interference, fragmentation), 6),
        )

    def _key(
        self, size: int, cost: float, mask: int, sockets: int, switches: int
    ) -> tuple[float, float]:
        interference = self._interference(sockets, switches)
        return (
            round(self._published(cost, size, interference, self._system_free(mask)), 6),
            round(
                self._combine(
                    self._normalised(cost, size), interference, self._fragmentation(mask)
                ),
                6,
            ),
        )

    # ---- shared arithmetic -------------------------------------------------------------------

    def _normalised(self, cost: float, size: int) -> float:
        pairs = size * (size - 1) // 2
        spread = self.d_max - self.d_min
        if pairs == 0 or spread <= 0:
            return 0.0
        return (cost - pairs * self.d_min) / (pairs * spread)

    def _published(self, cost: float, size: int, interference: float, free: float) -> float:
        """Eq. 2 on the paper's scale (module docstring)."""
        best = self._cheapest.get(size)
        if best is None:
            best = self._cheapest[size] = cheapest_communication(self.distance, size)
        communication = 1.0 if size < 2 or cost <= best else best / cost
        w = self.weights
        return (
            w.communication * communication
            + w.interference * (1 - interference)
            + w.fragmentation * free
        )

    def _system_free(self, mask: int) -> float:
        """Eq. 5: the average over sockets of the share of their GPUs free after the set."""
        if not self.socket_counts:
            return 0.0
        shares = [
            (free_before - (mask & socket).bit_count()) / size
            for socket, size, free_before in self.socket_counts
        ]
        return sum(shares) / len(shares)

    def _interference(self, sockets: int, switches: int) -> float:
        total, touched = self.slowdown_sum(sockets, switches)
        return total / (touched + 1)

    def slowdown_sum(self, sockets: int, switches: int) -> tuple[float, int]:
        """The slowdowns of Eq. 4 summed (the running jobs touched, then the new job), and how
        many running jobs a set touching ``sockets`` and ``switches`` touches."""
        return _slowdown_sum(self.jobs, self._own_factor, sockets, switches)

    def _fragmentation(self, mask: int) -> float:
        if not self.domain_counts:
            return 0.0
        total = 0.0
        for domain, size, free_before in self.domain_counts:
            free_after = free_before - (mask & domain).bit_count()
            if 0 < free_after < size:
                total += free_after / size
        return total / len(self.domain_counts)

    def _combine(self, t: float, interference: float, fragmentation: float) -> float:
        w = self.weights
        utility = (
            w.communication * (1 - t)
            + w.interference * (1 - interference)
            + w.fragmentation * (1 - fragmentation)
        )
        return max(0.0, min(1.0, utility))


class SetUtility:
    """The utility (Eq. 2) of one set of GPUs on one host with the same GPUs free, beside
    whichever jobs run: its communication cost and the share of each socket it leaves free read
    the set and the free GPUs alone, so only the interference is left to read the jobs. What
    :meth:`UtilityModel.utility` gives, by the same arithmetic (a choice remembered by the
    free GPUs is scored again for the jobs running: ``tests/test_remembered_choices.py``)."""

    __slots__ = ("cost", "free", "model", "size", "sockets", "switches")

    def __init__(self, model: UtilityModel, gpus: Sequence[int]) -> None:
        self.model = model
        self.size = len(gpus)
        self.cost = model.communication_cost(gpus)
        self.free = model._system_free(_or(1 << g for g in gpus))
        self.sockets = _or(model.socket_bits[g] for g in gpus)
        self.switches = _or(model.switch_bits[g] for g in gpus)

    def utility(self, running: Sequence[RunningJob]) -> float:
        """U of the set beside ``running`` (the free GPUs those of the model's state)."""
        model = self.model
        jobs = _job_terms(running, model.touches, model.switch_bits, model.socket_bits)
        total, touched = _slowdown_sum(jobs, model._own_factor, self.sockets, self.switches)
        return model._published(self.cost, self.size, total / (touched + 1), self.free)


def _job_terms(
    running: Iterable[RunningJob],
    touches: dict[frozenset[int], tuple[int, int]],
    switch_bits: Sequence[int],
    socket_bits: Sequence[int],
) -> list[tuple[int, int, float]]:
    """Per running job: the PCIe switch trees and sockets it touches (remembered by its GPUs in
    ``touches``, the host's), and how much of a neighbour's slowdown it suffers (an insensitive
    job half)."""
    terms = []
    for job in running:
        gpus = job.gpus
        masks = touches.get(gpus)
        if masks is None:
            if len(touches) >= _TOUCHES_KEPT:
                touches.clear()
            masks = touches[gpus] = (
                _or(switch_bits[g] for g in gpus),
                _or(socket_bits[g] for g in gpus),
            )
        terms.append((*masks, 1.0 if job.sensitive in (True, None) else 0.5))
    return terms


_TOUCHES_KEPT = 4096
"""The most GPU sets a host remembers the switch trees and sockets of."""


def _slowdown_sum(
    jobs: Iterable[tuple[int, int, float]], own_factor: float, sockets: int, switches: int
) -> tuple[float, int]:
    """:meth:`UtilityModel.slowdown_sum` for these jobs' terms (:func:`_job_terms`)."""
    slowdowns: list[float] = []
    own = 0.0
    for job_switches, job_sockets, victim_factor in jobs:
        if job_switches & switches:
            level = SWITCH_SLOWDOWN
        elif job_sockets & sockets:
            level = SOCKET_SLOWDOWN
        else:
            continue
        own += level
        slowdowns.append(min(1.0, level * victim_factor))
    slowdowns.append(min(1.0, own * own_factor))
    return sum(slowdowns), len(slowdowns) - 1


def _or(bits: Iterable[int]) -> int:
    mask = 0
    for bit in bits:
        mask |= bit
    return mask


class _HostFacts(NamedTuple):
    """What :class:`UtilityModel` reads of a host alone (the distances are O(n^3)), made once
    per host, not once per decision."""

    distance: tuple[tuple[float, ...], ...]
    d_min: float
    d_max: float
    domains: tuple[tuple[int, ...], ...]
    domain_masks: tuple[int, ...]
    socket_bits: tuple[int, ...]
    switch_bits: tuple[int, ...]
    sockets: tuple[tuple[tuple[int, ...], int], ...]
    """Each socket's GPUs and their bitmask."""
    touches: dict[frozenset[int], tuple[int, int]]
    """Running jobs' GPU sets -> the switch trees and sockets they touch, as met
    (:func:`_job_terms`)."""


@functools.lru_cache(maxsize=8)
def _host_facts(host: HostGraph) -> _HostFacts:
    distance = physical_distances(host)
    n = host.gpu_count
    off_diagonal = [distance[a][b] for a in range(n) for b in range(n) if a != b]
    domains = _domains(host)
    sockets: dict[int, list[int]] = {}
    for g in range(n):
        sockets.setdefault(host.socket[g], []).append(g)
    return _HostFacts(
        distance=distance,
        d_min=min(off_diagonal, default=0.0),
        d_max=max(off_diagonal, default=0.0),
        domains=tuple(domains),
        domain_masks=tuple(_or(1 << g for g in members) for members in domains),
        socket_bits=tuple(1 << (s + 1) for s in host.socket),  # socket -1 (unknown): bit 0
        switch_bits=tuple(1 << s for s in host.switch_group),
        sockets=tuple((tuple(m), _or(1 << g for g in m)) for m in sockets.values()),
        touches={},
    )


def _domains(host: HostGraph) -> list[tuple[int, ...]]:
    """Sockets and PCIe switch trees holding at least two GPUs (duplicates dropped)."""
    groups: dict[tuple[str, int], list[int]] = {}
    for g in range(host.gpu_count):
        groups.setdefault(("socket", host.socket[g]), []).append(g)
        groups.setdefault(("switch", host.switch_group[g]), []).append(g)
    unique = {tuple(members) for members in groups.values() if len(members) >= 2}
    return sorted(unique)
