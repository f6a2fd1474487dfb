"""``gpualloc jobs``, ``log``, ``cancel`` and ``show``: a user's submitted jobs, read by the
client from the user's own job records (:mod:`gpualloc.batch.record`); and what ``submit``
prints."""

from __future__ import annotations

import os
import signal
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpualloc.cli.declare import Arg, Command, flag, json_flag, value

if TYPE_CHECKING:
    from gpualloc.batch.record import JobRecord
    from gpualloc.ledger.schema import Lease, Waiter

HIDDEN = ("environment",)
"""What ``show --json`` and ``jobs --json`` leave out of a record (the submitting shell's
variables may hold secrets; the record file keeps them, 0600)."""


def submitted(values: dict[str, Any]) -> None:
    """``submit``'s work: submit, then print the id as sbatch does."""
    from gpualloc.cli.open_ledger import warn
    from gpualloc.cli.output import print_json, write_stdout
    from gpualloc.cli.state import STATE
    from gpualloc.cli.submission import submit

    parsable, as_json = values.pop("parsable"), values.pop("as_json")
    done = submit(values, topology=STATE.topology)
    warn(done.notes)
    first = done.records[0]
    shown = first.array_id or first.id
    if as_json:
        print_json({"id": shown, "jobs": [_view(r) for r in done.records]})
    elif parsable:
        write_stdout(f"{shown}\n")
    else:
        write_stdout(f"Submitted batch job {shown}\n")


def _view(record: JobRecord) -> dict[str, Any]:
    from gpualloc.batch.record import seen_state, shown_id
    from gpualloc.model.validation import to_builtins

    view = {k: v for k, v in to_builtins(record).items() if k not in HIDDEN}
    view["state"] = seen_state(record)
    view["shown_id"] = shown_id(record)
    if view["state"] == "lost" and record.ended is None:
        from gpualloc.batch.record import last_written

        view["last_seen"] = last_written(record).isoformat()  # its supervisor's last word
    return view


def jobs_command(since: str | None, every: bool, start: bool, as_json: bool) -> None:
    """Your submitted jobs, as squeue shows them: pending, running and those that ended in
    the last day (--since), oldest first; with --all, every user's.

    STATE is pending, running, completing (the job's first process has exited, others of
    its process group have not), completed (exit 0), failed, cancelled, timeout (ended at its
    time limit) or lost (its supervisor has gone without a word: the machine rebooted, or
    it was killed). REASON says why a pending job waits: Dependency, Priority (others are
    ahead), Resources (it is next, and waits for GPUs), JobArrayTaskLimit.

    --all adds other users' jobs as the host's ledger and history show them: queued,
    running, or ended within --since; never their logs or environment, and not those still
    waiting for a dependency or their array's turn, which have not reached the queue.

    --start lists the pending jobs with when and on which GPUs each is expected to start, as
    squeue --start does: if every running and earlier job holds its GPUs for its whole time
    limit, so an estimate (jobs that end early make it sooner); N/A where no limit says when,
    or the job has not reached the host's queue.
    """
    from gpualloc.batch.record import FINAL_STATES, own_records, seen_state
    from gpualloc.cli.all_jobs import row_of
    from gpualloc.cli.output import Table, print_json, print_tables
    from gpualloc.model.option_values import parse_duration

    window = timedelta(seconds=parse_duration(since, "--since") if since else 86400.0)
    now = datetime.now(timezone.utc)
    views = []
    for record in own_records():
        state = seen_state(record)
        ended = record.ended or record.submitted
        if state in FINAL_STATES and now - ended > window:
            continue
        views.append(_view(record))
    if every:
        from gpualloc.cli.all_jobs import others_jobs

        views += others_jobs(now - window, [view["id"] for view in views])
    if start:
        _print_starts([view for view in views if view["state"] == "pending"], every, as_json)
        return
    if as_json:
        print_json(views)
        return
    columns = ["JOBID", "USER", "NAME", "STATE", "TIME", "TIME_LIMIT", "GPUS(REASON)"]
    rows = [row_of(view, now) for view in views]
    if not every:
        columns.pop(1)
        rows = [row[:1] + row[2:] for row in rows]
    print_tables([Table("", columns, rows, wrap=(1,))])


def _print_starts(views: list[dict[str, Any]], every: bool, as_json: bool) -> None:
    """``jobs --start``: each pending job's expected start, from the host's queue now."""
    from gpualloc.cli.open_ledger import open_host_ledger
    from gpualloc.cli.output import Table, print_json, print_tables
    from gpualloc.cli.queue_view import expected_starts_of, start_json
    from gpualloc.model.cpuset import format_cpulist

    starts = {}
    if views:
        host = open_host_ledger(check_health=False, create=False, full=True)
        ledger = host.snapshot().ledger
        starts = expected_starts_of(host, ledger.queue, host.occupancy(ledger))
    if as_json:
        print_json([{**view, **start_json(starts.get(view["id"]))} for view in views])
        return
    rows = []
    for view in views:
        expected = starts.get(view["id"])
        when, gpus = "N/A", "(null)"
        if expected is not None and expected.at is not None:
            when = expected.at.astimezone().strftime("%Y-%m-%dT%H:%M:%S")
            gpus = format_cpulist(sorted(expected.gpus))
        rows.append([view["shown_id"], str(view.get("user")), view["name"], "pending", when,
                     gpus, view.get("reason") or "None"])  # fmt: skip
    columns = ["JOBID", "USER", "NAME", "STATE", "START_TIME", "SCHED_GPUS", "REASON"]
    if not every:
        columns.pop(1)
        rows = [row[:1] + row[2:] for row in rows]
    print_tables([Table("", columns, rows, wrap=(1,))])


def log_command(job: str, follow: bool) -> None:
    """Print a job's log (its stdout, and stderr unless --error parted them); with -f, follow
    it until the job has ended, as tail -f does. Read with your own rights: another user's
    log is theirs."""
    from gpualloc.batch.record import FINAL_STATES, find_record, seen_state
    from gpualloc.cli.output import flush_stdout
    from gpualloc.errors import FileAccessError

    record = find_record(job)
    try:
        handle = Path(record.output).open("rb")  # noqa: SIM115 - followed below
    except OSError as exc:
        raise FileAccessError(
            f"cannot read job {record.id}'s log {record.output}: {exc.strerror}"
        ) from None
    import sys

    out = sys.stdout.buffer if hasattr(sys.stdout, "buffer") else None
    with handle:
        while True:
            chunk = handle.read(65536)
            if chunk:
                if out is not None:
                    out.write(chunk)
                else:
                    sys.stdout.write(chunk.decode(errors="replace"))
                continue
            if not follow:
                break
            flush_stdout()
            if out is not None:
                out.flush()
            from gpualloc.batch.record import job_directory, read_record

            if seen_state(read_record(job_directory(record.id))) in FINAL_STATES:
                rest = handle.read()
                if rest and out is not None:
                    out.write(rest)
                break
            time.sleep(0.25)


def cancel_command(jobs: list[str], as_json: bool) -> None:
    """Cancel jobs: a pending job leaves the queue; a running job's process group gets
    SIGTERM, and SIGKILL limits.kill_wait (30 s) later, its GPUs free once its last process
    has gone. An array's id cancels each of its tasks (ID_TASK: one). Yours, or as root
    anyone's (by id, found in the host's ledger). A job that has ended already is said so
    and left alone."""
    from gpualloc.batch.record import find_records
    from gpualloc.cli.open_ledger import say
    from gpualloc.cli.output import print_json
    from gpualloc.errors import NoSuchJob

    done = []
    for selector in jobs:
        try:
            records = find_records(selector)
        except NoSuchJob:
            if os.geteuid() == 0:
                done.append(_cancel_from_ledger(selector))
                continue
            _refuse_others(selector)
            raise
        for record in records:
            done.append(_cancel_one(record, say_ended=len(records) == 1))
    if as_json:
        print_json(done)
    else:
        for each in done:
            if each["signalled"]:
                say(f"job {each['id']} cancelled ({each['state']} until now)")


def _cancel_one(record: JobRecord, *, say_ended: bool) -> dict[str, Any]:
    from gpualloc.batch.record import (
        FINAL_STATES,
        ask_cancel,
        read_record,
        seen_state,
        supervisor_alive,
    )
    from gpualloc.cli.open_ledger import say

    state = seen_state(record)
    if state == "lost" and record.supervisor_pid is None:  # a supervisor slow to begin
        ask_cancel(record)
        return {"id": record.id, "state": "pending", "signalled": True}
    if state == "lost" and _end_orphaned_group(record):
        return {"id": record.id, "state": state, "signalled": True}
    if state in FINAL_STATES:
        if say_ended:
            say(f"job {record.id} has ended already ({state})")
        return {"id": record.id, "state": state, "signalled": False}
    ask_cancel(record)  # a supervisor that has not recorded its pid yet reads it then
    record = read_record(record.directory)  # a pid recorded since the mark is signalled
    if record.supervisor_pid is not None and supervisor_alive(record):
        os.kill(record.supervisor_pid, signal.SIGTERM)
    return {"id": record.id, "state": state, "signalled": True}


def _end_orphaned_group(record: JobRecord) -> bool:
    """A lost job whose processes live on (its supervisor was killed): the client does what
    the supervisor would have, SIGTERM to them and SIGKILL ``limits.kill_wait`` later, then
    records the job ``cancelled``. Only processes that are the job's (this boot's, its
    user's, started since the job: :func:`gpualloc.batch.record.job_processes`) are
    signalled, never a group that took the number since. False when none is left."""
    import msgspec

    from gpualloc.batch.record import job_processes, write_record
    from gpualloc.cli.open_ledger import say
    from gpualloc.cli.state import STATE
    from gpualloc.host.time_rules import TimeRules

    if not _signalled(job_processes(record), signal.SIGTERM):
        return False
    kill_wait = TimeRules.from_config(STATE.config()).kill_wait_s
    say(f"job {record.id} has no supervisor; its processes got SIGTERM")
    deadline = time.monotonic() + kill_wait
    while left := job_processes(record):
        if time.monotonic() >= deadline:
            _signalled(left, signal.SIGKILL)
            say(f"job {record.id} outlived limits.kill_wait ({kill_wait:g} s): SIGKILL")
            break
        time.sleep(0.2)
    ended = record.ended or datetime.now(timezone.utc)
    record = msgspec.structs.replace(
        record, state="cancelled", reason="Cancelled", detail="cancelled without its supervisor",
        ended=ended,
    )  # fmt: skip
    write_record(record, record.directory)
    return True


def _signalled(pids: list[int], sig: int) -> bool:
    """``sig`` to each of ``pids``; whether any received it."""
    sent = False
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            continue
        sent = True
    return sent


def _refuse_others(selector: str) -> None:
    """Exit 12 when ``selector`` is another user's job in the host's ledger."""
    from gpualloc.cli.open_ledger import open_host_ledger
    from gpualloc.errors import NotPermitted

    try:
        ledger = open_host_ledger(check_health=False, create=False, full=True).snapshot().ledger
    except Exception:
        return
    items: list[Lease | Waiter] = [*ledger.leases, *ledger.queue]
    for item in items:
        if item.id == selector and item.uid != os.geteuid():
            raise NotPermitted(
                f"job {selector} is {item.user}'s", hint="only its owner or root may cancel it"
            )


def _cancel_from_ledger(selector: str) -> dict[str, Any]:
    """Root's cancel of another user's job: its supervisor, found by the lease or waiter the
    job's id names in the host's ledger, gets SIGTERM."""
    from gpualloc.cli.open_ledger import open_host_ledger
    from gpualloc.errors import NoSuchJob
    from gpualloc.ledger.liveness import process_alive

    ledger = open_host_ledger(check_health=False, create=False, full=True).snapshot().ledger
    items: list[Lease | Waiter] = [*ledger.leases, *ledger.queue]
    for item in items:
        if (
            item.id == selector
            and item.source == "submit"  # a supervisor; never a run's or alloc's holder
            and item.pid is not None
            and process_alive(item.pid, item.pid_start_time)
        ):
            os.kill(item.pid, signal.SIGTERM)
            return {"id": item.id, "state": "running", "signalled": True}
    raise NoSuchJob(f"no job {selector} in this host's ledger")


def show_command(job: str, as_json: bool) -> None:
    """Everything gpualloc knows of one of your jobs (scontrol show job)."""
    from gpualloc.batch.record import find_record
    from gpualloc.cli.output import print_json, print_lines

    view = _view(find_record(job))
    if as_json:
        print_json(view)
        return
    print_lines([f"{key} = {_shown(key, value)}" for key, value in view.items()
                 if value not in (None, {}, [])])  # fmt: skip


def _shown(key: str, value: Any) -> str:
    """A record's value as ``show`` writes it: a command as a shell would read it, the
    options given (not every default), a list or table as JSON."""
    import json
    import shlex

    if key == "command":
        return shlex.join(value)
    if key == "options":
        given = {k: v for k, v in value.items() if v not in (None, False, ())}
        return " ".join(f"{k}={json.dumps(v)}" for k, v in sorted(given.items()))
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)


JOBS = Command(
    "jobs",
    jobs_command,
    options=(
        value(
            "--since", metavar="DURATION", help="Show jobs that ended this long ago (default 1d)."
        ),
        flag(
            "--all",
            "-a",
            dest="every",
            help="Every user's jobs, as the host's ledger and history show them (no logs).",
        ),
        flag(
            "--start",
            help="Pending jobs, with when and on which GPUs each is expected to start.",
        ),
        json_flag(),
    ),
)
LOG = Command(
    "log",
    log_command,
    options=(flag("--follow", "-f", help="Keep printing what the job writes until it ends."),),
    argument=Arg("job", "ID", required=True),
)
CANCEL = Command(
    "cancel",
    cancel_command,
    options=(json_flag(),),
    argument=Arg("jobs", "ID...", many=True, required=True),
)
SHOW = Command(
    "show", show_command, options=(json_flag(),), argument=Arg("job", "ID", required=True)
)
