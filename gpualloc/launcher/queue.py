"""Whose turn it is: the host queue's rule, as one pure function shared by ``run --wait`` and
the simulator.

Order: priority class (``high``, ``normal``, ``low``; GENIE, seed 002 section 5.2.1, schedules
by such classes), then arrival. A waiter may start when its request can be placed now (and the
placement meets its ``--min-utility`` / ``--min-bandwidth``, the DRB paper's postponement,
TOPO-AWARE-P, seed 000 section 4.4) and every waiter ahead of it

- cannot be placed now (otherwise it goes first: first come, first served), and
- has been passed over fewer than its ``max_bypass`` times, and has waited less than the
  host's backfill window where one is set (backfill: a later job may start before an earlier
  one that cannot start anyway, but not forever, so no job starves).

A waiter that starts past earlier ones counts as one more pass for each of them.

There is no daemon: each waiting gpualloc applies this rule to itself, under the ledger lock,
every time it looks (see :mod:`.wait`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timezone

from msgspec import Struct

from gpualloc.ledger.schema import PRIORITY_RANK, Waiter
from gpualloc.model.request import Placement


class Attempt(Struct, frozen=True):
    """What placing one waiter now would give: a placement, or why not."""

    placement: Placement | None
    reason: str = ""


class Turn(Struct, frozen=True):
    """The decision for one waiter."""

    placement: Placement | None
    """Where to start now; None: keep waiting."""
    passed: tuple[str, ...] = ()
    """Ids of the earlier waiters this start passes (each gets one more ``passed_over``)."""
    reason: str = ""
    """Why it waits, for the status line."""
    position: int = 0
    """1-based position in turn order."""
    waiter: Waiter | None = None
    """The waiter this turn is for (set by :func:`next_start`)."""

    @property
    def go(self) -> bool:
        return self.placement is not None


def turn_order(queue: Sequence[Waiter]) -> list[Waiter]:
    return sorted(queue, key=lambda w: (PRIORITY_RANK[w.priority], w.seq))


def take_turn(
    queue: Sequence[Waiter],
    waiter_id: str,
    attempt: Callable[[Waiter], Attempt],
    *,
    now: datetime | None = None,
) -> Turn:
    """May ``waiter_id`` start now? ``attempt`` places a waiter on the GPUs free now."""
    now = now or datetime.now(timezone.utc)
    order = turn_order(queue)
    ids = [w.id for w in order]
    if waiter_id not in ids:
        raise KeyError(f"waiter {waiter_id} is not in the queue")
    position = ids.index(waiter_id) + 1
    passed: list[str] = []
    for earlier in order[: position - 1]:
        if attempt(earlier).placement is not None:
            return Turn(
                None,
                reason=f"{_who(earlier)} is ahead and can start now",
                position=position,
            )
        if earlier.passed_over >= earlier.max_bypass:
            return Turn(
                None,
                reason=f"{_who(earlier)} was passed over {earlier.passed_over} times: no "
                "more backfill until it starts",
                position=position,
            )
        if _window_over(earlier, now):
            return Turn(
                None,
                reason=f"{_who(earlier)} has waited longer than this host's backfill window "
                f"({earlier.backfill_window_s:g} s): no more backfill until it starts",
                position=position,
            )
        passed.append(earlier.id)
    mine = attempt(order[position - 1])
    if mine.placement is None:
        return Turn(None, reason=mine.reason, position=position)
    return Turn(mine.placement, passed=tuple(passed), position=position)


def _window_over(waiter: Waiter, now: datetime) -> bool:
    window = waiter.backfill_window_s
    return window is not None and (now - waiter.created).total_seconds() >= window


def _who(waiter: Waiter) -> str:
    label = f"{waiter.user}'s {waiter.request.gpus}-GPU job"
    return f"{label} ({waiter.name})" if waiter.name else label


def next_start(queue: Sequence[Waiter], attempt: Callable[[Waiter], Attempt]) -> Turn | None:
    """The one waiter :func:`take_turn` lets start now, found in a single pass (the simulator
    asks this after every change; a live gpualloc asks :func:`take_turn` about itself).

    It is the first waiter in turn order that can be placed, provided every waiter before it
    may still be passed; any later waiter is behind a placeable one and must wait. ``None``
    when nobody may start. The returned turn's ``waiter`` names it.
    """
    passed: list[str] = []
    for position, waiter in enumerate(turn_order(queue), start=1):
        placed = attempt(waiter)
        if placed.placement is not None:
            return Turn(placed.placement, passed=tuple(passed), position=position, waiter=waiter)
        if waiter.passed_over >= waiter.max_bypass:
            return None
        passed.append(waiter.id)
    return None
