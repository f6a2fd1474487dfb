"""The time limit of a job on the file ledger, kept by a watch of the job's own user: forked
before the exec (:mod:`.watcher`), it sends the job its ``--signal`` before the limit, sleeps
until the limit, then tells the job and
sends SIGTERM (its process group when it leads one), and SIGKILL ``limits.kill_wait`` later,
as Slurm ends a job at its ``--time``. Cooperative, as the file ledger is: a user who kills
the watch escapes the limit. Through a broker the broker keeps the limit itself, as root
(:mod:`gpualloc.broker.overdue`).
"""

from __future__ import annotations

import contextlib
import os
import time
from datetime import datetime, timezone

STEP_S = 5.0
"""How often the watch looks whether the job has ended before its limit (then it leaves)."""


def start_time_limit_watch(
    ends: datetime,
    limit_s: float,
    kill_wait_s: float,
    warning: tuple[int, float, bool] | None = None,
    *,
    job: int | None = None,
    started: float | None = None,
) -> None:
    """Fork the watch of ``job`` (None: this process, about to become the job; else the
    process ``alloc --pid`` named, which started at ``started``) and return at once;
    ``warning``: ``--signal``'s signal, seconds before the limit, and whether the job's own
    process alone gets it."""
    from gpualloc.launcher.watcher import end_job, fork_detached, job_speaker, tell_job
    from gpualloc.ledger.liveness import process_alive, process_start_time
    from gpualloc.time_limits import format_time_limit

    kept: int | None = None
    if job is None:
        job = os.getpid()
        started = process_start_time(job)
        say, kept = job_speaker()
    else:
        pid = job

        def say(text: str) -> None:
            tell_job(pid, f"gpualloc: warning: {text}\n")

    try:
        leads_group = os.getpgid(job) == job
    except OSError:
        return  # gone already: nothing to end

    warn = warning

    def watch() -> None:
        nonlocal warn
        while process_alive(job, started):
            left = (ends - datetime.now(timezone.utc)).total_seconds()
            if warn is not None and left <= warn[1]:
                with contextlib.suppress(ProcessLookupError):
                    (os.kill if warn[2] or not leads_group else os.killpg)(job, warn[0])
                warn = None
                continue
            if left <= 0:
                say(
                    f"the lease's time limit ({format_time_limit(limit_s)}) ran out: SIGTERM "
                    f"now, SIGKILL in {kill_wait_s:g} s"
                )
                end_job(job, leads_group, started, kill_wait_s)
                return
            until_warning = left - warn[1] if warn is not None else left
            time.sleep(max(0.0, min(left, until_warning, STEP_S)))

    fork_detached(watch, keep=kept)
