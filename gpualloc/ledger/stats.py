"""Counters the ledger keeps for ``gpualloc metrics`` (issue 21, point 4): placements made, how
long deciding took, how long jobs waited.

They live in the ledger itself (``Ledger.stats``) and change in the transaction that records a
lease, so every gpualloc process on the host adds to the same figures, none is lost to a race,
and they survive restarts (a Prometheus counter may only go down when the process serving it
restarts; gpualloc's restart is a new ledger, which Prometheus handles like any counter reset).
Histograms have fixed buckets, as Prometheus's cumulative ``le`` buckets need.
"""

from __future__ import annotations

from msgspec import Struct, field

DECISION_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
"""Placement decisions take milliseconds (``benchmarks/bench_placement.py``); a second is
pathological."""
WAIT_BUCKETS_S = (1.0, 10.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 4 * 3600.0, 12 * 3600.0, 86400.0)
"""From an immediate start to a day in the queue."""


class Histogram(Struct, kw_only=True, forbid_unknown_fields=True):
    """Observations in buckets: ``counts[i]`` of values <= ``bounds[i]`` but above the bound
    before it; the last count is above every bound (Prometheus's ``+Inf``)."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)
        if len(self.counts) != len(self.bounds) + 1:
            raise ValueError("a histogram needs one count per bucket and one above them")

    def observe(self, value: float) -> None:
        index = next((i for i, bound in enumerate(self.bounds) if value <= bound), -1)
        self.counts[index] += 1
        self.total += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """(``le`` label, cumulative count) per bucket, ``+Inf`` last."""
        running, rows = 0, []
        for bound, count in zip((*self.bounds, None), self.counts, strict=True):
            running += count
            rows.append(("+Inf" if bound is None else f"{bound:g}", running))
        return rows


class LedgerStats(Struct, kw_only=True, forbid_unknown_fields=True):
    """What the ledger has seen since it was created."""

    placements: dict[str, int] = field(default_factory=dict)
    """Leases made, by placement policy (``mapa``, ``mig-best-fit``, ``share-best-fit``, ...)."""
    decision_seconds: Histogram = field(
        default_factory=lambda: Histogram(bounds=DECISION_BUCKETS_S)
    )
    """How long choosing the GPUs took (the placement inside the ledger transaction)."""
    wait_seconds: Histogram = field(default_factory=lambda: Histogram(bounds=WAIT_BUCKETS_S))
    """How long each job waited in the queue before it started (0 for one that did not)."""

    def record(self, policy: str, *, decision_s: float | None, waited_s: float) -> None:
        self.placements[policy] = self.placements.get(policy, 0) + 1
        if decision_s is not None:
            self.decision_seconds.observe(decision_s)
        self.wait_seconds.observe(max(0.0, waited_s))
