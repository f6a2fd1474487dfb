"""Counters the ledger keeps for ``gpualloc metrics``: placements made, how
long deciding took, how long jobs waited; and the mix of recent requests that fragmentation-aware
placement weighs (Weng et al., "Beware of Fragmentation", USENIX ATC'23,
section 4.2: the expected fragmentation weighs each task type by its share).

They live in the ledger itself (``Ledger.stats``) and change in the transaction that records a
lease, so every gpualloc process on the host adds to the same figures, none is lost to a race,
and they survive restarts (a Prometheus counter may only go down when the process serving it
restarts; gpualloc's restart is a new ledger, which Prometheus handles like any counter reset).
Histograms have fixed buckets, as Prometheus's cumulative ``le`` buckets need.
"""

import re
from typing import Annotated

from msgspec import Meta, Struct, field

DECISION_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
"""Placement decisions take milliseconds (``benchmarks/bench_placement.py``); a second is
pathological."""
WAIT_BUCKETS_S = (1.0, 10.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 4 * 3600.0, 12 * 3600.0, 86400.0)
"""From an immediate start to a day in the queue."""
MIX_MEMORY = 200
"""The request mix forgets as it goes: each new request scales the older ones by
``1 - 1/MIX_MEMORY``, so the last ~200 requests weigh most (a request 200 back weighs 0.37)."""
MIX_MIN_REQUESTS = 20
"""Below this many (weighted) requests the host's own mix is too thin to trust, and FGD weighs
the default mix (:data:`gpualloc.placement.sharing.fragmentation.DEFAULT_MIX`)."""
MIX_KEY = r"^([1-9][0-9]*:(1|0\.[0-9]+)|mig:[0-9a-z.+-]+)$"
"""A request mix key: ``GPUS:PART`` or ``mig:PROFILE``."""
_MIX_FLOOR = 0.005
"""A task type whose weight decays below this is dropped, which keeps the record small."""


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

    request_mix: dict[
        Annotated[str, Meta(pattern=MIX_KEY)],
        Annotated[float, Meta(ge=0)],
    ] = field(default_factory=dict)
    """Recent requests by task type (``"GPUS:PART"``: ``"1:0.46"`` is a shared job asking 46 %
    of a GPU, ``"2:1"`` two whole GPUs; ``"mig:3g.20gb"`` a MIG device of that profile), as
    decayed counts (:data:`MIX_MEMORY`)."""

    def record(
        self,
        policy: str,
        *,
        decision_s: float | None,
        waited_s: float,
        task: tuple[int, float] | str | None = None,
    ) -> None:
        """Count a placement; ``task`` (GPUs, part of one GPU; or a MIG profile) adds it to the
        request mix."""
        self.placements[policy] = self.placements.get(policy, 0) + 1
        if decision_s is not None:
            self.decision_seconds.observe(decision_s)
        self.wait_seconds.observe(max(0.0, waited_s))
        if isinstance(task, str):
            self.observe_mig(task)
        elif task is not None:
            self.observe_request(*task)

    def observe_request(self, gpus: int, part: float) -> None:
        """Count a request for ``gpus`` GPUs, or for ``part`` of one (to the hundredth, and at
        least that: a job declaring a sliver of a GPU's memory counts as 1 %)."""
        self._observe(f"{gpus}:{min(1.0, max(0.01, round(part, 2))):g}")

    def observe_mig(self, profile: str) -> None:
        """Count a MIG request by its profile (one no key can hold is not counted)."""
        key = f"mig:{profile.strip().lower()}"
        if re.match(MIX_KEY, key):
            self._observe(key)

    def _observe(self, key: str) -> None:
        keep = 1 - 1 / MIX_MEMORY
        mix = {kind: weight * keep for kind, weight in self.request_mix.items()}
        mix[key] = mix.get(key, 0.0) + 1.0
        self.request_mix = {
            kind: round(weight, 6) for kind, weight in sorted(mix.items()) if weight >= _MIX_FLOOR
        }

    def recent_mix(self) -> tuple[dict[tuple[int, float], float] | None, float]:
        """(each recent task type's share, the weighted number of requests behind them); the
        shares are None below :data:`MIX_MIN_REQUESTS`."""
        counted = {k: w for k, w in self.request_mix.items() if not k.startswith("mig:")}
        total = sum(counted.values())
        if total < MIX_MIN_REQUESTS:
            return None, total
        mix: dict[tuple[int, float], float] = {}
        for key, weight in counted.items():
            gpus, _, part = key.partition(":")
            mix[(int(gpus), float(part))] = weight / total
        return mix, total

    def recent_mig_mix(self) -> tuple[dict[str, float] | None, float]:
        """(each recent MIG profile's share, the weighted number of MIG requests); the shares
        are None below :data:`MIX_MIN_REQUESTS`."""
        counted = {k[4:]: w for k, w in self.request_mix.items() if k.startswith("mig:")}
        total = sum(counted.values())
        if total < MIX_MIN_REQUESTS:
            return None, total
        return {profile: weight / total for profile, weight in counted.items()}, total
