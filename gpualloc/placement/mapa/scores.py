"""Bandwidth scores of a placement: pure functions, GB/s (10^9 bytes/s, one direction).

- **Aggregated bandwidth** (MAPA, seed 003, section 3.4.1, Eq. 1): the sum of the bandwidths of the
  links that carry the pattern's edges in the chosen order. A pair listed twice in the pattern
  (the 2-GPU ring) counts twice.
- **Preserved bandwidth** (MAPA section 3.5.1, Eq. 3): the NVLink bandwidth among the GPUs that
  stay free after the placement, i.e. what is left for the next bandwidth-sensitive job.
- **Predicted effective bandwidth** (MAPA section 3.4.3, Eq. 2, Table 2): a polynomial in x, y, z,
  the numbers of double-NVLink, single-NVLink and PCIe links among the pattern's edges in the
  chosen order. Two properties of the published model matter, and gpualloc documents rather than
  hides them:

  * it was fitted on 31 allocations of 2 to 5 GPUs of one DGX-1 V100, and it is **non-monotone**
    away from them: ``(0, 2, 1)`` (two NVLinks and a PCIe link) scores 9.03 GB/s, below the 11.29
    of ``(0, 0, 3)`` (three PCIe links), and the best 5-GPU ring by this model (53.61 GB/s) is not
    the ring of the highest aggregated bandwidth (53.51 GB/s);
  * it scores an empty allocation ``(0, 0, 0)`` at 12.335 GB/s. MAPA's reference code starts its
    search from that empty allocation and keeps a candidate only if it scores strictly higher, so
    a sensitive job whose best option scores at most 12.335 was silently *not placed*. gpualloc
    never refuses a placement because of a score: the best feasible set is always returned.

- **Edge-bottleneck effective bandwidth** (gpualloc's general estimate, used where Table 2 does
  not apply: NV3..NV18 bonds, NVSwitch fabrics, PCIe-only hosts): the bandwidth of the slowest
  link among the pattern's edges in the chosen order. NCCL's ring all-reduce moves every byte
  over every ring link in lock step, so its bus bandwidth is bounded by the slowest link of the
  ring (NCCL's own performance notes, "busBw"); the same holds for each hop of a tree. It is
  monotone: a faster link never lowers it.
- **Bottleneck bandwidth** (the Kubernetes GPU-topology proposal, seed 001): the lowest bandwidth
  between any two GPUs of the set, regardless of the pattern.

Complexity: every function is O(edges) or O(k^2) on lists precomputed by
:class:`~gpualloc.placement.host_graph.HostGraph`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from enum import Enum

from gpualloc.model.request import CommunicationPattern
from gpualloc.placement.host_graph import DOUBLE_NVLINK, PCIE, SINGLE_NVLINK, HostGraph

MAPA_TABLE2_COEFFICIENTS: tuple[float, ...] = (
    16.39670455,
    4.536821878,
    1.55623404,
    -20.69484581,
    -9.467461958,
    7.615106783,
    -7.973335727,
    12.73323772,
    -4.195655221,
    -8.413419363,
    62.85125807,
    27.41832588,
    -5.114108079,
    -46.97390071,
)
"""theta_1..theta_14 of MAPA Table 2, at the precision of the reference code (socal-ucr/MAPA
``src/Props.hh`` ``getPredictedBW``; ``shared/reference/mapa_effbw_model.json``)."""

MAPA_EMPTY_ALLOCATION_GBPS = 12.33506
"""Table 2's value at x = y = z = 0: the hidden threshold of the reference code (see above)."""


class EffectiveModel(str, Enum):
    """Which estimate ``effective_gbps`` uses; ``auto`` picks Table 2 where it fits the host."""

    AUTO = "auto"
    MAPA = "mapa"
    BOTTLENECK = "bottleneck"


def mapa_predicted_gbps(x: int, y: int, z: int) -> float:
    """MAPA Eq. 2: predicted effective bandwidth of x double-, y single-NVLink, z PCIe edges."""
    t = MAPA_TABLE2_COEFFICIENTS
    return (
        t[0] * x
        + t[1] * y
        + t[2] * z
        + t[3] / (x + 1)
        + t[4] / (y + 1)
        + t[5] / (z + 1)
        + t[6] * x * y
        + t[7] * y * z
        + t[8] * z * x
        + t[9] / (x * y + 1)
        + t[10] / (y * z + 1)
        + t[11] / (z * x + 1)
        + t[12] * x * y * z
        + t[13] / (x * y * z + 1)
    )


MAPA_FITTED_EDGES = range(2, 6)
"""The pattern edges of the allocations Table 2 was fitted on: rings of 2 to 5 GPUs of one
DGX-1 V100 (section 3.4.3: "2, 3, 4, and 5-GPU allocations", 31 samples; a 2-GPU ring counts its
pair twice). Outside it the polynomial is extrapolated and predicts what no link can carry:
(1, 0, 5) scores -3.31 GB/s for 6 edges, (3, 2, 2) -16.2 for 7, (4, 2, 2) -43.3 for 8, and an
8-GPU all-to-all of 28 edges -3434. There every model, ``mapa`` asked for by name included, gives
way to the slowest pattern link, which holds for any pattern (see the module docstring)."""


def resolve_model(
    host: HostGraph, requested: EffectiveModel, edges: int | None = None
) -> EffectiveModel:
    """The model a pattern of ``edges`` edges (None: any) is scored by: Table 2 where asked
    for, or under ``auto`` on hosts whose links are the DGX-1 classes, and only for the edge
    counts it was fitted on (:data:`MAPA_FITTED_EDGES`); else the slowest pattern link."""
    if edges is not None and edges not in MAPA_FITTED_EDGES:
        return EffectiveModel.BOTTLENECK
    if requested is not EffectiveModel.AUTO:
        return requested
    return EffectiveModel.MAPA if host.published_model_fits else EffectiveModel.BOTTLENECK


def outside_fitted_range(host: HostGraph, requested: EffectiveModel, edges: int) -> str | None:
    """Why a pattern that Table 2 would have scored is scored by its slowest link instead, in
    words; None where Table 2 was not in question."""
    wanted = requested is EffectiveModel.MAPA or (
        requested is EffectiveModel.AUTO and host.published_model_fits
    )
    if not wanted or edges in MAPA_FITTED_EDGES:
        return None
    return (
        f"effective bandwidth by the slowest pattern link: MAPA's Table 2 was fitted on "
        f"patterns of {MAPA_FITTED_EDGES[0]} to {MAPA_FITTED_EDGES[-1]} edges (section 3.4.3) "
        f"and this one has {edges}"
    )


def pattern_pairs(order: Sequence[int], pattern: CommunicationPattern) -> list[tuple[int, int]]:
    """The GPU pairs that carry the pattern's edges when rank ``i`` runs on ``order[i]``."""
    return [(order[u], order[v]) for u, v in pattern.edges]


def aggregated_gbps(host: HostGraph, pairs: Iterable[tuple[int, int]]) -> float:
    """MAPA Eq. 1."""
    bw = host.bandwidth
    return sum(bw[a][b] for a, b in pairs)


def mapa_counts(host: HostGraph, pairs: Iterable[tuple[int, int]]) -> tuple[int, int, int]:
    """(x, y, z) of MAPA Eq. 2 for these pattern edges."""
    counts = [0, 0, 0]
    cls = host.mapa_class
    for a, b in pairs:
        counts[cls[a][b]] += 1
    return counts[DOUBLE_NVLINK], counts[SINGLE_NVLINK], counts[PCIE]


def effective_gbps(
    host: HostGraph, pairs: Sequence[tuple[int, int]], model: EffectiveModel
) -> float | None:
    """Predicted effective bandwidth of these pattern edges; ``None`` when there is no edge."""
    if not pairs:
        return None
    if resolve_model(host, model, len(pairs)) is EffectiveModel.MAPA:
        return mapa_predicted_gbps(*mapa_counts(host, pairs))
    bw = host.bandwidth
    return min(bw[a][b] for a, b in pairs)


def preserved_gbps(host: HostGraph, free: Iterable[int], chosen: Iterable[int]) -> float:
    """MAPA Eq. 3: NVLink bandwidth among the free GPUs that the placement leaves free."""
    left = sorted(set(free) - set(chosen))
    nv = host.nvlink_bandwidth
    return sum(nv[a][b] for i, a in enumerate(left) for b in left[i + 1 :])


def bottleneck_gbps(host: HostGraph, gpus: Sequence[int]) -> float | None:
    """Seed 001: the lowest pairwise bandwidth in the set; ``None`` for a single GPU."""
    if len(gpus) < 2:
        return None
    bw = host.bandwidth
    return min(bw[a][b] for i, a in enumerate(gpus) for b in gpus[i + 1 :])
