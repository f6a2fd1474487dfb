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

from collections.abc import Sequence
from dataclasses import dataclass

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


@dataclass(frozen=True)
class UtilityWeights:
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


@dataclass(frozen=True)
class UtilityParts:
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
    """Evaluates U for sets on one host in one state; built once per decision."""

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
        self._free_in_domain = [
            sum(1 for g in members if g in state.free) for members in self.domains
        ]

    def communication_cost(self, gpus: Sequence[int]) -> float:
        """Eq. 3: the sum of shortest-path distances over the set's pairs."""
        d = self.distance
        return sum(d[a][b] for i, a in enumerate(gpus) for b in gpus[i + 1 :])

    def normalised_communication(self, gpus: Sequence[int]) -> float:
        pairs = len(gpus) * (len(gpus) - 1) // 2
        spread = self.d_max - self.d_min
        if pairs == 0 or spread <= 0:
            return 0.0
        return (self.communication_cost(gpus) - pairs * self.d_min) / (pairs * spread)

    def interference(self, gpus: Sequence[int]) -> float:
        """Eq. 4 (intent): average slowdown of the new job and the running jobs it touches."""
        host = self.host
        chosen = set(gpus)
        sockets = {host.socket[g] for g in chosen}
        switches = {host.switch_group[g] for g in chosen}
        slowdowns: list[float] = []
        own = 0.0
        for job in self.state.running:
            level = _shared_level(host, job.gpus, sockets, switches)
            if level == 0.0:
                continue
            own += level
            victim_factor = 1.0 if job.sensitive in (True, None) else 0.5
            slowdowns.append(min(1.0, level * victim_factor))
        own_factor = 1.0 if self.sensitive else 0.5
        slowdowns.append(min(1.0, own * own_factor))
        return sum(slowdowns) / len(slowdowns)

    def fragmentation(self, gpus: Sequence[int]) -> float:
        """Eq. 5 (intent): average share of a domain left stranded in a partly used domain."""
        if not self.domains:
            return 0.0
        chosen = set(gpus)
        total = 0.0
        for members, free_before in zip(self.domains, self._free_in_domain, strict=True):
            free_after = free_before - sum(1 for g in members if g in chosen)
            if 0 < free_after < len(members):
                total += free_after / len(members)
        return total / len(self.domains)

    def parts(self, gpus: Sequence[int]) -> UtilityParts:
        w = self.weights
        t = self.normalised_communication(gpus)
        interference = self.interference(gpus)
        fragmentation = self.fragmentation(gpus)
        utility = (
            w.communication * (1 - t)
            + w.interference * (1 - interference)
            + w.fragmentation * (1 - fragmentation)
        )
        return UtilityParts(t, interference, fragmentation, max(0.0, min(1.0, utility)))

    def utility(self, gpus: Sequence[int]) -> float:
        return self.parts(gpus).utility


def _domains(host: HostGraph) -> list[tuple[int, ...]]:
    """Sockets and PCIe switch trees holding at least two GPUs (duplicates dropped)."""
    groups: dict[tuple[str, int], list[int]] = {}
    for g in range(host.gpu_count):
        groups.setdefault(("socket", host.socket[g]), []).append(g)
        groups.setdefault(("switch", host.switch_group[g]), []).append(g)
    unique = {tuple(members) for members in groups.values() if len(members) >= 2}
    return sorted(unique)


def _shared_level(
    host: HostGraph, job_gpus: frozenset[int], sockets: set[int], switches: set[int]
) -> float:
    if any(host.switch_group[g] in switches for g in job_gpus):
        return SWITCH_SLOWDOWN
    if any(host.socket[g] in sockets for g in job_gpus):
        return SOCKET_SLOWDOWN
    return 0.0
