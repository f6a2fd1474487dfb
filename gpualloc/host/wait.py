"""``--wait``: join the host queue, start the moment it is this job's turn, without a daemon.

The queue lives in the ledger. A waiting gpualloc looks every 250 ms: in one ledger transaction
it reaps dead leases and dead waiters, applies the queue's rule to itself
(:func:`.queue.take_turn`) and, when it may start, records its lease and leaves the queue in the
same transaction, so no other waiter can take the same GPUs.

Why poll rather than wake on a change of the state file: a job that ends does not write the state
file. Its lease dies with its process (and its inherited lock, which the kernel drops); the next
transaction merely notices. A file watcher would sleep through exactly the event that matters.
250 ms keeps the start latency under half a second; each look is one locked read of a small JSON
file (``benchmarks/bench_launch.py`` measures the ledger's transactions a second). On a live host
the GPU process lists are refreshed every 2 s, as asking NVML is slower than reading the ledger.

A waiter is alive while its process is; a killed waiter is removed by the next transaction
(no ghost entries), Ctrl-C removes it at once, and ``--timeout`` removes it and exits 124.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from gpualloc.errors import GpuallocError, GpusBusy, NoFeasiblePlacement, WaitTimedOut
from gpualloc.host.lease_terms import LeaseTerms
from gpualloc.host.queue import (
    Turn,
    attempts,
    backfill_of,
    blocked_by_own,
    new_waiter,
    take_turn,
)
from gpualloc.host.queue_policy import WaitOptions
from gpualloc.host.terms import Allocation, WaitStatus
from gpualloc.ledger.occupancy import Occupancy
from gpualloc.ledger.schema import Ledger
from gpualloc.ledger.store import LedgerTransaction, new_lease_id
from gpualloc.placement.choose import choose
from gpualloc.placement.want import Want

if TYPE_CHECKING:
    from gpualloc.host.protocol import LedgerHost

PROCESS_REFRESH_S = 2.0
WHO_HOLDS = {"foreign": "not gpualloc", "shared": "shared jobs"}
"""How the waiting line names the holder of a GPU no lease holds whole, by the GPU's state
(``lost`` and ``unhealthy`` say themselves)."""


def wait_and_allocate(
    host: LedgerHost,
    want: Want,
    terms: LeaseTerms,
    options: WaitOptions,
    report: Callable[[WaitStatus], None] = lambda status: None,
) -> Allocation:
    """Queue ``want`` on the host and return its allocation when its turn comes.

    Raises NoFeasiblePlacement at once if the job could never start on this host (too many
    GPUs, or a threshold no placement on an idle host meets), WaitTimedOut at the timeout.
    """
    never_fits(host, want)
    started = time.monotonic()
    waiter_id = terms.lease_id or new_lease_id()  # a submitted job's id, as the broker's
    with host.transaction() as txn:
        options.policy.admit(
            uid=os.geteuid(),
            priority=options.priority,
            max_bypass=options.max_bypass,
            queue=txn.ledger.queue,
        )
        txn.enqueue(new_waiter(waiter_id, want, terms, options))
        allocation, status = _look(host, txn, waiter_id, want, terms, started)
    if allocation is not None:
        return allocation
    last_refresh = time.monotonic()
    try:
        while True:
            report(status)
            if options.timeout_s is not None and time.monotonic() - started >= options.timeout_s:
                raise WaitTimedOut(
                    f"no GPUs for this job within {options.timeout_s:g} s ({status.reason})",
                    hint="raise --timeout, or see 'gpualloc status'",
                )
            time.sleep(options.poll_s)
            if host.this_host and time.monotonic() - last_refresh >= PROCESS_REFRESH_S:
                host.refresh_processes()
                last_refresh = time.monotonic()
            with host.transaction() as txn:
                if txn.ledger.waiter(waiter_id) is None:
                    raise GpuallocError(
                        "this job's place in the queue was removed by someone else",
                        hint="run it again",
                    )
                allocation, status = _look(host, txn, waiter_id, want, terms, started)
            if allocation is not None:
                return allocation
    except BaseException:
        _leave_queue(host, waiter_id)
        raise


def never_fits(host: LedgerHost, want: Want) -> None:
    """Raise NoFeasiblePlacement if ``want`` could not start even on an idle host."""
    idle = Occupancy.build(host.topology, Ledger(host="idle"), (), outside=host.outside)
    try:
        choose(host.topology, idle, want, budget_s=host.placement_budget_s)
    except GpusBusy as too_poor:  # a threshold that no placement on this host meets
        raise NoFeasiblePlacement(
            f"even with every GPU free, {too_poor.message}",
            hint="this job would wait forever: lower the threshold",
        ) from None


def _look(
    host: LedgerHost,
    txn: LedgerTransaction,
    waiter_id: str,
    want: Want,
    terms: LeaseTerms,
    started: float,
) -> tuple[Allocation | None, WaitStatus]:
    """Apply the queue rule for ``waiter_id`` in ``txn``; start it if it may."""
    occupancy = host.occupancy(txn.ledger)
    budget = host.placement_budget_s
    attempt = attempts(host.topology, occupancy, budget_s=budget)
    turn = take_turn(
        txn.ledger.queue,
        waiter_id,
        attempt,
        self_blocked=blocked_by_own(occupancy),
        backfill=backfill_of(host.topology, occupancy, attempt, budget_s=budget),
    )
    status = WaitStatus(
        position=turn.position,
        queue_length=len(txn.ledger.queue),
        reason=turn.reason,
        holders=who_holds(occupancy),
        waited_s=time.monotonic() - started,
    )
    if not turn.go:
        return None, status
    return _start(host, txn, waiter_id, turn, want, terms), status


def _start(
    host: LedgerHost,
    txn: LedgerTransaction,
    waiter_id: str,
    turn: Turn,
    want: Want,
    terms: LeaseTerms,
) -> Allocation:
    assert turn.placement is not None
    waiter = txn.dequeue(waiter_id)
    txn.count_passed_over(turn.passed)
    waited = (datetime.now(timezone.utc) - waiter.created).total_seconds() if waiter else 0.0
    return host.record(txn, turn.placement, want, terms, waited_s=waited)


def who_holds(occupancy: Occupancy) -> str:
    """``held by alice: 0-3, bob: 5`` (who to ask)."""
    from gpualloc.model.cpuset import format_cpulist
    from gpualloc.model.mig import mig_label

    gpus: dict[str, list[int]] = {}
    for gpu, lease in sorted(occupancy.leases.items()):
        gpus.setdefault(lease.user, []).append(gpu)
    unaccounted = occupancy.busy - frozenset(occupancy.leases) - occupancy.outside - occupancy.mig
    for gpu in sorted(unaccounted):
        state = occupancy.state(gpu)
        gpus.setdefault(WHO_HOLDS.get(state, state), []).append(gpu)
    by_user = {who: [format_cpulist(held)] for who, held in gpus.items()}
    for (gpu, device), lease in sorted(occupancy.mig_leases.items()):
        by_user.setdefault(lease.user, []).append(mig_label(gpu, device))
    if not by_user:
        return ""
    return "held by " + ", ".join(f"{who}: {','.join(held)}" for who, held in by_user.items())


def _leave_queue(host: LedgerHost, waiter_id: str) -> None:
    """Ctrl-C, a timeout or an error: take this job out of the queue (best effort; a dead
    waiter is reaped anyway)."""
    try:
        with host.transaction() as txn:
            txn.dequeue(waiter_id)
    except GpuallocError:
        pass
