"""The host's queue as ``status`` and ``jobs --start`` show it: each waiting job's place, why
it waits, and when and on which GPUs it is expected to start."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from gpualloc.model.printable import count_of, printable, shown_name

if TYPE_CHECKING:
    from gpualloc.cli.output import Table
    from gpualloc.host.backfill import Expected
    from gpualloc.host.protocol import Host
    from gpualloc.ledger.occupancy import Occupancy
    from gpualloc.ledger.schema import Waiter


def pending_reasons_of(host: Host, queue: Sequence[Waiter], occupancy: Occupancy) -> dict[str, str]:
    """Why each waiter waits (:func:`gpualloc.host.queue.pending_reasons`)."""
    if not queue:
        return {}
    from gpualloc.host.queue import pending_reasons

    budget = host.placement_budget_s
    return pending_reasons(host.topology, occupancy, queue, budget_s=budget)


def expected_starts_of(
    host: Host, queue: Sequence[Waiter], occupancy: Occupancy
) -> dict[str, Expected]:
    """When and where each waiter is expected to start
    (:func:`gpualloc.host.backfill.expected_starts`), for ``status`` and ``jobs --start``."""
    if not queue:
        return {}
    from gpualloc.host.backfill import expected_starts
    from gpualloc.host.queue import attempts, turn_order

    budget = host.placement_budget_s
    return expected_starts(
        occupancy,
        turn_order(queue),
        lambda later: attempts(host.topology, later, budget_s=budget),
        datetime.now(timezone.utc),
    )


def shown_start(expected: Expected | None, now: datetime) -> str:
    """``14:05 on GPU 0-3`` (the day too when not today), ``now``, or ``-`` (not known)."""
    if expected is None or expected.at is None:
        return "-"
    from gpualloc.model.cpuset import format_cpulist

    where = f" on GPU {format_cpulist(sorted(expected.gpus))}"
    if expected.at <= now + timedelta(seconds=1):
        return "now" + where
    local = expected.at.astimezone()
    when = local.strftime("%H:%M" if local.date() == now.astimezone().date() else "%Y-%m-%d %H:%M")
    return when + where


def queue_table(
    queue: Sequence[Waiter], reasons: dict[str, str], starts: dict[str, Expected]
) -> Table:
    """``status``'s queue, in turn order."""
    from gpualloc.cli.output import Table
    from gpualloc.host.queue import turn_order
    from gpualloc.ledger.occupancy import format_age

    now = datetime.now(timezone.utc)
    rows = []
    for position, waiter in enumerate(turn_order(queue), start=1):
        request = waiter.request
        wants = count_of(request.gpus, "GPU") + (" sensitive" if request.sensitive else "")
        if request.mig is not None:
            wants = f"MIG {request.mig.describe()}"
        if request.share is not None:
            wants = request.share.describe()
        if request.min_bandwidth_gbps is not None:
            wants += f", >= {request.min_bandwidth_gbps:g} GB/s"
        if request.min_utility is not None:
            wants += f", utility >= {request.min_utility:g}"
        command = printable(" ".join(waiter.command), 40)
        rows.append(
            [
                str(position),
                waiter.user,
                waiter.priority,
                wants,
                format_age(now - waiter.created),
                f"{waiter.passed_over}/{waiter.max_bypass}",
                ": ".join(part for part in (shown_name(waiter.name), command) if part) or "-",
                shown_start(starts.get(waiter.id), now),
                reasons.get(waiter.id, ""),
            ]
        )
    return Table(
        "Queue (turn order)",
        ["#", "User", "Priority", "Wants", "Waiting", "Passed/max", "Job", "Starts", "Reason"],
        rows,
        wrap=(3, 6, 8),
    )


def start_json(expected: Expected | None) -> dict[str, Any]:
    """A waiter's expected start in ``--json``: ``expected_start`` (ISO 8601, null: not
    known) and ``expected_gpus``."""
    if expected is None or expected.at is None:
        return {"expected_start": None, "expected_gpus": None}
    return {"expected_start": expected.at.isoformat(), "expected_gpus": sorted(expected.gpus)}
