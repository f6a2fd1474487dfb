"""Edge objectives: what the exact search maximises, as a function of the links that carry a
pattern's edges (MAPA, Ranganath et al. SC'21, Eq. 1 and 2 with Table 2).

- :class:`AggregatedObjective`: the aggregated bandwidth (MAPA Greedy, Eq. 1).
- :class:`MapaObjective`: the predicted effective bandwidth (Eq. 2, Table 2), then the
  aggregated one (MAPA Preserve for a sensitive job).
- :class:`BottleneckObjective`: the slowest pattern link, then the aggregated bandwidth (the
  general effective estimate off the DGX-1's link classes).

A key is a tuple compared lexicographically, higher is better. :func:`evaluate_order` scores one
ordered placement in O(edges): the brute-force reference the tests hold the search to.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gpualloc.model.request import CommunicationPattern
from gpualloc.placement.host_graph import HostGraph
from gpualloc.placement.mapa.scores import (
    EffectiveModel,
    aggregated_gbps,
    mapa_counts,
    mapa_predicted_gbps,
    pattern_pairs,
)

Key = tuple[float, ...]
WEIGHT_SLACK = 1e-6
"""Weights summed in different orders differ in the last bits; bounds compare with this slack."""


def rounded(value: float) -> float:
    """Keys are rounded to 1e-6 so that the same links summed in another order tie exactly."""
    return round(value, 6)


class EdgeObjective:
    """What a search maximises, as a function of the pattern edges' link classes."""

    name = "aggregated"

    def key(self, agg: float, x: int, y: int, z: int, low: float) -> Key:
        return (rounded(agg),)

    def describe(self) -> str:
        return "max aggregated bandwidth (MAPA Eq. 1)"


class AggregatedObjective(EdgeObjective):
    name = "aggregated"


class MapaObjective(EdgeObjective):
    """Table 2 first, aggregated bandwidth second (MAPA Algorithm 1, with a tie-break)."""

    name = "mapa"

    def key(self, agg: float, x: int, y: int, z: int, low: float) -> Key:
        return (rounded(mapa_predicted_gbps(x, y, z)), rounded(agg))

    def describe(self) -> str:
        return "max predicted effective bandwidth (MAPA Eq. 2, Table 2), then aggregated"


class BottleneckObjective(EdgeObjective):
    """Slowest pattern link first, aggregated bandwidth second."""

    name = "bottleneck"

    def key(self, agg: float, x: int, y: int, z: int, low: float) -> Key:
        return (rounded(low if low < math.inf else 0.0), rounded(agg))

    def describe(self) -> str:
        return "max slowest pattern link (edge-bottleneck effective bandwidth), then aggregated"


def effective_objective(model: EffectiveModel) -> EdgeObjective:
    """The objective of a sensitive job under a resolved effective-bandwidth model."""
    return MapaObjective() if model is EffectiveModel.MAPA else BottleneckObjective()


def evaluate_order(
    host: HostGraph, pattern: CommunicationPattern, objective: EdgeObjective, order: Sequence[int]
) -> Key:
    """The objective's key of one ordered placement (the brute-force reference)."""
    pairs = pattern_pairs(order, pattern)
    low = min((host.bandwidth[a][b] for a, b in pairs), default=math.inf)
    return objective.key(aggregated_gbps(host, pairs), *mapa_counts(host, pairs), low)
