"""The processes each lease lives with, watched by the broker.

In broker mode no lease lock file is handed to the job (the broker's directory is its own), so
the broker itself follows each lease's process and what it starts:

- the lease's pid gets a *pidfd* (``pidfd_open``, Linux 5.3) in the broker's event loop, which
  becomes readable the moment the process ends, so a finished job's GPUs are free within the
  loop's next turn; where the kernel has no pidfd, the periodic look below finds it instead;
- a pass over ``/proc`` starts every :data:`LOOK_S` and adds each child of a live member
  to its lease (with its start time, so a reused pid never counts). A lease lives while any
  of them does: a ``torchrun`` whose launcher died while its workers run keeps its GPUs, as
  the lease lock does in embedded mode. A child started and re-parented within one pass is
  missed here and found on the GPUs themselves (the store's NVML check).

The pass is cut into steps of at most :data:`STEP_S`, one every :data:`STEP_EVERY_S`, so that
however many processes other users start (``ulimit -u`` bounds them, ``pid_max`` is 4,194,304
on systemd hosts) a request waits for one step at most, never for a whole walk of ``/proc``
(``tests/test_broker_limits.py``); a pass over many processes takes longer instead. The
members themselves are read by the pass too (one a pass did not find has ended), so a lease
with thousands of processes of its own costs no step more than its share of the walk.

The pass also notes which watched process groups have a member that has not ended: a lease
whose group leader has ended lives while its group does (``Lease.process_group``), and
``killpg`` cannot tell a running member from a zombie; the pass answers that in its steps, so
the broker never walks ``/proc`` whole to ask it (:meth:`ProcessWatch.group_member`).

A child is adopted only while its parent is a live member with the recorded start time,
read again after the child's own ``stat`` (whose parent pid then named the member): a member
that ended adopts nothing, so a process that got its pid later, or that process's children,
never keep the lease (``tests/test_broker_lease_lifetime.py``).

After a broker restart the watch is rebuilt from the ledger (pid and start time); descendants
of a process that ended while no broker ran are not known, and a lease whose own pid ended
then is released unless its process group or the GPUs show the job still runs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

from gpualloc.ledger.liveness import process_alive, started_at, stat_fields

LOOK_S = 1.0
"""How often a pass over the process tree starts (at most) for new descendants."""
STEP_S = 0.003
"""The most one step of a pass takes of the broker's loop."""
STEP_EVERY_S = 0.02
"""The pause between steps of a pass: the loop serves requests meanwhile."""
_SAME_START_S = 0.05
"""A child starts no earlier than its parent; start times are read to the tick (proc(5)'s
``starttime``, in units of ``sysconf(_SC_CLK_TCK)``, 100 a second on Linux)."""

Member = tuple[int, float | None]


class ProcessWatch:
    """Lease id -> the processes it lives with, each as (pid, start time)."""

    def __init__(self) -> None:
        self.members: dict[str, set[Member]] = {}
        self.pidfds: dict[int, str] = {}
        """An open pidfd -> the lease whose process it watches."""
        self._walk: Iterator[os.DirEntry[str]] | None = None
        self._parents: dict[int, list[tuple[float, str]]] = {}
        """The pass's members with a known start time: pid -> [(start time, lease)]."""
        self._seen: set[Member] = set()
        """The members the pass found running (so its end reads no member again)."""
        self._next_pass = time.monotonic()
        self._next_step = 0.0
        self.groups: dict[str, int] = {}
        """Lease id -> the process group it lives with once its own process has ended."""
        self._live_groups: set[int] = set()
        """The watched groups the last whole pass found a running member of."""
        self._counted_groups: set[int] = set()
        """The groups the last whole pass looked for (a group it did not is not known yet)."""
        self._pass_groups: set[int] = set()
        self._pass_live_groups: set[int] = set()

    def watch(self, lease_id: str, pid: int, start_time: float | None) -> int | None:
        """Follow ``pid`` for ``lease_id``; returns a pidfd for the event loop (None where the
        kernel has none or the process is gone)."""
        self.members.setdefault(lease_id, set()).add((pid, start_time))
        if self._walk is not None and start_time is not None:
            self._parents.setdefault(pid, []).append((start_time, lease_id))
            self._seen.add((pid, start_time))
        pidfd_open = getattr(os, "pidfd_open", None)
        if pidfd_open is None:
            return None
        try:
            descriptor = pidfd_open(pid)
        except OSError:
            return None
        if not process_alive(pid, start_time):  # the pid was reused before the pidfd opened
            os.close(descriptor)
            return None
        self.pidfds[descriptor] = lease_id
        return descriptor

    def watch_group(self, lease_id: str, group: int) -> None:
        """Follow the process group ``group`` for ``lease_id`` (:meth:`group_member`)."""
        self.groups[lease_id] = group

    def group_member(self, group: int) -> bool:
        """True if the process group ``group`` has a member that has not ended, as the last
        whole pass found it; True for a group no whole pass has looked for yet (the next
        one tells: GPUs are never freed on a guess)."""
        return group in self._live_groups or group not in self._counted_groups

    def forget(self, lease_id: str) -> list[int]:
        """Stop following ``lease_id``; returns its pidfds, which the event loop unregisters
        and then closes (closing first would let a new connection reuse the number while
        the loop still maps it to the lease)."""
        self.members.pop(lease_id, None)
        self.groups.pop(lease_id, None)
        for known in self._parents.values():
            known[:] = [(started, owner) for started, owner in known if owner != lease_id]
        gone = [fd for fd, owner in self.pidfds.items() if owner == lease_id]
        for descriptor in gone:
            del self.pidfds[descriptor]
        return gone

    def ended(self, descriptor: int) -> str | None:
        """A pidfd became readable: its process ended. Returns its lease (the caller
        unregisters and closes the descriptor, then asks whether the lease still lives)."""
        return self.pidfds.pop(descriptor, None)

    def alive(self, lease_id: str, *, but: int | None = None) -> bool:
        """Any process the lease lives with still runs (``but``: other than that pid)."""
        members = self.members.get(lease_id, ())
        return any(process_alive(pid, started) for pid, started in members if pid != but)

    def wake_at(self) -> float | None:
        """When the loop should call :meth:`step` next (monotonic); None: nothing to watch."""
        if not self.members:
            return None
        return self._next_step if self._walk is not None else self._next_pass

    def step(self) -> None:
        """One step of the pass over ``/proc``: a new pass when one is due, then entries until
        :data:`STEP_S` is spent. The pass's end drops the members that ended."""
        now = time.monotonic()
        if not self.members:
            self._close()
            return
        if self._walk is None:
            if now < self._next_pass:
                return
            self._next_pass = now + LOOK_S
            self._parents, self._seen = {}, set()
            self._pass_groups, self._pass_live_groups = set(self.groups.values()), set()
            for lease_id, members in self.members.items():
                for pid, started in members:
                    if started is not None:
                        self._parents.setdefault(pid, []).append((started, lease_id))
            self._walk = os.scandir("/proc")
        deadline = time.perf_counter() + STEP_S
        for entry in self._walk:
            if entry.name.isdigit():
                self._consider(int(entry.name))
            if time.perf_counter() >= deadline:
                self._next_step = time.monotonic() + STEP_EVERY_S
                return
        seen = self._seen
        self._counted_groups, self._live_groups = self._pass_groups, self._pass_live_groups
        self._close()
        for lease_id, members in self.members.items():
            # A process that ran through the whole pass was listed by it: a member it did not
            # find has ended (one of unknown start time is read, as only it can be).
            live = {m for m in members if m in seen or (m[1] is None and process_alive(*m))}
            self.members[lease_id] = live or members  # keep the record of the dead for alive()

    def look(self) -> None:
        """A whole pass at once (what the steps of one pass do, for tests and tools)."""
        self._next_pass = 0.0
        self.step()
        while self._walk is not None:
            self.step()

    def _consider(self, pid: int) -> None:
        """Note ``pid`` if it is a member; adopt it if its parent is a live member it started
        after."""
        try:
            fields = stat_fields(pid)
            parent = int(fields[1])
            if fields[0] in ("Z", "X"):
                return
            if self._pass_groups and int(fields[2]) in self._pass_groups:
                self._pass_live_groups.add(int(fields[2]))
            if pid not in self._parents and parent not in self._parents:
                return
            started = started_at(fields)
        except (OSError, ValueError, IndexError):
            return
        for known, _ in self._parents.get(pid, ()):
            if abs(started - known) <= _SAME_START_S:
                self._seen.add((pid, known))
        candidates = [
            (s, lease) for s, lease in self._parents.get(parent, ()) if s <= started + _SAME_START_S
        ]
        if not candidates:
            return
        for parent_started, lease_id in candidates:
            # The parent read after the child: alive now with its start time, it was the
            # child's parent when the child's stat named its pid (no pid is reused while its
            # process lives). A member that ended adopts nothing.
            members = self.members.get(lease_id)
            if members is None or not process_alive(parent, parent_started):
                self._parents[parent].remove((parent_started, lease_id))
                continue
            members.add((pid, started))
            self._seen.add((pid, started))
            self._parents.setdefault(pid, []).append((started, lease_id))  # its children

    def _close(self) -> None:
        if self._walk is not None:
            self._walk.close()  # type: ignore[attr-defined]
        self._walk = None
        self._parents, self._seen = {}, set()
