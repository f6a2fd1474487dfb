"""The host queue's rule (gpualloc.host.queue), and the queue in the ledger."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from msgspec.structs import replace

from gpualloc.host.queue import Attempt, take_turn, turn_order
from gpualloc.ledger.schema import SCHEMA_VERSION, Ledger, QueuedRequest, Waiter
from gpualloc.ledger.store import LedgerTransaction, parse_ledger
from gpualloc.model.request import Placement, Scores
from gpualloc.placement.mapa.scores import EffectiveModel
from gpualloc.placement.sets.utility import UtilityWeights
from gpualloc.placement.want import Want

PLACEMENT = Placement("mapa", (0,), Scores(None, None, 0.0, None, 1.0), "test")


def _waiter(name: str, seq: int, gpus: int = 1, **fields: object) -> Waiter:
    return Waiter(
        id=f"{seq:012x}",
        seq=seq,
        uid=1000,
        user=name,
        pid=1,
        request=QueuedRequest(gpus=gpus, sensitive=gpus > 1),
        created=datetime(2026, 11, 21, tzinfo=timezone.utc),
        **fields,  # type: ignore[arg-type]
    )


def _fits(free: int):
    """An attempt function for a host with ``free`` GPUs free and no topology to speak of."""
    return lambda w: Attempt(PLACEMENT if w.request.gpus <= free else None, "too few free")


def test_first_come_first_served_when_the_earlier_job_can_start() -> None:
    queue = [_waiter("a", 0), _waiter("b", 1)]
    turn = take_turn(queue, queue[1].id, _fits(free=2))
    assert not turn.go and turn.position == 2
    assert turn.reason == "a's 1-GPU job is ahead and can start now"
    assert take_turn(queue, queue[0].id, _fits(free=2)).go


def test_backfill_passes_an_earlier_job_that_cannot_start_and_counts_it() -> None:
    queue = [_waiter("big", 0, gpus=4), _waiter("small", 1)]
    turn = take_turn(queue, queue[1].id, _fits(free=2))
    assert turn.go and turn.passed == (queue[0].id,)
    assert take_turn(queue, queue[0].id, _fits(free=2)).reason == "too few free"


def test_no_backfill_past_a_job_passed_over_too_often() -> None:
    starving = _waiter("big", 0, gpus=4, passed_over=3, max_bypass=3)
    queue = [starving, _waiter("small", 1)]
    turn = take_turn(queue, queue[1].id, _fits(free=2))
    assert not turn.go
    assert "passed over 3 times: no more backfill" in turn.reason


def test_priority_classes_come_before_arrival() -> None:
    queue = [
        _waiter("low", 0, priority="low"),
        _waiter("n", 1),
        _waiter("high", 2, priority="high"),
    ]
    assert [w.user for w in turn_order(queue)] == ["high", "n", "low"]
    assert take_turn(queue, queue[2].id, _fits(free=1)).go
    assert take_turn(queue, queue[0].id, _fits(free=1)).position == 3
    with pytest.raises(KeyError):
        take_turn(queue, "ffffffffffff", _fits(free=1))


def test_the_ledger_numbers_arrivals_and_counts_passes() -> None:
    txn = LedgerTransaction(Ledger(host="h"))
    first = txn.enqueue(_waiter("a", 0))
    second = txn.enqueue(replace(_waiter("b", 0), id="0000000000bb"))
    assert (first.seq, second.seq, txn.ledger.next_seq) == (0, 1, 2)
    txn.count_passed_over([first.id])
    assert txn.ledger.waiter(first.id).passed_over == 1
    removed = txn.dequeue(first.id)
    assert removed is not None and removed.id == first.id and txn.ledger.queue == [second]
    assert txn.dequeue(first.id) is None


def test_a_queued_request_round_trips_to_the_same_want() -> None:
    from gpualloc.model.request import JobRequest
    from gpualloc.placement.mapa.patterns import build_pattern

    want = Want(
        request=JobRequest(
            gpus=3,
            pattern=build_pattern("tree", 3),
            sensitive=True,
            required=frozenset({2}),
            excluded=frozenset({5}),
        ),
        policy="drb",
        effective_model=EffectiveModel.BOTTLENECK,
        weights=UtilityWeights(0.5, 0.25, 0.25),
        min_utility=0.5,
        min_bandwidth_gbps=40.0,
    )
    assert Want.from_queued(want.queued()) == want


def test_a_version_1_ledger_reads_with_an_empty_queue() -> None:
    ledger = parse_ledger('{"schema_version": 1, "host": "h", "leases": []}', "old")
    assert ledger.schema_version == SCHEMA_VERSION and ledger.queue == [] and ledger.next_seq == 0
    assert ledger.writer_uid is None and ledger.root_journal_seq == 0


def _host_with_leases(held: dict[int, tuple[int, ...]]):
    """dgx1-v100's embedded host with a lease of uid ``u`` on GPUs ``held[u]`` for each."""
    from gpualloc.host.lease_terms import LeaseTerms
    from gpualloc.host.local import LocalHost
    from gpualloc.model.request import JobRequest
    from gpualloc.placement.mapa.patterns import build_pattern
    from gpualloc.topologies import load_bundled

    host = LocalHost.open(load_bundled("dgx1-v100"), ignore_foreign=True)
    for uid, gpus in held.items():
        request = JobRequest(len(gpus), build_pattern("ring", len(gpus)), sensitive=False)
        terms = LeaseTerms(source="alloc", hold=True, uid=uid)
        host.allocate(Want(request, explicit=gpus), terms)
    return host


def test_the_pending_reason_says_why_a_job_waits_in_squeues_words() -> None:
    """``status`` showed a waiting job's "Passed" count and nothing of why it waited: a user's
    8-GPU job, behind GPUs the same user held, was overtaken by 14 of their later jobs while it
    said "Passed 0" (those passes do not count against --max-bypass, as
    tests/test_cli_wait.py holds)."""
    from gpualloc.host.queue import pending_reasons

    host = _host_with_leases({1000: (0, 1), 2000: (2, 3, 4)})
    own = _waiter("alice", 0, gpus=8)  # uid 1000 holds GPUs 0 and 1 itself
    others = replace(_waiter("bob", 1, gpus=4, passed_over=7), id="00000000000b", uid=2000)
    small = replace(_waiter("carol", 2), id="00000000000c", uid=3000)
    queue = [own, others, small]
    occupancy = host.occupancy(host.snapshot().ledger)
    reasons = pending_reasons(host.topology, occupancy, queue)
    assert reasons[own.id] == (
        "Resources: the job needs 8 GPUs and 3 usable ones are free now: GPU 5-7; its owner's "
        "own leases hold GPUs it needs, so later jobs start before it on GPUs it cannot use "
        "yet, and do not count against its --max-bypass"
    )
    assert reasons[others.id] == (
        "Resources: the job needs 4 GPUs and 3 usable ones are free now: GPU 5-7; later jobs "
        "may start before it on GPUs it cannot use yet (up to 1 more time)"
    )
    assert reasons[small.id] == "None: it starts at its next look"
    at_bound = replace(others, passed_over=8)
    reasons = pending_reasons(host.topology, occupancy, [own, at_bound, small])
    assert reasons[at_bound.id].endswith("; no later job may start before it (passed over 8 times)")
    assert reasons[small.id] == (
        "Priority: bob's 4-GPU job was passed over 8 times: no more backfill until it starts"
    )


# ---- EASY backfill on declared limits (gpualloc/host/backfill.py) ---------------------------


def _timed_host(leases: list[tuple[tuple[int, ...], float | None]]):
    """dgx1-v100's embedded host with a held lease on each ``(gpus, limit_s)``."""
    from gpualloc.host.lease_terms import LeaseTerms
    from gpualloc.host.local import LocalHost
    from gpualloc.model.request import JobRequest
    from gpualloc.placement.mapa.patterns import build_pattern
    from gpualloc.topologies import load_bundled

    host = LocalHost.open(load_bundled("dgx1-v100"), ignore_foreign=True)
    for uid, (gpus, limit) in enumerate(leases, start=2000):
        request = JobRequest(len(gpus), build_pattern("ring", len(gpus)), sensitive=False)
        terms = LeaseTerms(source="alloc", hold=True, uid=uid, time_limit_s=limit)
        host.allocate(Want(request, explicit=gpus), terms)
    return host


def _easy(host, queue: list[Waiter]) -> dict[str, object]:
    """Each waiter's turn under EASY backfill on ``host`` now, by id."""
    from gpualloc.host.queue import attempts, backfill_of, walk

    occupancy = host.occupancy(host.snapshot().ledger)
    attempt = attempts(host.topology, occupancy)
    backfill = backfill_of(host.topology, occupancy, attempt)
    return {t.waiter.id: t for t in walk(turn_order(queue), attempt, backfill=backfill)}


def test_a_job_backfills_ahead_of_a_blocked_8_gpu_job_only_if_it_ends_by_its_shadow_time() -> None:
    """An hour's lease holds GPUs 0-3; an 8-GPU job waits for them: its reservation is all
    eight GPUs from that lease's end. A 2-GPU job of 30 minutes ends before and starts, and
    passes nobody (it provably delays no one); one of 2 hours, or with no limit, waits."""
    host = _timed_host([((0, 1, 2, 3), 3600.0)])
    head = _waiter("big", 0, gpus=8)
    short = _waiter("short", 1, gpus=2, time_limit_s=1800.0)
    long = _waiter("long", 2, gpus=2, time_limit_s=7200.0)
    endless = _waiter("endless", 3, gpus=2)
    turns = _easy(host, [head, short, long])
    reserved = turns[head.id].reservation
    (lease,) = host.snapshot().ledger.leases
    assert reserved is not None and reserved.at == lease.ends
    assert reserved.gpus == frozenset(range(8))
    assert turns[short.id].go and turns[short.id].passed == ()
    for late in (long, endless):
        turn = _easy(host, [head, late])[late.id]
        assert not turn.go and turn.held_by == "Priority"
        assert turn.reason.startswith("big's 8-GPU job starts by ")
        assert "on GPU 0-7" in turn.reason


def test_a_job_with_no_limit_backfills_only_off_the_shadow_set() -> None:
    """A blocked job's reservation is the placement it will get, not a count of GPUs: a later
    job with no limit starts now placed off those GPUs, and passes nobody."""
    host = _timed_host([((2, 3), 3600.0)])
    pinned = QueuedRequest(gpus=4, sensitive=True, explicit=(0, 1, 2, 3))
    head = replace(_waiter("pinned", 0, gpus=4), request=pinned)
    endless = _waiter("endless", 1, gpus=2)
    turns = _easy(host, [head, endless])
    assert turns[head.id].reservation.gpus == frozenset({0, 1, 2, 3})
    turn = turns[endless.id]
    assert turn.go and turn.passed == ()
    assert set(turn.placement.gpus).isdisjoint({0, 1, 2, 3})
    # Off the shadow set even where the engine's own choice would sit on it:
    from gpualloc.host.queue import attempts, backfill_of

    occupancy = host.occupancy(host.snapshot().ledger)
    attempt = attempts(host.topology, occupancy)
    off = backfill_of(host.topology, occupancy, attempt).off(endless, frozenset({4, 5, 6, 7}))
    assert off.placement is not None and set(off.placement.gpus) == {0, 1}


def test_behind_a_lease_with_no_limit_backfill_stays_bounded_by_max_bypass() -> None:
    """No limit says when GPUs held with none come free: the head's reservation has no time
    and proves nothing, so a later job passes it only as before, counted, within its
    max_bypass."""
    host = _timed_host([((0, 1, 2, 3), None)])
    head = _waiter("big", 0, gpus=8)
    short = _waiter("short", 1, gpus=2, time_limit_s=60.0)
    turns = _easy(host, [head, short])
    assert turns[head.id].reservation.at is None
    assert turns[short.id].go and turns[short.id].passed == (head.id,)
    starving = replace(head, passed_over=8, max_bypass=8)
    turn = _easy(host, [starving, short])[short.id]
    assert not turn.go and "passed over 8 times" in turn.reason


def test_each_waiting_job_is_expected_where_the_declared_limits_leave_room() -> None:
    """The plan of conservative backfill (gpualloc/host/backfill.py expected_starts): each
    waiter, in turn order, at the first moment the running leases and the waiters planned
    before it, each held for its whole limit, leave a placement for its own run."""
    from datetime import timedelta

    from gpualloc.host.backfill import expected_starts
    from gpualloc.host.queue import attempts

    host = _timed_host([((0, 1, 2, 3), 3600.0), ((4, 5), 1800.0)])
    first = max(lease.ends for lease in host.snapshot().ledger.leases)
    whole = _waiter("whole", 0, gpus=8, time_limit_s=3600.0)
    quick = _waiter("quick", 1, gpus=2, time_limit_s=1200.0)
    endless = _waiter("endless", 2, gpus=4)
    another = _waiter("another", 3, gpus=2)
    occupancy = host.occupancy(host.snapshot().ledger)
    now = datetime.now(timezone.utc)
    plan = expected_starts(
        occupancy,
        [whole, quick, endless, another],
        lambda later: attempts(host.topology, later),
        now,
    )
    assert plan[whole.id].at == first and plan[whole.id].gpus == frozenset(range(8))
    assert plan[quick.id].at == now and plan[quick.id].gpus == frozenset({6, 7})  # done in time
    after = first + timedelta(hours=1)  # once the 8-GPU job's hour is over
    assert plan[endless.id].at == after and plan[another.id].at == after
    assert plan[endless.id].gpus.isdisjoint(plan[another.id].gpus)
