"""``--wait``: join the host queue, start the moment it is this job's turn, without a daemon.

The queue lives in the ledger. A waiting gpualloc looks every 250 ms: in one ledger transaction
it reaps dead leases and dead waiters, applies the queue's rule to itself
(:func:`.queue.take_turn`) and, when it may start, records its lease and leaves the queue in the
same transaction, so no other waiter can take the same GPUs.

Why poll rather than wake on a change of the state file: a job that ends does not write the
state file. Its lease dies with its process (and its inherited lock, which the kernel drops);
the next transaction merely notices. A file watcher would sleep through exactly the event that
matters. 250 ms keeps the start latency under half a second; each look is one locked read of a
small JSON file (the ledger takes a few hundred transactions per second, see
``benchmarks/bench_launch.py``). On a live host the GPU process lists are refreshed every 2 s,
as asking NVML is slower than reading the ledger.

A waiter is alive while its process is; a killed waiter is removed by the next transaction
(no ghost entries), Ctrl-C removes it at once, and ``--timeout`` removes it and exits 124.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

from msgspec import Struct, field
from msgspec.structs import replace

from gpualloc.config import BY_KEY
from gpualloc.errors import GpuallocError, GpusBusy, NoFeasiblePlacement, WaitTimedOut
from gpualloc.launcher.allocate import (
    Allocation,
    HostLedger,
    LeaseTerms,
    Want,
    choose,
    user_name,
)
from gpualloc.launcher.queue import Attempt, Turn, take_turn
from gpualloc.launcher.queue_policy import QueuePolicy
from gpualloc.ledger.occupancy import Occupancy, format_age
from gpualloc.ledger.schema import Ledger, Priority, QueuedRequest, Waiter
from gpualloc.ledger.store import LedgerTransaction, new_lease_id
from gpualloc.model.request import HostState
from gpualloc.model.topology import Topology

if TYPE_CHECKING:
    from gpualloc.config import Config

POLL_S = 0.25
PROCESS_REFRESH_S = 2.0
WHO_HOLDS = {"foreign": "not gpualloc", "shared": "shared jobs"}
"""How the waiting line names the holder of a GPU no lease holds whole, by the GPU's state
(``lost`` and ``unhealthy`` say themselves)."""
DEFAULT_MAX_BYPASS: int = BY_KEY["queue.max_bypass"].default
"""How many later jobs may start before a waiting one, before backfill past it stops."""


class WaitOptions(Struct, frozen=True):
    timeout_s: float | None = None
    priority: Priority = "normal"
    max_bypass: int = DEFAULT_MAX_BYPASS
    poll_s: float = POLL_S
    policy: QueuePolicy = field(default_factory=QueuePolicy)
    """The host's bounds (:mod:`.queue_policy`), checked when the job joins the queue."""

    @classmethod
    def from_config(
        cls,
        config: Config,
        *,
        timeout_s: float | None = None,
        priority: Priority | None = None,
        max_bypass: int | None = None,
    ) -> WaitOptions:
        """The options of a ``--wait``: flags over the configured defaults, under the host's
        queue policy (one place for the command line and :func:`gpualloc.api.hold`)."""
        return cls(
            timeout_s=timeout_s,
            priority=config.value("queue.priority", priority),
            max_bypass=config.value("queue.max_bypass", max_bypass),
            policy=QueuePolicy.from_config(config),
        )


class WaitStatus(Struct, frozen=True):
    """What a waiting job shows its user."""

    position: int
    queue_length: int
    reason: str
    holders: str
    waited_s: float

    def line(self) -> str:
        text = (
            f"waiting {format_age(timedelta(seconds=self.waited_s))}, #{self.position} of "
            f"{self.queue_length} in the queue: {self.reason}"
        )
        return f"{text}; {self.holders}" if self.holders else text


def wait_and_allocate(
    host: HostLedger,
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
    waiter_id = new_lease_id()
    with host.transaction() as txn:
        options.policy.admit(
            uid=os.geteuid(),
            priority=options.priority,
            max_bypass=options.max_bypass,
            queue=txn.ledger.queue,
        )
        txn.enqueue(_waiter(waiter_id, want, terms, options))
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


def never_fits(host: HostLedger, want: Want) -> None:
    """Raise NoFeasiblePlacement if ``want`` could not start even on an idle host."""
    idle = Occupancy.build(host.topology, Ledger(host="idle"), (), outside=host.outside)
    try:
        choose(host.topology, idle, want)
    except GpusBusy as too_poor:  # a threshold that no placement on this host meets
        raise NoFeasiblePlacement(
            f"even with every GPU free, {too_poor.message}",
            hint="this job would wait forever: lower the threshold",
        ) from None


def _look(
    host: HostLedger,
    txn: LedgerTransaction,
    waiter_id: str,
    want: Want,
    terms: LeaseTerms,
    started: float,
) -> tuple[Allocation | None, WaitStatus]:
    """Apply the queue rule for ``waiter_id`` in ``txn``; start it if it may."""
    occupancy = host.occupancy(txn.ledger)
    turn = take_turn(txn.ledger.queue, waiter_id, attempts(host.topology, occupancy))
    status = WaitStatus(
        position=turn.position,
        queue_length=len(txn.ledger.queue),
        reason=turn.reason,
        holders=_holders(occupancy),
        waited_s=time.monotonic() - started,
    )
    if not turn.go:
        return None, status
    return _start(host, txn, waiter_id, turn, want, terms), status


def _start(
    host: HostLedger,
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


def attempts(
    topology: Topology,
    occupancy: Occupancy,
    memo: dict[tuple[QueuedRequest, HostState], Attempt] | None = None,
) -> Callable[[Waiter], Attempt]:
    """Where a waiter would start on the GPUs free now, or why it cannot; waiters asking for
    the same thing get one answer per look (32 one-GPU waiters cost one placement).

    ``memo`` keeps answers across looks, keyed by the request and the whole host state (free
    GPUs and running jobs), which is all a placement depends on: the simulator meets the same
    state again and again (about half of its decisions on a busy 16-GPU host).
    """
    answers: dict[QueuedRequest, Attempt] = {}
    state = occupancy.host_state() if memo is not None else None

    def attempt(waiter: Waiter) -> Attempt:
        request = waiter.request
        if request in answers:
            return answers[request]
        remember = memo is not None and request.share is None  # shares hang on more than state
        if remember and (request, state) in memo:  # type: ignore[operator]
            answers[request] = memo[(request, state)]  # type: ignore[index]
            return answers[request]
        try:
            answer = Attempt(choose(topology, occupancy, Want.from_queued(request)))
        except (GpusBusy, NoFeasiblePlacement) as why:
            answer = Attempt(None, why.message)
        except GpuallocError as why:  # e.g. a policy this gpualloc does not know
            answer = Attempt(None, f"cannot be placed here ({why.message})")
        answers[request] = answer
        if remember:
            memo[(request, state)] = answer  # type: ignore[index]
        return answer

    return attempt


def newcomer_passes(
    host: HostLedger, txn: LedgerTransaction, occupancy: Occupancy, want: Want, terms: LeaseTerms
) -> tuple[str, ...]:
    """A job that does not wait still takes its turn: it may start only where it could if it
    joined the back of the queue now (so it never takes GPUs a waiting job can use, and passes
    a blocked one only within its backfill bound). Returns the waiters it passes; raises
    GpusBusy when it would have to wait."""
    if not txn.ledger.queue:
        return ()
    newcomer = replace(_waiter(new_lease_id(), want, terms, WaitOptions()), seq=txn.ledger.next_seq)
    turn = take_turn([*txn.ledger.queue, newcomer], newcomer.id, attempts(host.topology, occupancy))
    if not turn.go:
        raise GpusBusy(
            f"{len(txn.ledger.queue)} job(s) wait in the host queue and this one may not pass "
            f"them: {turn.reason}",
            hint="add --wait to queue behind them ('gpualloc status' shows the queue)",
        )
    return turn.passed


def _holders(occupancy: Occupancy) -> str:
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


def _waiter(waiter_id: str, want: Want, terms: LeaseTerms, options: WaitOptions) -> Waiter:
    from gpualloc.ledger.liveness import process_start_time

    uid = os.geteuid()
    return Waiter(
        id=waiter_id,
        seq=0,  # the transaction numbers it
        uid=uid,
        user=user_name(uid),
        pid=os.getpid(),
        pid_start_time=process_start_time(os.getpid()),
        priority=options.priority,
        max_bypass=options.max_bypass,
        backfill_window_s=options.policy.backfill_window_s,
        request=want.queued(),
        command=terms.command,
        name=terms.name,
        source=terms.source,
        created=datetime.now(timezone.utc),
    )


def _leave_queue(host: HostLedger, waiter_id: str) -> None:
    """Ctrl-C, a timeout or an error: take this job out of the queue (best effort; a dead
    waiter is reaped anyway)."""
    try:
        with host.transaction() as txn:
            txn.dequeue(waiter_id)
    except GpuallocError:
        pass
