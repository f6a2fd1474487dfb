"""The processes each lease lives with, watched by the broker (issue 31, point 3).

In broker mode no lease lock file is handed to the job (the broker's directory is its own), so
the broker itself follows each lease's process and what it starts:

- the lease's pid gets a *pidfd* (``pidfd_open``, Linux 5.3) in the broker's event loop, which
  becomes readable the moment the process ends, so a finished job's GPUs are free within the
  loop's next turn; where the kernel has no pidfd, the periodic look below finds it instead;
- every :data:`LOOK_S` the broker reads ``/proc/*/stat`` once and adds each child of a
  watched process to its lease (with its start time, so a reused pid never counts). A lease
  lives while any of them does: a ``torchrun`` whose launcher died while its workers run keeps
  its GPUs, as the lease lock does in embedded mode. A child started and re-parented within
  one look is missed here and found on the GPUs themselves (the store's NVML check).

After a broker restart the watch is rebuilt from the ledger (pid and start time); descendants
of a process that ended while no broker ran are not known, and a lease whose own pid ended
then is released unless its process group or the GPUs show the job still runs.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpualloc.ledger.liveness import process_alive, started_at, stat_fields

LOOK_S = 1.0
"""How often the process tree is read for new descendants."""


class ProcessWatch:
    """Lease id -> the processes it lives with, each as (pid, start time)."""

    def __init__(self) -> None:
        self.members: dict[str, set[tuple[int, float | None]]] = {}
        self.pidfds: dict[int, str] = {}
        """An open pidfd -> the lease whose process it watches."""

    def watch(self, lease_id: str, pid: int, start_time: float | None) -> int | None:
        """Follow ``pid`` for ``lease_id``; returns a pidfd for the event loop (None where the
        kernel has none or the process is gone)."""
        self.members.setdefault(lease_id, set()).add((pid, start_time))
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

    def forget(self, lease_id: str) -> list[int]:
        """Stop following ``lease_id``; returns its pidfds, which the event loop unregisters
        and then closes (closing first would let a new connection reuse the number while
        the loop still maps it to the lease)."""
        self.members.pop(lease_id, None)
        gone = [fd for fd, owner in self.pidfds.items() if owner == lease_id]
        for descriptor in gone:
            del self.pidfds[descriptor]
        return gone

    def ended(self, descriptor: int) -> str | None:
        """A pidfd became readable: its process ended. Returns its lease (the caller
        unregisters and closes the descriptor, then asks whether the lease still lives)."""
        return self.pidfds.pop(descriptor, None)

    def alive(self, lease_id: str) -> bool:
        """Any process the lease lives with still runs."""
        return any(process_alive(pid, started) for pid, started in self.members.get(lease_id, ()))

    def look(self) -> None:
        """Add the children of watched processes (one read of ``/proc``), drop ended ones."""
        if not self.members:
            return
        children: dict[int, list[tuple[int, float | None]]] = {}
        for pid, parent, started in _processes():
            children.setdefault(parent, []).append((pid, started))
        for lease_id, members in self.members.items():
            found = set()
            todo = [pid for pid, _ in members]
            while todo:
                for child in children.get(todo.pop(), ()):
                    if child not in members and child not in found:
                        found.add(child)
                        todo.append(child[0])
            live = {m for m in members if process_alive(*m)} | found
            self.members[lease_id] = live or members  # keep the record of the dead for alive()


def _processes() -> list[tuple[int, int, float | None]]:
    """(pid, parent pid, start time) of every process now."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = stat_fields(int(entry.name))
            if fields[0] in ("Z", "X"):
                continue
            found.append((int(entry.name), int(fields[1]), started_at(fields)))
        except (OSError, ValueError, IndexError):
            continue
    return found
