"""EASY backfill on declared time limits (Mu'alem and Feitelson, "Utilization,
predictability, workloads, and user runtime estimates in scheduling the IBM SP2 with
backfilling", IEEE TPDS 12(6), 2001, section 2): the first waiting job that cannot start
gets a reservation, the time its GPUs will be free by the running leases' declared limits
(the *shadow time*) and the GPUs it will be placed on then (the *shadow set*); a later job
may start before it only if it ends by the shadow time, by its own declared limit, or keeps
off the shadow set. On one host the shadow set is the placement the head job will get (the
NVLinked pair MAPA picks then), not a count of GPUs as Slurm's backfill reserves, so a
later job is placed off it where it can be.

A lease without a limit ends at infinity: a head job that needs its GPUs has a reservation
with no time (:attr:`Reservation.at` None), which proves nothing (the head might start
sooner, when only some leases end, on GPUs a later job took), so what passes it stays
bounded as before, by ``max_bypass`` and the backfill window
(:func:`gpualloc.host.queue.walk`), and counted.

Pure: the queue rule (:func:`gpualloc.host.queue.take_turn`) asks it on the occupancy of the
moment, in the broker, in the file ledger's waiters and in the simulator alike.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, NamedTuple

from msgspec.structs import replace

if TYPE_CHECKING:
    from gpualloc.host.queue import Attempt
    from gpualloc.ledger.occupancy import Occupancy
    from gpualloc.ledger.schema import Lease, Waiter
    from gpualloc.model.request import Placement
    from gpualloc.model.topology import Topology


class Reservation(NamedTuple):
    """The first blocked waiter's place in time: from ``at`` (None: no declared limit
    says when) on ``gpus``; ``gpus`` is empty where it could not be placed even on an
    idle host (nothing a later job does delays it)."""

    waiter_id: str
    at: datetime | None
    gpus: frozenset[int]

    def kept_by(self, placement: Placement, limit_s: float | None, now: datetime) -> bool:
        """Whether a job placed on ``placement`` now, with ``limit_s`` (None: no limit),
        provably does not delay this reservation: it keeps off its GPUs, or it ends by
        ``at`` (EASY's condition)."""
        if not frozenset(placement.parent_gpus) & self.gpus:
            return True
        if self.at is None or limit_s is None:
            return False
        return now + timedelta(seconds=limit_s) <= self.at


class Backfill:
    """The reservation of the queue's first blocked waiter on one occupancy, and the
    placement of a later waiter off it. ``attempts_on`` makes the queue's attempt function
    for an occupancy (:func:`gpualloc.host.queue.attempts`)."""

    def __init__(
        self,
        topology: Topology,
        occupancy: Occupancy,
        attempt: Callable[[Waiter], Attempt],
        attempts_on: Callable[[Occupancy], Callable[[Waiter], Attempt]],
        now: datetime,
    ) -> None:
        self.topology = topology
        self.occupancy = occupancy
        self.attempt = attempt
        self.attempts_on = attempts_on
        self.now = now
        self._reservations: dict[str, Reservation] = {}

    def reservation(self, head: Waiter) -> Reservation:
        """Where and when ``head`` will start by the running leases' limits: the first end
        after which it can be placed, and that placement; with no such end, the placement it
        would get once every lease has gone, with no time."""
        found = self._reservations.get(head.id)
        if found is not None:
            return found
        leases = _leases(self.occupancy)
        ends = sorted({lease.ends for lease in leases if lease.ends is not None})
        reserved = Reservation(head.id, None, frozenset())
        for end in [*ends, None]:
            gone = {x.id for x in leases if end is None or (x.ends is not None and x.ends <= end)}
            placed = self.attempts_on(_without(self.occupancy, gone))(head).placement
            if placed is not None:
                at = max(end, self.now) if end is not None else None
                reserved = Reservation(head.id, at, frozenset(placed.parent_gpus))
                break
        self._reservations[head.id] = reserved
        return reserved

    def off(self, waiter: Waiter, gpus: frozenset[int]) -> Attempt:
        """``waiter`` placed now on the free GPUs but ``gpus``."""
        request = waiter.request
        excluded = tuple(sorted({*request.excluded, *gpus}))
        return self.attempt(replace(waiter, request=replace(request, excluded=excluded)))


def _leases(occupancy: Occupancy) -> list[Lease]:
    """Every lease that holds part of the host, once."""
    found: dict[str, Lease] = {}
    for lease in occupancy.leases.values():
        found.setdefault(lease.id, lease)
    for lease in occupancy.mig_leases.values():
        found.setdefault(lease.id, lease)
    for shared in occupancy.shares.values():
        for lease in shared:
            found.setdefault(lease.id, lease)
    return list(found.values())


def _without(occupancy: Occupancy, gone: set[str]) -> Occupancy:
    """``occupancy`` as it will be once the leases ``gone`` have ended."""
    if not gone:
        return occupancy
    shares = {g: tuple(x for x in held if x.id not in gone) for g, held in occupancy.shares.items()}
    return replace(
        occupancy,
        leases={g: x for g, x in occupancy.leases.items() if x.id not in gone},
        mig_leases={k: x for k, x in occupancy.mig_leases.items() if x.id not in gone},
        shares={g: held for g, held in shares.items() if held},
        known_state=None,
    )
