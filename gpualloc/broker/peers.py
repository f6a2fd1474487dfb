"""Who is asking, as the kernel says it, and whether a pid is theirs.

``SO_PEERCRED`` gives the uid, gid and pid of the process that connected to a Unix socket; the
kernel fills it in at ``connect``, so no client can claim another user's identity. A lease may
be bound only to a process of the asking user (its *real* uid, as ``/proc/PID/status`` says:
a setuid program the user started is still theirs); root may name any process.

What ``/proc`` says of the peer itself (its real uid, its start time) is read once per
connection, at its first request that needs it, not at every request: the pid a connection
names is fixed at ``connect``, and a start time read once pins the process, so that a pid the
kernel hands out again later never passes for it (the ledger checks that the process still
runs, against that start time, before it records a lease: ``tests/test_broker_throughput.py``).
"""

from __future__ import annotations

import os
import socket
import struct

from msgspec import Struct

from gpualloc.errors import NotPermitted
from gpualloc.ledger.liveness import process_start_time

_UCRED = struct.Struct("3i")


class Peer(Struct):
    """The process at the other end of a connection (one per connection)."""

    pid: int
    uid: int
    gid: int
    facts: tuple[int, float] | None = None
    """Its real uid and start time, once read (:func:`check_owned`)."""

    @property
    def root(self) -> bool:
        return self.uid == 0


def peer_of(connection: socket.socket) -> Peer:
    raw = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, gid = _UCRED.unpack(raw)
    return Peer(pid=pid, uid=uid, gid=gid)


def real_uid(pid: int) -> int | None:
    """The real uid of ``pid`` (None when there is no such process)."""
    try:
        descriptor = os.open(f"/proc/{pid}/status", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:  # one read, no file object: the broker asks this for every lease it binds
        status = os.read(descriptor, 1 << 16)
    except OSError:
        return None
    finally:
        os.close(descriptor)
    _, found, rest = status.partition(b"\nUid:")
    try:
        return int(rest.split(None, 1)[0]) if found else None
    except (ValueError, IndexError):
        return None


def process_facts(pid: int) -> tuple[int, float] | None:
    """The real uid and start time of ``pid``, read together (None when there is no such
    process, or it ended between the reads)."""
    owner = real_uid(pid)
    started = process_start_time(pid)
    if owner is None or started is None or real_uid(pid) != owner:  # ended, its pid reused
        return None
    return owner, started


def check_owned(peer: Peer, pid: int) -> float:
    """The start time of ``pid`` if ``peer`` may bind a lease to it; raises otherwise. The
    peer's own facts are read once (module docstring); a failed read is not kept."""
    if pid != peer.pid:
        facts = process_facts(pid)
    else:
        if peer.facts is None:
            peer.facts = process_facts(pid)
        facts = peer.facts
    if facts is None:
        from gpualloc.host.lease_terms import no_such_process

        raise no_such_process(pid)
    owner, started = facts
    if owner != peer.uid and not peer.root:
        from gpualloc.ledger.shared_files import owner_name

        raise NotPermitted(
            f"process {pid} belongs to {owner_name(owner)}, not to you: a lease lives with a "
            "process of its owner",
            hint="give --pid of one of your own processes (or --hold)",
        )
    return started
