"""Jobs past their time limit, ended by the broker as root: their ``--signal`` before it,
SIGTERM at the limit, SIGKILL ``limits.kill_wait`` later, as Slurm ends a job at its
``--time`` (``KillWait``, slurm.conf(5)). The broker signals the job's process group (or its
process, when it leads none) itself, so a user who kills a process of theirs does not escape
the limit; the lease ends when its last process has gone, as every lease does (the GPUs are
never handed out while a process of the job may still use them). A ``--hold`` lease with no
process is released by the reaper at its limit (:func:`gpualloc.ledger.store.lease_alive`).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

from gpualloc.ledger.liveness import process_alive
from gpualloc.time_limits import format_time_limit

if TYPE_CHECKING:
    from gpualloc.ledger.schema import Lease


class Overdue:
    """What the broker has sent the jobs past their limits: when each got SIGTERM, and
    whether SIGKILL followed (a restarted broker sends SIGTERM again: harmless, and the
    kill wait starts anew)."""

    def __init__(self) -> None:
        self.terminated: dict[str, float] = {}
        self.killed: set[str] = set()
        self.warned: set[str] = set()
        """Leases whose ``--signal`` was sent."""

    def look(self, leases: Iterable[Lease], kill_wait_s: float) -> list[str]:
        """Signal every job whose limit has run out as its turn says; the log's lines."""
        now, clock = datetime.now(timezone.utc), time.monotonic()
        said: list[str] = []
        current = set()
        for lease in leases:
            ends = lease.ends
            if ends is None or (lease.pid is None and lease.process_group is None):
                continue
            warning = lease.signal
            if (
                warning is not None
                and lease.id not in self.warned
                and now >= ends - timedelta(seconds=warning.before_s)
            ):
                self.warned.add(lease.id)
                sig = signal.Signals(warning.number)
                if _signal(lease, sig, warning.leader_only):
                    said.append(f"lease {lease.id}: {sig.name}, {warning.before_s:g} s before")
            current.add(lease.id)
            if now < ends:
                continue
            first = self.terminated.get(lease.id)
            limit = format_time_limit(lease.time_limit_s)
            if first is None:
                self.terminated[lease.id] = clock
                if _signal(lease, signal.SIGTERM):
                    said.append(f"lease {lease.id}: its time limit ({limit}) ran out: SIGTERM")
            elif clock - first >= kill_wait_s and lease.id not in self.killed:
                self.killed.add(lease.id)
                if _signal(lease, signal.SIGKILL):
                    said.append(
                        f"lease {lease.id}: still running {kill_wait_s:g} s after SIGTERM: SIGKILL"
                    )
        for gone in (set(self.terminated) | self.warned) - current:
            self.terminated.pop(gone, None)
            self.killed.discard(gone)
            self.warned.discard(gone)
        return said


def _signal(lease: Lease, sig: signal.Signals, leader_only: bool = False) -> bool:
    """Send ``sig`` to the lease's process group (``leader_only``: to its process alone), else
    to its process if it is still the one the lease names (a pid reused since is left alone);
    whether anything was signalled."""
    try:
        group = lease.process_group
        if group is not None and not leader_only:
            if group == lease.pid and _reused(group, lease.pid_start_time):
                return False  # the job's group is gone and its number another process's
            os.killpg(group, sig)
            return True
        if lease.pid is not None and process_alive(lease.pid, lease.pid_start_time):
            os.kill(lease.pid, sig)
            return True
    except (ProcessLookupError, PermissionError):
        pass
    return False


def _reused(pid: int, start_time: float | None) -> bool:
    """Whether a process runs as ``pid`` that is not the one that started at ``start_time``:
    then the group the job led has ended (the kernel reuses no pid that names a live group),
    and signalling that number as root would reach a stranger's processes."""
    from gpualloc.ledger.liveness import process_start_time

    return process_start_time(pid) is not None and not process_alive(pid, start_time)
