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

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, NamedTuple, Protocol

from msgspec.structs import replace

if TYPE_CHECKING:
    from gpualloc.ledger.occupancy import Occupancy
    from gpualloc.ledger.schema import Lease, Waiter
    from gpualloc.model.request import Placement
    from gpualloc.model.topology import Topology


class Attempt(Protocol):
    """What the queue's attempt function gives (:class:`gpualloc.host.queue.Attempt`): where a
    waiter would start now, or None."""

    @property
    def placement(self) -> Placement | None: ...


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


MAX_PLANNED = 64
"""How many waiters, in turn order, :func:`expected_starts` plans (each costs a placement for
every moment it is tried at); later ones are not estimated."""


class Expected(NamedTuple):
    """When and where a waiter is expected to start (``at`` None: no declared limit says
    when; ``gpus`` empty: not estimated)."""

    at: datetime | None
    gpus: frozenset[int]


def expected_starts(
    occupancy: Occupancy,
    order: Sequence[Waiter],
    attempts_on: Callable[[Occupancy], Callable[[Waiter], Attempt]],
    now: datetime,
) -> dict[str, Expected]:
    """When and on which GPUs each waiter of ``order`` (turn order) is expected to start, if
    every running lease and every waiter planned before it holds its GPUs for its whole
    declared limit (the profile of conservative backfill, Mu'alem and Feitelson section 2,
    which squeue ``--start`` reports too): the first of now and the planned ends at which it
    can be placed with every job that overlaps its own run on the host. A waiter with no
    limit holds its GPUs for ever in the plan, and the ends of leases without one are never
    known. An estimate: jobs that end before their limits make it earlier, and EASY's
    backfill (the queue's rule) may start a later job first on GPUs the plan gave another,
    which no reservation but the first job's forbids."""
    running = _leases(occupancy)
    base = _without(occupancy, {lease.id for lease in running})
    planned: list[Lease] = []
    found: dict[str, Expected] = {}
    for waiter in order[:MAX_PLANNED]:
        times = sorted({now, *(x.ends for x in (*running, *planned) if x.ends and x.ends > now)})
        chosen: Expected | None = None
        for at in times:
            ends = at + timedelta(seconds=waiter.time_limit_s) if waiter.time_limit_s else None
            present = [x for x in (*running, *planned) if _overlaps(x, at, ends, now)]
            placed = attempts_on(_with(base, present))(waiter).placement
            if placed is not None:
                chosen = Expected(at, frozenset(placed.parent_gpus))
                planned.append(_planned(waiter, placed.parent_gpus, at))
                break
        found[waiter.id] = chosen or Expected(None, frozenset())
    return found


def _overlaps(lease: Lease, start: datetime, end: datetime | None, now: datetime) -> bool:
    """Whether ``lease`` (running, or planned from its ``created``) holds its GPUs at some
    moment of ``[start, end)`` (``end`` None: for ever)."""
    began = max(lease.created, now)
    ends = lease.ends
    return (ends is None or ends > start) and (end is None or began < end)


def _with(base: Occupancy, present: Sequence[Lease]) -> Occupancy:
    """``base`` (the host with no lease) holding ``present``."""
    held = {gpu.index: lease for lease in present for gpu in lease.gpus}
    return replace(base, leases={**base.leases, **held}, known_state=None)


def _planned(waiter: Waiter, gpus: Sequence[int], at: datetime) -> Lease:
    """The plan's stand-in lease of ``waiter`` started ``at`` on ``gpus``."""
    from gpualloc.ledger.schema import Lease, LeasedGpu

    return Lease(
        id=waiter.id,
        gpus=tuple(LeasedGpu(index=g) for g in sorted(gpus)),
        uid=waiter.uid,
        user=waiter.user,
        hold=True,
        created=at,
        source=waiter.source,
        time_limit_s=waiter.time_limit_s,
    )
