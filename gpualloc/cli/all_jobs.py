"""``gpualloc jobs --all``: every user's submitted jobs, as the host's ledger and history show
them, without what is each user's own (their logs and environment; a running job's command
is its lease's, which ``status`` shows every user).

A job's record is its user's alone (mode 0700, :mod:`gpualloc.batch.record`), so another
user's job is seen where the host keeps it: its lease while it runs, its waiter while it is
queued, its history record once it has ended (:mod:`gpualloc.ledger.history`, which the
broker's is every user's to read). A job still waiting for a dependency or for its array's
turn has not reached the queue, and is its user's alone to see, as Slurm's squeue shows a
held job only to those allowed to see it.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpualloc.host.protocol import Host
    from gpualloc.ledger.schema import Lease, Waiter


def others_jobs(since: datetime, known: Iterable[str]) -> list[dict[str, Any]]:
    """The submitted jobs the host knows of, but for those in ``known`` (the caller's own
    records show them whole): queued, running, and ended at or after ``since``."""
    from gpualloc.cli.open_ledger import open_host_ledger

    host = open_host_ledger(check_health=False, create=False, full=True)
    return host_jobs(host, since, known)


def host_jobs(host: Host, since: datetime, known: Iterable[str]) -> list[dict[str, Any]]:
    from gpualloc.ledger.history import recent_records

    skip = set(known)
    ledger = host.snapshot().ledger
    jobs: list[dict[str, Any]] = []
    waiting = sorted((w for w in ledger.queue if w.source == "submit"), key=lambda w: w.seq)
    for position, waiter in enumerate(waiting):
        if waiter.id not in skip:
            jobs.append(_waiting(waiter, first=position == 0))
    running = {lease.id for lease in ledger.leases}
    for lease in ledger.leases:
        if lease.source == "submit" and lease.id not in skip:
            jobs.append(_running(lease))
    ledger_file = host.ledger_file()
    if ledger_file is not None:
        for record in recent_records(ledger_file, since):
            if record.get("source") == "submit" and record.get("lease") not in skip | running:
                jobs.append(_ended(record))
    return jobs


def _base(item: Lease | Waiter) -> dict[str, Any]:
    return {
        "id": item.id,
        "shown_id": item.id,
        "user": item.user,
        "uid": item.uid,
        "name": item.name or "job",
        "reason": "None",
        "gpus": None,
        "started": None,
        "ended": None,
        "time_limit_s": None,
        "exit_code": None,
        "exit_signal": None,
    }


def _waiting(waiter: Waiter, *, first: bool) -> dict[str, Any]:
    view = _base(waiter)
    view.update(state="pending", reason="Resources" if first else "Priority")
    return view


def _running(lease: Lease) -> dict[str, Any]:
    from gpualloc.ledger.occupancy import held_devices

    view = _base(lease)
    view.update(
        state="running",
        gpus=held_devices(lease, ranked=True),
        started=lease.created.isoformat(),
        time_limit_s=lease.time_limit_s,
    )
    return view


HISTORY_STATES = {"cancelled": "cancelled", "timeout": "timeout", "rebooted": "lost"}
"""The state a job shows for its history record's ``state``; else its exit status decides."""


def _ended(record: dict[str, Any]) -> dict[str, Any]:
    from gpualloc.model.cpuset import format_ranks

    status = record.get("exit_status")
    state = HISTORY_STATES.get(record.get("state", ""))
    if state is None:
        state = "lost" if status is None else "completed" if status == 0 else "failed"
    gpus = [f"GPU {format_ranks(record['gpus'])}"] if record.get("gpus") else []
    gpus += ["GPU{}/MIG{}".format(*str(m).partition("/")[::2]) for m in record.get("mig") or []]
    return {
        "id": record["lease"],
        "shown_id": record["lease"],
        "user": record.get("user"),
        "uid": record.get("uid"),
        "name": record.get("name") or "job",
        "state": state,
        "reason": "None",
        "gpus": ", ".join(gpus) or None,
        "started": record.get("start"),
        "ended": record.get("end"),
        "time_limit_s": record.get("time_limit_s"),
        "exit_code": status if isinstance(status, int) and status >= 0 else None,
        "exit_signal": -status if isinstance(status, int) and status < 0 else None,
    }


def row_of(view: dict[str, Any], now: datetime) -> list[str]:
    """The ``jobs`` table's row (JOBID USER NAME STATE TIME TIME_LIMIT GPUS(REASON)) of a view
    as :func:`host_jobs` or the caller's own records give it."""
    from gpualloc.time_limits import format_time_limit

    started = _moment(view.get("started"))
    ended = _moment(view.get("ended")) or _moment(view.get("last_seen"))  # a lost job's
    elapsed = "0:00"
    if started is not None:
        seconds = max(0.0, ((ended or now) - started).total_seconds())
        elapsed = format_time_limit(seconds) or "0:00"
    limit = view.get("time_limit_s")
    shown_limit = format_time_limit(limit) if limit else "UNLIMITED"
    state = view["state"]
    gpus = view.get("gpus") or "-"
    reason = view.get("reason")
    if state == "pending" or (not view.get("gpus") and reason not in (None, "None")):
        where = f"({reason})"  # why it waits, or why it ended before it had GPUs
    elif view.get("exit_code") is not None and state not in ("running", "completing"):
        where = f"{gpus} exit {view['exit_code']}"
    elif view.get("exit_signal") is not None:
        where = f"{gpus} {_signal_name(view['exit_signal'])}"
    else:
        where = gpus
    return [view["shown_id"], str(view.get("user")), view["name"], state, elapsed, shown_limit,
            where]  # fmt: skip


def _moment(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            return None
        return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)
    return None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
