"""Placement searches off the broker's loop (issue 40, hole 2).

The broker answers every user from one loop, and a placement search may take up to the host's
``placement.time_budget`` (1 s): one user's 10-GPU job on a 32-GPU host would hold everyone
else up for that long. So a search the broker does not already know the answer to runs in a
worker process instead, and the request that needs it waits, parked, while the loop goes on:

1. :meth:`gpualloc.host.local.LocalHost.placement` finds no remembered answer for the request
   and host state and raises :class:`~gpualloc.host.local.PlacementPending` (its
   transaction changes nothing);
2. the broker parks the request (and whatever its connection sends after it, in order) and
   :meth:`Placer.ask` sends the worker the request and the occupancy it was placed on;
3. the worker runs :func:`gpualloc.placement.choose.searched` with the full budget and sends
   the placement back; the broker remembers it (``LocalHost.placement_memo``) and runs the
   parked request again, which now finds it, as long as the host has not changed meanwhile.

A request placed again on a host that changed while it waited (the answer no longer fits)
asks once more; after :data:`MAX_ASKS` it is searched in the loop, under the broker's own
short ``broker.placement_budget``. So are requests whose search the worker could not finish
(an error: the loop's search says why, quickly, since the errors come before any search),
and every search while the worker is not running. The worker takes one search of each user
at a time, users in turn, so that one user's searches do not queue ahead of everyone's.

The worker is ``python -m gpualloc.broker.placer``, started by the broker with its topology;
both ends are the broker's own, so they speak pickle over a pipe, in length-prefixed frames.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import struct
import subprocess
import sys
from collections import deque
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpualloc.host.local import PlacementPending

MAX_ASKS = 2
"""Times one request may wait for the worker before it is searched in the loop."""
_FRAME = struct.Struct("!I")


class Placer:
    """The broker's end of the worker: what was asked, by whom, and the answers. The worker
    has one search at a time (so the pipe never fills and the loop never blocks writing to
    it); the others wait here, each user's in order, users in turn."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process
        assert process.stdin is not None and process.stdout is not None
        self.to_worker, self.from_worker = process.stdin, process.stdout.fileno()
        os.set_blocking(self.from_worker, False)
        self.inbox = bytearray()
        self.deferring = True
        """Whether a missing answer is asked of the worker now (the broker turns it off for a
        request that has waited :data:`MAX_ASKS` times)."""
        self.inline: set[Hashable] = set()
        """Keys the worker could not answer: searched in the loop, once."""
        self.asked: set[Hashable] = set()
        """Keys in the worker or waiting for it."""
        self.searching: Hashable | None = None
        """The key the worker has now."""
        self.queued: dict[int, deque[tuple[Hashable, Any, Any]]] = {}
        self.turns: deque[int] = deque()
        """Users with searches waiting, in turn."""
        self.alive = True

    @classmethod
    def start(cls, topology: Any, budget_s: float | None) -> Placer:
        process = subprocess.Popen(
            [sys.executable, "-m", "gpualloc.broker.placer"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )
        placer = cls(process)
        placer._send((topology, budget_s))
        return placer

    def fileno(self) -> int:
        return self.from_worker

    def defers(self, key: Hashable) -> bool:
        """Whether the search for ``key`` should wait for the worker."""
        if key in self.inline:
            self.inline.discard(key)
            return False
        return self.alive and self.deferring

    def ask(self, uid: int, pending: PlacementPending) -> None:
        """Have the worker search ``pending``, unless it is asked already."""
        if pending.key in self.asked:
            return
        self.asked.add(pending.key)
        if uid not in self.queued:
            self.queued[uid] = deque()
            self.turns.append(uid)
        self.queued[uid].append((pending.key, pending.occupancy, pending.want))
        if self.searching is None:
            self._next()

    def answers(self) -> list[tuple[Hashable, Any]]:
        """The answers the worker has sent since the last look: (key, placement or None)."""
        try:
            while chunk := os.read(self.from_worker, 1 << 16):
                self.inbox += chunk
        except BlockingIOError:
            pass
        else:  # end of file: the worker is gone; what it had is searched in the loop
            return self.stop()
        found = []
        while len(self.inbox) >= _FRAME.size:
            (size,) = _FRAME.unpack_from(self.inbox)
            if len(self.inbox) < _FRAME.size + size:
                break
            frame = bytes(self.inbox[_FRAME.size : _FRAME.size + size])
            del self.inbox[: _FRAME.size + size]
            key, placement = pickle.loads(frame)  # our own worker wrote it
            found.append((key, placement))
            self.asked.discard(key)
            if placement is None:
                self.inline.add(key)
            self.searching = None
        if self.searching is None and self.turns:
            self._next()
        return found

    def stop(self) -> list[tuple[Hashable, Any]]:
        """Stop the worker; every key still asked is answered None (searched in the loop)."""
        self.alive = False
        with contextlib.suppress(OSError):
            self.to_worker.close()
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait(timeout=5)
        left = [(key, None) for key in self.asked]
        self.inline.update(self.asked)
        self.asked.clear()
        self.queued.clear()
        self.turns.clear()
        self.searching = None
        return left

    def _next(self) -> None:
        """Give the worker the first search of the user whose turn it is."""
        uid = self.turns.popleft()
        waiting = self.queued[uid]
        key, occupancy, want = waiting.popleft()
        if waiting:
            self.turns.append(uid)
        else:
            del self.queued[uid]
        self.searching = key
        try:
            self._send((key, occupancy, want))
        except OSError:  # the worker died: answers() finds its end of file at the next look
            self.alive = False

    def _send(self, message: Any) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        self.to_worker.write(_FRAME.pack(len(data)) + data)
        self.to_worker.flush()


class Parking:
    """The broker's requests that wait for the worker, by the search they wait for. A parked
    connection's later requests wait behind it (``Connection.parked``), in order."""

    def __init__(self) -> None:
        self.on: dict[Hashable, list[Any]] = {}

    def park(
        self, placer: Placer | None, connection: Any, line: bytes, pending: PlacementPending
    ) -> None:
        assert placer is not None
        connection.parked = [line]
        connection.asks += 1
        self.on.setdefault(pending.key, []).append(connection)
        placer.ask(connection.peer.uid, pending)

    def answered(self, placer: Placer, host: Any) -> list[tuple[Any, bytes]]:
        """The worker's answers, remembered by ``host``; the parked requests to run again."""
        again: list[tuple[Any, bytes]] = []
        for key, placement in placer.answers():
            if placement is not None:
                host.remember(key, placement)
            for connection in self.on.pop(key, []):
                lines, connection.parked = connection.parked or [], None
                if connection.open:
                    again += [(connection, line) for line in lines]
        return again


def _read_frame(stream: Any) -> Any:
    head = stream.read(_FRAME.size)
    if len(head) < _FRAME.size:
        return None
    (size,) = _FRAME.unpack(head)
    return pickle.loads(stream.read(size))  # the broker, our parent, wrote it


def main() -> int:
    """The worker: searches what the broker sends until its pipe closes."""
    from gpualloc.errors import GpuallocError
    from gpualloc.placement.choose import searched

    source, sink = sys.stdin.buffer, sys.stdout.buffer
    first = _read_frame(source)
    if first is None:
        return 0
    topology, budget_s = first
    while (job := _read_frame(source)) is not None:
        key, occupancy, want = job
        try:
            placement = searched(topology, occupancy, want, budget_s=budget_s)
        except GpuallocError:  # the loop's own search says why, quickly
            placement = None
        data = pickle.dumps((key, placement), protocol=pickle.HIGHEST_PROTOCOL)
        try:
            sink.write(_FRAME.pack(len(data)) + data)
            sink.flush()
        except BrokenPipeError:
            return _broker_gone()
    return 0


def _broker_gone() -> int:
    """The broker died (``kill -9``) while the worker answered it: end quietly. The worker's
    stderr is the broker's log, where a traceback (this write's, then the interpreter's on
    flushing stdout at exit) reads as a failure of the worker, not of its parent."""
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, sys.stdout.fileno())
    os.close(null)
    return 0


if __name__ == "__main__":
    sys.exit(main())
