"""Jobs past their time limit, ended by the broker as root: their ``--signal`` before it,
SIGTERM at the limit, SIGKILL ``limits.kill_wait`` later and at every look after, as Slurm
ends a job at its ``--time`` (``KillWait``, slurm.conf(5)).

The broker signals each process it follows for the lease (:class:`.watch.ProcessWatch`: the
job's process and the descendants its passes over ``/proc`` found, each known by its start
time), one by one through a pidfd opened before the start time is checked, so that a pid
reused since, or a process group's number another user's daemon took, is never signalled as
root; a child that left the job's process group is still the job's. A signal nothing received
(a zombie leader, members not found yet) is sent again at the next look. The lease ends when
its last process has gone, as every lease does. A ``--hold`` lease with no process is
released by the reaper at its limit (:func:`gpualloc.ledger.store.lease_alive`).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

from gpualloc.ledger.liveness import process_alive
from gpualloc.time_limits import format_time_limit

if TYPE_CHECKING:
    from gpualloc.ledger.schema import Lease

Members = Callable[[str], Iterable[tuple[int, "float | None"]]]
"""A lease's processes, as (pid, start time), by lease id."""


class Overdue:
    """What the broker has sent the jobs past their limits: when each got SIGTERM, and
    whether its ``--signal`` went (a restarted broker sends SIGTERM again: harmless, and the
    kill wait starts anew)."""

    def __init__(self) -> None:
        self.terminated: dict[str, float] = {}
        self.killed: set[str] = set()
        self.warned: set[str] = set()
        """Leases whose ``--signal`` was sent."""

    def look(self, leases: Iterable[Lease], kill_wait_s: float, members: Members) -> list[str]:
        """Signal every job whose limit has run out as its turn says; the log's lines."""
        now, clock = datetime.now(timezone.utc), time.monotonic()
        said: list[str] = []
        current = set()
        for lease in leases:
            ends = lease.ends
            if ends is None or (lease.pid is None and lease.process_group is None):
                continue
            current.add(lease.id)
            warning = lease.signal
            if (
                warning is not None
                and lease.id not in self.warned
                and now >= ends - timedelta(seconds=warning.before_s)
            ):
                sig = signal.Signals(warning.number)
                if _send(lease, sig, members, leader_only=warning.leader_only):
                    self.warned.add(lease.id)
                    said.append(f"lease {lease.id}: {sig.name}, {warning.before_s:g} s before")
            if now < ends:
                continue
            first = self.terminated.get(lease.id)
            if first is None:
                if _send(lease, signal.SIGTERM, members):
                    self.terminated[lease.id] = clock
                    limit = format_time_limit(lease.time_limit_s)
                    said.append(f"lease {lease.id}: its time limit ({limit}) ran out: SIGTERM")
            elif clock - first >= kill_wait_s:
                # A holder its job's processes still stand in for is spared one more kill wait
                # (it records how the job ended), then no longer: a lease whose processes keep
                # coming back under SIGKILL does not keep its holder for ever.
                spare = clock - first < 2 * kill_wait_s
                sent = _send(lease, signal.SIGKILL, members, spare_holder=spare)
                if sent and lease.id not in self.killed:
                    self.killed.add(lease.id)
                    waited = f"{kill_wait_s:g} s after SIGTERM"
                    said.append(f"lease {lease.id}: still running {waited}: SIGKILL")
        for gone in (set(self.terminated) | self.warned) - current:
            self.terminated.pop(gone, None)
            self.killed.discard(gone)
            self.warned.discard(gone)
        return said


def _send(
    lease: Lease,
    sig: signal.Signals,
    members: Members,
    *,
    leader_only: bool = False,
    spare_holder: bool = True,
) -> bool:
    """``sig`` to each live process of ``lease`` (``leader_only``: the job's own process
    alone); whether any received it.

    A lease bound to a job its holder forked (:meth:`gpualloc.host.protocol.Host.adopt`: a
    submitted job's supervisor) is the job's: the job's group leader is its own process, and
    the holder, which waits to record how the job ended, is spared while any other process of
    the lease receives the signal. Once none does, or without ``spare_holder``, the holder
    gets SIGTERM and SIGKILL too (``--signal`` alone spares it): binding a lease to a
    throwaway child never buys its holder time past the limit."""
    holder = (lease.pid, lease.pid_start_time) if lease.pid is not None else None
    if lease.process_group is None or lease.process_group == lease.pid:
        known = {holder} if holder is not None else set()
        if not leader_only:
            known |= set(members(lease.id))
        return sum(_send_one(pid, started, sig) for pid, started in known) > 0
    job = {m for m in members(lease.id) if m != holder and m[0] != lease.pid}
    if leader_only:
        job = {m for m in job if m[0] == lease.process_group}
    received = sum(_send_one(pid, started, sig) for pid, started in job) > 0
    if leader_only or holder is None or (received and spare_holder):
        return received
    return _send_one(*holder, sig) or received


def _send_one(pid: int, started: float | None, sig: signal.Signals) -> bool:
    """``sig`` to ``pid`` if it is the process that started at ``started`` (None: unknown, so
    not signalled as root); through a pidfd opened first, so a pid reused between the check
    and the signal is not reached."""
    if started is None:
        return False
    try:
        descriptor = os.pidfd_open(pid)
    except OSError:
        return False
    try:
        if not process_alive(pid, started):
            return False
        signal.pidfd_send_signal(descriptor, sig)
        return True
    except OSError:
        return False
    finally:
        os.close(descriptor)
