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

A waiter that starts past earlier ones counts as one more pass for each of them, but for the
first that cannot start where the running leases' limits time its start: that one holds
EASY backfill's reservation (:mod:`.backfill`), which a later waiter passes only by ending
before it or keeping off its GPUs, proved, not counted.

There is no daemon: each waiting gpualloc applies this rule to itself, under the ledger lock,
every time it looks (see :mod:`.wait`), and so does a job that does not wait
(:func:`newcomer_passes`): it may start only where it could from the back of the queue.
:func:`attempts` asks the placement front door (:func:`gpualloc.placement.choose.choose`) where
each waiter would start; the simulator applies the same rule to its own queue.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from msgspec import Struct
from msgspec.structs import replace

from gpualloc.errors import GpuallocError, GpusBusy, NoFeasiblePlacement
from gpualloc.host.backfill import Backfill, Reservation
from gpualloc.host.queue_policy import WaitOptions
from gpualloc.ledger.liveness import process_start_time
from gpualloc.ledger.occupancy import Occupancy
from gpualloc.ledger.schema import PRIORITY_RANK, QueuedRequest, Waiter
from gpualloc.ledger.shared_files import owner_name
from gpualloc.ledger.store import LedgerTransaction, new_lease_id
from gpualloc.model.printable import count_of
from gpualloc.model.request import HostState, Placement
from gpualloc.model.topology import Topology
from gpualloc.placement.choose import Choices, choose
from gpualloc.placement.want import Want

if TYPE_CHECKING:  # type only: the ledger session imports this module
    from gpualloc.host.lease_terms import LeaseTerms


class Attempt(Struct, frozen=True):
    """What placing one waiter now would give: a placement, or why not."""

    placement: Placement | None
    why: str | GpuallocError = ""
    """Why not: a text, or the error that says it. An error's message is written only when
    read (:attr:`reason`): the simulator asks why of no waiter, and writing every shared
    job's message (each holder described) was about a tenth of a trace replay."""

    @property
    def reason(self) -> str:
        return self.why if isinstance(self.why, str) else self.why.message


class Turn(Struct, frozen=True):
    """The decision for one waiter."""

    placement: Placement | None
    """Where to start now; None: keep waiting."""
    passed: tuple[str, ...] = ()
    """Ids of the earlier waiters this start passes (each gets one more ``passed_over``)."""
    reason: str = ""
    """Why it waits, for the status line."""
    held_by: str = ""
    """squeue's word for why: ``Resources`` (it cannot be placed now), ``Priority`` (a waiter
    ahead of it goes first); empty when it may start."""
    position: int = 0
    """1-based position in turn order."""
    waiter: Waiter | None = None
    """The waiter this turn is for (set by :func:`walk`)."""
    reservation: Reservation | None = None
    """The waiter's reservation, where it is the first that cannot start (EASY backfill)."""

    @property
    def go(self) -> bool:
        return self.placement is not None


def turn_key(waiter: Waiter) -> tuple[int, int]:
    """Where a waiter stands in turn order: its priority class, then its arrival."""
    return PRIORITY_RANK[waiter.priority], waiter.seq


def turn_order(queue: Sequence[Waiter]) -> list[Waiter]:
    """The queue in turn order (the simulator keeps its queue so, by :func:`turn_key`)."""
    return sorted(queue, key=turn_key)


def take_turn(
    queue: Sequence[Waiter],
    waiter_id: str,
    attempt: Callable[[Waiter], Attempt],
    *,
    now: datetime | None = None,
    order_of: Callable[[Sequence[Waiter]], list[Waiter]] = turn_order,
    self_blocked: Callable[[Waiter], bool] = lambda waiter: False,
    backfill: Backfill | None = None,
) -> Turn:
    """May ``waiter_id`` start now? ``attempt`` places a waiter on the GPUs free now;
    ``order_of`` puts the queue in turn order (the broker's adds fair share between users).
    A waiter that cannot start now and that its own owner's leases keep from starting
    (``self_blocked``, see :func:`blocked_by_own`) neither holds back nor counts as passed
    over. With ``backfill``, the first waiter that cannot start holds a reservation
    (:mod:`.backfill`, EASY backfill), which a later one must keep."""
    order = order_of(queue)
    ids = [w.id for w in order]
    if waiter_id not in ids:
        raise KeyError(f"waiter {waiter_id} is not in the queue")
    position = ids.index(waiter_id) + 1
    for turn in walk(order[:position], attempt, now=now, self_blocked=self_blocked,
                     backfill=backfill):  # fmt: skip
        if turn.position == position:
            return turn
    raise AssertionError("walk gives every waiter a turn")  # pragma: no cover


def walk(
    order: Sequence[Waiter],
    attempt: Callable[[Waiter], Attempt],
    *,
    now: datetime | None = None,
    self_blocked: Callable[[Waiter], bool] = lambda waiter: False,
    backfill: Backfill | None = None,
) -> Iterator[Turn]:
    """Each waiter's turn, in turn order (``order``): the queue rule (module docstring) in
    one pass. A waiter may start when it can be placed and no waiter ahead of it may start;
    those ahead that cannot are passed over within their ``max_bypass`` and the backfill
    window, except that with ``backfill`` the first of them holds EASY's reservation: a
    later waiter starts only on a placement that keeps it (:meth:`Reservation.kept_by
    <gpualloc.host.backfill.Reservation.kept_by>`), placed off its GPUs where it must be,
    and such a start is no pass. A reservation no declared limit can time (a lease without
    one stands in its way) proves nothing: it is passed within the same bounds, counted."""
    now = now or datetime.now(timezone.utc)
    passed: list[str] = []
    stop = ""
    reservation: Reservation | None = None
    holder: Waiter | None = None
    for position, waiter in enumerate(order, start=1):
        if stop:
            yield Turn(None, reason=stop, held_by="Priority", position=position, waiter=waiter)
            continue
        placed = attempt(waiter)
        if placed.placement is None:
            blocked = self_blocked(waiter)
            reserved = None
            if backfill is not None and reservation is None and not blocked:
                reservation = reserved = backfill.reservation(waiter)
                holder = waiter
            yield Turn(None, reason=placed.reason, held_by="Resources", position=position,
                       waiter=waiter, reservation=reserved)  # fmt: skip
            if blocked:
                continue
            if reserved is not None and reserved.at is not None:
                continue  # timed: what passes it is proved to keep its reservation, not counted
            stop = _backfill_over(waiter, now)
            if not stop:
                passed.append(waiter.id)
            continue
        placement = placed.placement
        if reservation is not None and reservation.at is not None and backfill is not None:
            assert holder is not None
            limit = waiter.time_limit_s
            if not reservation.kept_by(placement, limit, now):  # placed off it, or it waits
                placement = backfill.off(waiter, reservation.gpus).placement or placement
            if not reservation.kept_by(placement, limit, now):
                yield Turn(None, reason=_reserved(holder, reservation, waiter),
                           held_by="Priority", position=position, waiter=waiter)  # fmt: skip
                continue
        yield Turn(placement, passed=tuple(passed), position=position, waiter=waiter)
        stop = f"{_who(waiter)} is ahead and can start now"


def _backfill_over(waiter: Waiter, now: datetime) -> str:
    """Why no later waiter may start before ``waiter`` any more (empty: they may)."""
    if waiter.passed_over >= waiter.max_bypass:
        return (
            f"{_who(waiter)} was passed over {count_of(waiter.passed_over, 'time')}: "
            "no more backfill until it starts"
        )
    if _window_over(waiter, now):
        return (
            f"{_who(waiter)} has waited longer than this host's backfill window "
            f"({waiter.backfill_window_s:g} s): no more backfill until it starts"
        )
    return ""


def _reserved(holder: Waiter, reservation: Reservation, waiter: Waiter) -> str:
    """Why ``waiter``, placeable now, waits for ``holder``'s reservation."""
    from gpualloc.model.cpuset import format_cpulist
    from gpualloc.time_limits import format_time_limit

    assert reservation.at is not None
    at = reservation.at.astimezone().strftime("%H:%M:%S")
    gpus = format_cpulist(sorted(reservation.gpus))
    why = (
        "this job has no --time to end by then"
        if waiter.time_limit_s is None
        else f"this job's --time {format_time_limit(waiter.time_limit_s)} ends after that"
    )
    return f"{_who(holder)} starts by {at} on GPU {gpus}, and {why}"


def pending_reasons(
    topology: Topology,
    occupancy: Occupancy,
    queue: Sequence[Waiter],
    *,
    budget_s: float | None = None,
) -> dict[str, str]:
    """Waiter id -> why it waits, as squeue's REASON column says it (``Resources: the job
    needs 8 GPUs and 3 usable ones are free now``, ``Priority: ...``, ``None`` when it starts
    at its next look), with what it means for later jobs: whether they may start before it on
    GPUs it cannot use yet, and whether that counts against its ``max_bypass``. For
    ``gpualloc status``; the rule is :func:`take_turn`'s, applied to each waiter."""
    attempt = attempts(topology, occupancy, budget_s=budget_s)
    blocked = blocked_by_own(occupancy)
    backfill = backfill_of(topology, occupancy, attempt, budget_s=budget_s)
    reasons: dict[str, str] = {}
    for turn in walk(turn_order(queue), attempt, self_blocked=blocked, backfill=backfill):
        assert turn.waiter is not None
        reasons[turn.waiter.id] = _pending_reason(turn, turn.waiter, own=blocked(turn.waiter))
    return reasons


def _pending_reason(turn: Turn, waiter: Waiter, *, own: bool) -> str:
    if turn.go:
        return "None: it starts at its next look"
    said = f"{turn.held_by}: {turn.reason}"
    if own:  # tests/test_queue.py: a user's own 8-GPU job behind their own later jobs
        return (
            f"{said}; its owner's own leases hold GPUs it needs, so later jobs start before it "
            "on GPUs it cannot use yet, and do not count against its --max-bypass"
        )
    reserved = turn.reservation
    if reserved is not None and reserved.at is not None:
        from gpualloc.model.cpuset import format_cpulist

        at = reserved.at.astimezone().strftime("%Y-%m-%d %H:%M:%S")
        return (
            f"{said}; it starts by {at} on GPU {format_cpulist(sorted(reserved.gpus))}, by the "
            "running jobs' time limits: later jobs start before it only if they end by then or "
            "keep off those GPUs"
        )
    if waiter.passed_over >= waiter.max_bypass:
        times = count_of(waiter.passed_over, "time")
        return f"{said}; no later job may start before it (passed over {times})"
    if turn.held_by == "Resources":
        left = waiter.max_bypass - waiter.passed_over
        more = count_of(left, "more time")
        return f"{said}; later jobs may start before it on GPUs it cannot use yet (up to {more})"
    return said


def _window_over(waiter: Waiter, now: datetime) -> bool:
    window = waiter.backfill_window_s
    return window is not None and (now - waiter.created).total_seconds() >= window


def _who(waiter: Waiter) -> str:
    label = f"{waiter.user}'s {waiter.request.gpus}-GPU job"
    return f"{label} ({waiter.name})" if waiter.name else label


def next_start(
    queue: Sequence[Waiter],
    attempt: Callable[[Waiter], Attempt],
    *,
    order_of: Callable[[Sequence[Waiter]], Sequence[Waiter]] = turn_order,
    self_blocked: Callable[[Waiter], bool] = lambda waiter: False,
    backfill: Backfill | None = None,
) -> Turn | None:
    """The one waiter :func:`take_turn` lets start now, found in a single pass (the simulator
    asks this after every change; a live gpualloc asks :func:`take_turn` about itself):
    the first that :func:`walk` lets go, or ``None``. The returned turn's ``waiter`` names
    it."""
    turns = walk(order_of(queue), attempt, self_blocked=self_blocked, backfill=backfill)
    return next((turn for turn in turns if turn.go), None)


class AttemptMemo:
    """What :func:`attempts` remembers across looks: answers by the request and the whole host
    state (free GPUs and running jobs), which is all a placement depends on, and the choices
    of policies that read the free GPUs alone by the free GPUs
    (:func:`gpualloc.placement.choose.searched`). The simulator meets the same state again
    and again (about half of its decisions on a busy 16-GPU host), and the same free GPUs
    more often still."""

    def __init__(self) -> None:
        self.answers: dict[tuple[QueuedRequest, HostState], Attempt] = {}
        self.choices: Choices = {}
        self.wants: dict[QueuedRequest, Want] = {}
        """Each queued request as the placement engine reads it (made once, not per look)."""

    def __len__(self) -> int:
        return len(self.answers) + len(self.choices)

    def clear(self) -> None:
        self.answers.clear()
        self.choices.clear()
        self.wants.clear()


def attempts(
    topology: Topology,
    occupancy: Occupancy,
    memo: AttemptMemo | None = None,
    *,
    budget_s: float | None = None,
) -> Callable[[Waiter], Attempt]:
    """Where a waiter would start on the GPUs free now, or why it cannot; waiters asking for
    the same thing get one answer per look (32 one-GPU waiters cost one placement).

    ``memo`` keeps answers across looks (:class:`AttemptMemo`).
    """
    answers: dict[QueuedRequest, Attempt] = {}
    state = occupancy.host_state() if memo is not None else None

    def attempt(waiter: Waiter) -> Attempt:
        request = waiter.request
        answer = answers.get(request)
        if answer is not None:
            return answer
        kept = memo if request.share is None else None  # shares hang on more than state
        if kept is not None:
            answer = kept.answers.get((request, state))  # type: ignore[arg-type]
            if answer is not None:
                answers[request] = answer
                return answer
        try:
            want = kept.wants.get(request) if kept is not None else None
            if want is None:
                want = Want.from_queued(request)
                if kept is not None:  # as many as the answers kept, which bound the memo
                    kept.wants[request] = want
            choices = kept.choices if kept is not None else None
            answer = Attempt(choose(topology, occupancy, want, budget_s=budget_s, choices=choices))
        except (GpusBusy, NoFeasiblePlacement) as why:
            answer = Attempt(None, why.with_traceback(None))
        except GpuallocError as why:  # e.g. a policy this gpualloc does not know
            answer = Attempt(None, f"cannot be placed here ({why.message})")
        answers[request] = answer
        if kept is not None:
            kept.answers[(request, state)] = answer  # type: ignore[index]
        return answer

    return attempt


def backfill_of(
    topology: Topology,
    occupancy: Occupancy,
    attempt: Callable[[Waiter], Attempt],
    *,
    budget_s: float | None = None,
    now: datetime | None = None,
) -> Backfill:
    """EASY backfill's view of ``occupancy`` (:mod:`.backfill`): ``attempt`` places a waiter
    now, and a reservation is placed on the occupancy as the running leases' limits leave
    it."""
    return Backfill(
        topology,
        occupancy,
        attempt,
        lambda later: attempts(topology, later, budget_s=budget_s),
        now or datetime.now(timezone.utc),
    )


def blocked_by_own(occupancy: Occupancy) -> Callable[[Waiter], bool]:
    """Whether a waiter cannot start while its own owner's leases stand, whatever anyone else
    releases: it names a GPU its owner holds (``--gpus``, ``--require``), or asks for more GPUs than
    the host has without them. Such a waiter is its owner's own business: it neither stops backfill
    nor counts as passed over: else one user's ``alloc --hold --gpus 0`` then ``alloc --wait -n 8``
    freezes every other user's allocations once ``max_bypass`` is reached
    (tests/test_cli_wait.py::test_a_job_its_own_owners_lease_blocks_freezes_nobody). Shared and MIG
    requests never count as blocked so."""
    usable = occupancy.gpu_count - len(occupancy.unusable | occupancy.outside | occupancy.mig)

    def blocked(waiter: Waiter) -> bool:
        request = waiter.request
        if request.share is not None or request.mig is not None:
            return False
        own = {gpu for gpu, lease in occupancy.leases.items() if lease.uid == waiter.uid}
        if not own:
            return False
        named = {*(request.explicit or ()), *request.required}
        return bool(named & own) or request.gpus > usable - len(own)

    return blocked


def newcomer_passes(
    topology: Topology,
    txn: LedgerTransaction,
    occupancy: Occupancy,
    want: Want,
    terms: LeaseTerms,
    *,
    budget_s: float | None = None,
) -> tuple[str, ...]:
    """A job that does not wait still takes its turn: it may start only where it could if it
    joined the back of the queue now (so it never takes GPUs a waiting job can use, and passes
    a blocked one only within its backfill bound). Returns the waiters it passes; raises
    GpusBusy when it would have to wait."""
    if not txn.ledger.queue:
        return ()
    newcomer = replace(
        new_waiter(new_lease_id(), want, terms, WaitOptions()), seq=txn.ledger.next_seq
    )
    attempt = attempts(topology, occupancy, budget_s=budget_s)
    turn = take_turn(
        [*txn.ledger.queue, newcomer],
        newcomer.id,
        attempt,
        self_blocked=blocked_by_own(occupancy),
        backfill=backfill_of(topology, occupancy, attempt, budget_s=budget_s),
    )
    if not turn.go:
        raise GpusBusy(
            f"{_waiting(len(txn.ledger.queue))} in the host queue and this one may not pass "
            f"{_them(len(txn.ledger.queue))}: {turn.reason}",
            hint=f"add --wait to queue behind {_them(len(txn.ledger.queue))} ('gpualloc "
            "status' shows the queue)",
        )
    return turn.passed


def _waiting(count: int) -> str:
    return f"{count_of(count, 'job')} {'waits' if count == 1 else 'wait'}"


def _them(count: int) -> str:
    return "it" if count == 1 else "them"


def new_waiter(
    waiter_id: str,
    want: Want,
    terms: LeaseTerms,
    options: WaitOptions,
    *,
    waiting: tuple[int, int, float | None] | None = None,
) -> Waiter:
    """The queue entry for ``want`` (the transaction numbers it): of this process, or with
    ``waiting`` (uid, pid, start time) of the broker's peer."""
    uid, pid, started = waiting or (os.geteuid(), os.getpid(), None)
    return Waiter(
        id=waiter_id,
        seq=0,  # the transaction numbers it
        uid=uid,
        user=owner_name(uid),
        pid=pid,
        pid_start_time=started if started is not None else process_start_time(pid),
        priority=options.priority,
        max_bypass=options.max_bypass,
        backfill_window_s=options.policy.backfill_window_s,
        request=want.queued(),
        command=terms.command,
        name=terms.name,
        source=terms.source,
        created=datetime.now(timezone.utc),
        time_limit_s=terms.time_limit_s,
    )
