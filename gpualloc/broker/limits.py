"""What one user may take of the broker, so that no user's flood stalls another: connections open at
once, connections opened a second, requests a second weighted by what each costs the broker, and how
long an idle connection stays open. Root is never limited. The numbers are the system
configuration's ``broker.*`` settings (:mod:`gpualloc.config`).
"""

from __future__ import annotations

import time
from typing import Any

from gpualloc.errors import BrokerBusy
from gpualloc.wire import protocol

COSTS = {"hello": 1.0, "confirm": 1.0, "release": 2.0, "evict": 2.0, "alloc": 4.0, "gc": 10.0}
"""What a request costs of its user's budget (``broker.max_requests_per_s``): about what it costs
the broker, so that a flood of the dearest requests stalls nobody else. A full ``snapshot`` (the
ledger, the processes, the faults) costs :data:`SNAPSHOT_COST`."""
SNAPSHOT_COST = 10.0
FREE_BUSY_S = 0.005
"""Broker time a request may take for its fixed cost; beyond it, the time is charged too."""
BUSY_TOKEN_S = 20e-6
"""Broker time one token of the budget buys beyond :data:`FREE_BUSY_S`: with the default
5,000 tokens a second, a user who makes only slow requests (a placement that runs to its
``broker.placement_budget``) holds the broker at most a tenth of the time after a burst."""


def request_cost(op: str, args: dict[str, Any]) -> float:
    if op == "snapshot":
        return SNAPSHOT_COST if args.get("full", True) else 2.0
    return COSTS.get(op, 1.0)


class TokenBucket:
    """Per-uid budgets of ``rate`` a second, bursts of twice that (root is never limited)."""

    def __init__(self, rate: float) -> None:
        self.rate = float(rate)
        self.buckets: dict[int, tuple[float, float]] = {}

    def take(self, uid: int, cost: float = 1.0) -> bool:
        if uid == 0 or self.rate <= 0:
            return True
        now = time.monotonic()
        tokens, then = self.buckets.get(uid, (2 * self.rate, now))
        tokens = min(2 * self.rate, tokens + (now - then) * self.rate)
        if tokens < cost:
            self.buckets[uid] = (tokens, now)
            return False
        self.buckets[uid] = (tokens - cost, now)
        return True

    def exhausted(self, uid: int) -> bool:
        """Whether ``uid`` has less than one token left now (root never has)."""
        if uid == 0 or self.rate <= 0:
            return False
        now = time.monotonic()
        tokens, then = self.buckets.get(uid, (2 * self.rate, now))
        return min(2 * self.rate, tokens + (now - then) * self.rate) < 1

    def charge(self, uid: int, cost: float) -> None:
        """Take ``cost`` whatever is left: the budget may go below zero, and refills first."""
        if uid == 0 or self.rate <= 0 or cost <= 0:
            return
        now = time.monotonic()
        tokens, then = self.buckets.get(uid, (2 * self.rate, now))
        tokens = min(2 * self.rate, tokens + (now - then) * self.rate)
        self.buckets[uid] = (tokens - cost, now)


class Limits:
    """Per-uid bounds on connections, connection attempts and request cost, and how long an
    idle connection stays open."""

    def __init__(
        self,
        max_connections: int,
        max_requests_per_s: int,
        max_connects_per_s: int = 200,
        idle_timeout_s: float = 60.0,
    ) -> None:
        self.max_connections = max_connections
        self.requests = TokenBucket(max_requests_per_s)
        self.connects = TokenBucket(max_connects_per_s)
        self.idle_timeout_s = idle_timeout_s
        self.connections: dict[int, int] = {}

    def take(self, uid: int, cost: float = 1.0) -> bool:
        """A request of ``uid`` costing ``cost``, if its budget allows."""
        return self.requests.take(uid, cost)

    def exhausted(self, uid: int) -> bool:
        """Whether ``uid``'s request budget is spent (then its requests are not even read)."""
        return self.requests.exhausted(uid)

    def charge_time(self, uid: int, busy_s: float) -> None:
        """A request of ``uid`` kept the broker busy ``busy_s``: what passed
        :data:`FREE_BUSY_S` costs its budget one token per :data:`BUSY_TOKEN_S`: slow requests
        cost the user who makes them, not the others
        (tests/test_placement_budget.py::test_a_slow_request_costs_its_own_user)."""
        self.requests.charge(uid, (busy_s - FREE_BUSY_S) / BUSY_TOKEN_S)


TOO_MANY_CONNECTS = protocol.error_line(
    BrokerBusy(
        "too many connections opened to the broker (broker.max_connects_per_s)",
        hint="slow down and try again",
    )
)
"""The refusal of a connection past its user's ``broker.max_connects_per_s``: made once, as a
connect flood has the broker send it for nearly every connection."""
TOO_MANY_REQUESTS = protocol.error_line(
    BrokerBusy(
        "too many requests to the broker (broker.max_requests_per_s); this connection is closed",
        hint="slow down and try again",
    )
)
"""The refusal of a request past its user's ``broker.max_requests_per_s``, its connection then
closed: a flood costs the broker one answer, not one per request."""
