"""DRB's utility of a GPU set (Amaral et al., SC'17, seed 000, section 4.3), normalised to [0, 1].

The paper minimises ``a_t t/t_w + a_I I/I_w + a_w w/w_w`` (Eq. 1) and scores a candidate with the
utility ``U`` of Eq. 2. gpualloc reports

    U = a_t (1 - t_n) + a_I (1 - I_n) + a_w (1 - w_n),   a_t + a_I + a_w = 1,

where each ``x_n`` is a cost normalised to [0, 1] against its worst case, as Eq. 1 prescribes, so
that 1 is the best possible set and a minimum utility (the queue's postponement threshold,
section 4.4) means the same thing on every host. The three costs, as the paper intends them:

- **Communication cost t** (Eq. 3): the sum over the set's pairs of the shortest-path distance in
  the physical graph of Fig. 7, section 4.1.2: GPUs hang below PCIe switches (edge weight 1),
  switches below sockets (weight 20), sockets below the host (weight 40); NVLink edges join GPUs
  directly (weight 1 for the host's widest bond, ``max_links / links`` for narrower ones).
  ``t_n = (t - P d_min) / (P (d_max - d_min))`` over the ``P = k(k-1)/2`` pairs.
- **Interference I** (Eq. 4): the average slowdown ``1 - solo/co-located`` of the new job and of
  the running jobs that share a socket or a PCIe switch tree with it. Without measured profiles
  (the simulator brings them, issue 6) a job's slowdown is the sum over the other jobs it shares
  a domain with of ``SWITCH_SLOWDOWN`` (shared PCIe switch) or ``SOCKET_SLOWDOWN`` (shared socket
  only), halved for a bandwidth-insensitive victim, capped at 1. The reference implementation
  scored *less* slowdown as *more* cost; here less slowdown is higher utility.
- **Fragmentation w** (Eq. 5): the average over domains (sockets and PCIe switch trees with at
  least two GPUs) of the share of the domain left free, counted only for domains the placement
  leaves *partly* used: a domain entirely free or entirely busy is not fragmented. Taking GPUs
  from an already-broken domain lowers it, breaking a whole one raises it, which is the paper's
  "map GPUs from the most fragmented domains". (The reference code's term did not depend on the
  placement on one machine.)

Complexity: O(n^3) once per host for the distances (Floyd-Warshall, n <= 16 in practice), then
O(k^2 + n) per set.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from msgspec import Struct

from gpualloc.model.paths import PciePath
from gpualloc.model.request import HostState
from gpualloc.placement.host import HostGraph

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
    communication_cost: float
    interference: float
    fragmentation: float
    utility: float


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
    touched), so that :meth:`best_set` can score the 12870 8-GPU sets of a 16-GPU host within
    DRB's decision budget; :meth:`parts` and :meth:`utility` use the same arithmetic.
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
        self.distance = physical_distances(host)
        off_diagonal = [
            self.distance[a][b]
            for a in range(host.gpu_count)
            for b in range(host.gpu_count)
            if a != b
        ]
        self.d_min = min(off_diagonal, default=0.0)
        self.d_max = max(off_diagonal, default=0.0)
        self.domains = _domains(host)
        self._socket_bit = [1 << (s + 1) for s in host.socket]  # socket -1 (unknown): bit 0
        self._switch_bit = [1 << s for s in host.switch_group]
        self._domains = [
            (_or(1 << g for g in members), len(members), sum(1 for g in members if g in state.free))
            for members in self.domains
        ]
        self._jobs = [
            (
                _or(self._switch_bit[g] for g in job.gpus),
                _or(self._socket_bit[g] for g in job.gpus),
                1.0 if job.sensitive in (True, None) else 0.5,
            )
            for job in state.running
        ]
        self._own_factor = 1.0 if sensitive else 0.5

    # ---- the three terms, per set ----------------------------------------------------------

    def communication_cost(self, gpus: Sequence[int]) -> float:
        """Eq. 3: the sum of shortest-path distances over the set's pairs."""
        d = self.distance
        return sum(d[a][b] for i, a in enumerate(gpus) for b in gpus[i + 1 :])

    def normalised_communication(self, gpus: Sequence[int]) -> float:
        return self._normalised(self.communication_cost(gpus), len(gpus))

    def interference(self, gpus: Sequence[int]) -> float:
        """Eq. 4 (intent): average slowdown of the new job and the running jobs it touches
        (a shared PCIe switch tree slows by ``SWITCH_SLOWDOWN``, a shared socket by
        ``SOCKET_SLOWDOWN``; an insensitive job suffers half)."""
        return self._interference(
            _or(self._socket_bit[g] for g in gpus), _or(self._switch_bit[g] for g in gpus)
        )

    def fragmentation(self, gpus: Sequence[int]) -> float:
        """Eq. 5 (intent): average share of a domain left stranded in a partly used domain."""
        return self._fragmentation(_or(1 << g for g in gpus))

    def parts(self, gpus: Sequence[int]) -> UtilityParts:
        t = self.normalised_communication(gpus)
        interference = self.interference(gpus)
        fragmentation = self.fragmentation(gpus)
        return UtilityParts(
            t, interference, fragmentation, self._combine(t, interference, fragmentation)
        )

    def utility(self, gpus: Sequence[int]) -> float:
        return self.parts(gpus).utility

    # ---- the best set ------------------------------------------------------------------------

    def best_set(self, candidates: Iterable[tuple[int, ...]]) -> tuple[int, ...]:
        """The first of ``candidates`` (sorted sets) of highest utility rounded to 1e-6: the
        answer of scoring each with :meth:`utility`, several times faster. A set's
        communication cost and masks extend the memoised ones of its prefix by one GPU."""
        d, socket_bit, switch_bit = self.distance, self._socket_bit, self._switch_bit
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
        best_key = -1.0
        for gpus in candidates:
            cost, mask, sockets, switches = state(gpus)
            utility = self._combine(
                self._normalised(cost, len(gpus)),
                self._interference(sockets, switches),
                self._fragmentation(mask),
            )
            key = round(utility, 6)
            if key > best_key:
                best_key, best = key, gpus
        if best is None:
            raise ValueError("no candidate set")
        return best

    # ---- shared arithmetic -------------------------------------------------------------------

    def _normalised(self, cost: float, size: int) -> float:
        pairs = size * (size - 1) // 2
        spread = self.d_max - self.d_min
        if pairs == 0 or spread <= 0:
            return 0.0
        return (cost - pairs * self.d_min) / (pairs * spread)

    def _interference(self, sockets: int, switches: int) -> float:
        slowdowns: list[float] = []
        own = 0.0
        for job_switches, job_sockets, victim_factor in self._jobs:
            if job_switches & switches:
                level = SWITCH_SLOWDOWN
            elif job_sockets & sockets:
                level = SOCKET_SLOWDOWN
            else:
                continue
            own += level
            slowdowns.append(min(1.0, level * victim_factor))
        slowdowns.append(min(1.0, own * self._own_factor))
        return sum(slowdowns) / len(slowdowns)

    def _fragmentation(self, mask: int) -> float:
        if not self._domains:
            return 0.0
        total = 0.0
        for domain, size, free_before in self._domains:
            free_after = free_before - (mask & domain).bit_count()
            if 0 < free_after < size:
                total += free_after / size
        return total / len(self._domains)

    def _combine(self, t: float, interference: float, fragmentation: float) -> float:
        w = self.weights
        utility = (
            w.communication * (1 - t)
            + w.interference * (1 - interference)
            + w.fragmentation * (1 - fragmentation)
        )
        return max(0.0, min(1.0, utility))


def _or(bits: Iterable[int]) -> int:
    mask = 0
    for bit in bits:
        mask |= bit
    return mask


def _domains(host: HostGraph) -> list[tuple[int, ...]]:
    """Sockets and PCIe switch trees holding at least two GPUs (duplicates dropped)."""
    groups: dict[tuple[str, int], list[int]] = {}
    for g in range(host.gpu_count):
        groups.setdefault(("socket", host.socket[g]), []).append(g)
        groups.setdefault(("switch", host.switch_group[g]), []).append(g)
    unique = {tuple(members) for members in groups.values() if len(members) >= 2}
    return sorted(unique)
