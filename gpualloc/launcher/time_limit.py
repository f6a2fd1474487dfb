"""The time limit of a job on the file ledger, kept by a watch of the job's own user: forked
before the exec (:mod:`.watcher`), it sends the job its ``--signal`` before the limit, sleeps
until the limit, then tells the job and
sends SIGTERM (its process group when it leads one), and SIGKILL ``limits.kill_wait`` later,
as Slurm ends a job at its ``--time``. Cooperative, as the file ledger is: a user who kills
the watch escapes the limit. Through a broker the broker keeps the limit itself, as root
(:mod:`gpualloc.broker.overdue`).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from datetime import datetime, timezone
from functools import partial

STEP_S = 5.0
"""How often the watch looks whether the job has ended before its limit (then it leaves)."""


def start_time_limit_watch(
    ends: datetime,
    limit_s: float,
    kill_wait_s: float,
    warning: tuple[int, float, bool] | None = None,
    *,
    lease_alive: Callable[[], bool],
    job: int | None = None,
    started: float | None = None,
) -> None:
    """Fork the watch of ``job`` (None: this process, about to become the job; else the
    process ``alloc --pid`` named, which started at ``started``) and return at once. It
    watches for as long as ``lease_alive()`` (the lease is in the ledger and lives by its
    rule: a job whose first process left children behind is still the job; a lease released
    early is left alone); ``warning``: ``--signal``'s signal, seconds before the limit, and
    whether the job's own process alone gets it."""
    from gpualloc.launcher.watcher import fork_detached, job_speaker, tell_job
    from gpualloc.ledger.liveness import process_start_time
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
    send = partial(_send, job, started, leads_group)
    warn = warning

    def watch() -> None:
        nonlocal warn
        while lease_alive():
            left = (ends - datetime.now(timezone.utc)).total_seconds()
            if warn is not None and left <= warn[1]:
                send(warn[0], leader_only=warn[2])
                warn = None
                continue
            if left <= 0:
                limit = format_time_limit(limit_s)
                then = f"SIGKILL in {kill_wait_s:g} s"
                say(f"the lease's time limit ({limit}) ran out: SIGTERM now, {then}")
                send(signal.SIGTERM)
                deadline = time.monotonic() + kill_wait_s
                while lease_alive() and time.monotonic() < deadline:
                    time.sleep(min(0.2, kill_wait_s))
                while lease_alive() and send(signal.SIGKILL):
                    time.sleep(0.2)  # until the last process it can reach has gone
                return
            until_warning = left - warn[1] if warn is not None else left
            time.sleep(max(0.0, min(left, until_warning, STEP_S)))

    fork_detached(watch, keep=kept)


def _send(
    job: int, started: float | None, leads_group: bool, sig: int, *, leader_only: bool = False
) -> bool:
    """``sig`` to the job's process group while the lease lives (its number is the job's
    then), else to its process if it is still the one that started at ``started``; whether
    anything could be reached. The watch is the job's user's: the kernel lets it signal
    nobody else's process."""
    from gpualloc.ledger.liveness import process_alive

    try:
        if leads_group and not leader_only:
            os.killpg(job, sig)
            return True
        if process_alive(job, started):
            os.kill(job, sig)
            return True
    except OSError:
        pass
    return False
