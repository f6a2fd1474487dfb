"""Placement searches off the broker's loop.

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

No request, and no failure of the worker, takes it away from the others for longer than one
search (a worker that fails is replaced, never lost):

- a search that raises anything but a gpualloc error is answered as a refused request (one
  line; its traceback once in the broker's log) and the same request on the same host state
  is refused again without a search; the worker goes on (``tests/test_placement_worker.py``);
- a worker that ends (killed, out of memory, a crash in native code) is started again, at
  once the first :data:`RESTARTS` times in :data:`RESTART_WINDOW_S`, then once that window
  has passed (meanwhile searches run in the loop, under ``broker.placement_budget``); what it
  was searching is asked of the new worker, never of the loop (a search that kills a process
  would kill the broker there), and once it has been in flight at :data:`MAX_DEATHS` deaths
  it is refused (one line, logged once) without a search, as is the same request on the same
  host state after it; where no new worker can start, it is refused at once;
- a search still running :data:`STUCK_MARGIN_S` after its budget's end (1.5 times the budget:
  the search, then the greedy fallback's half) is abandoned: the worker is killed and
  replaced, and the request answered with the policy's greedy placement, which says so
  (``Placement.cut_short``).
"""

from __future__ import annotations

import contextlib
import math
import os
import pickle
import selectors
import struct
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

from gpualloc.errors import GpuallocError

if TYPE_CHECKING:
    from gpualloc.host.local import PlacementPending

MAX_ASKS = 2
"""Times one request may wait for the worker before it is searched in the loop."""
STUCK_MARGIN_S = 2.0
"""How long past its budget's end a search may run before the worker is taken for stuck."""
UNBUDGETED_S = 60.0
"""The budget a stuck worker is judged by when ``placement.time_budget`` sets none."""
RESTARTS = 5
RESTART_WINDOW_S = 60.0
"""A worker that ends is started again at once at most :data:`RESTARTS` times in this long."""
MAX_DEATHS = 2
"""Deaths of the worker a request may be in flight at before it is refused without a search
(one may be another cause's: the OOM killer, an administrator's kill)."""
MAX_REFUSED = 1024
"""Failed searches remembered (refused again without a search) before all are forgotten."""
FAILED = (
    "the broker's placement search failed on this request; nothing was changed (the broker's "
    "log has the traceback)"
)
KILLED = (
    f"the broker's placement worker died {MAX_DEATHS} times while searching this request: it "
    "is not searched again, and nothing was changed (the broker's log says more)"
)
KILLED_NO_WORKER = (
    "the broker's placement worker died while searching this request and cannot be started "
    "again for now; the request is not searched in the broker's loop, and nothing was changed"
)
_FRAME = struct.Struct("!I")


class Placer:
    """The broker's end of the worker: what was asked, by whom, and the answers. The worker
    has one search at a time (so the pipe never fills and the loop never blocks writing to
    it); the others wait here, each user's in order, users in turn. The placer registers the
    worker's pipe with the loop's ``selector`` itself, since it replaces the worker."""

    worker: tuple[str, ...] = ("-m", "gpualloc.broker.placer")
    """The worker's arguments to this interpreter: only the broker's own code sets them (a
    test gives a worker that dies on its first search, as native code that crashes would)."""

    def __init__(
        self,
        topology: Any,
        budget_s: float | None,
        *,
        selector: selectors.BaseSelector | None = None,
        mark: Any = None,
        log: Callable[[str], None] = lambda line: None,
        loop_budget_s: float | None = None,
    ) -> None:
        self.topology, self.budget_s, self.loop_budget_s = topology, budget_s, loop_budget_s
        self.selector, self.mark, self.log = selector, mark, log
        self.process: subprocess.Popen[bytes] | None = None
        self.inbox = bytearray()
        self.deferring = True
        """Whether a missing answer is asked of the worker now (the broker turns it off for a
        request that has waited :data:`MAX_ASKS` times)."""
        self.inline: set[Hashable] = set()
        """Keys the worker could not answer: searched in the loop, once."""
        self.refused: set[Hashable] = set()
        """Keys whose search failed in the worker: refused, without a search."""
        self.deaths: dict[Hashable, int] = {}
        """Keys in flight when a worker died, and how many times: asked of a worker again
        (never searched in the loop), refused without a search from :data:`MAX_DEATHS` on."""
        self.again: tuple[Hashable, Any, Any, int] | None = None
        """The search a worker died on, for the next worker before any other."""
        self.asked: set[Hashable] = set()
        """Keys in the worker or waiting for it."""
        self.searching: tuple[Hashable, Any, Any, int] | None = None
        """What the worker has now: key, occupancy, want, uid."""
        self.due = math.inf
        """When the worker's search is taken for stuck (``time.monotonic``)."""
        self.queued: dict[int, deque[tuple[Hashable, Any, Any]]] = {}
        self.turns: deque[int] = deque()
        """Users with searches waiting, in turn."""
        self.alive = False
        self.stopped = False
        self.starts: deque[float] = deque(maxlen=RESTARTS)
        """When the worker was last started again (the first start is not counted)."""
        self.why = ""
        """Why the last worker could not be started."""

    @classmethod
    def start(cls, topology: Any, budget_s: float | None, **loop: Any) -> Placer:
        placer = cls(topology, budget_s, **loop)
        placer._spawn(restart=False)
        if not placer.alive:
            raise OSError(0, placer.why)
        return placer

    def fileno(self) -> int:
        assert self.process is not None and self.process.stdout is not None
        return self.process.stdout.fileno()

    def defers(self, key: Hashable) -> bool:
        """Whether the search for ``key`` should wait for the worker; raises the refusal of a
        search that failed there."""
        if key in self.refused:
            raise GpuallocError(FAILED)
        deaths = self.deaths.get(key, 0)
        if deaths >= MAX_DEATHS:
            raise GpuallocError(KILLED)
        if key in self.inline:
            self.inline.discard(key)
            return False
        if not self.alive and not self.stopped and self._may_start():
            self._spawn()
            self.log(
                "the placement worker started again"
                if self.alive
                else f"warning: the placement worker could not start ({self.why})"
            )
        if deaths and not self.alive:
            raise GpuallocError(
                KILLED_NO_WORKER, hint=f"try again in {RESTART_WINDOW_S:g} s, once it can start"
            )
        return self.alive and (self.deferring or deaths > 0)

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

    def wake_at(self) -> float | None:
        """When the loop must look at the worker even if it says nothing (its search's due)."""
        return self.due if self.searching is not None else None

    def answers(self) -> list[tuple[Hashable, Any]]:
        """The answers the worker has sent since the last look: (key, placement or None). A
        worker that ended or is stuck is replaced here."""
        if not self.alive:
            return []
        ended = False
        try:
            while chunk := os.read(self.fileno(), 1 << 16):
                self.inbox += chunk
        except BlockingIOError:
            pass
        else:  # end of file: the worker is gone, after the answers it wrote
            ended = True
        found = []
        while len(self.inbox) >= _FRAME.size:
            (size,) = _FRAME.unpack_from(self.inbox)
            if len(self.inbox) < _FRAME.size + size:
                break
            frame = bytes(self.inbox[_FRAME.size : _FRAME.size + size])
            del self.inbox[: _FRAME.size + size]
            key, placement, failure = pickle.loads(frame)  # our own worker wrote it
            if failure is not None:
                self._refuse(key, failure)
            found.append((key, placement))
            self.asked.discard(key)
            if placement is None and failure is None:
                self.inline.add(key)
            self.searching = None
        if ended:  # what it had is searched in the loop
            return found + self._replace("ended", None)
        if self.searching is not None and time.monotonic() > self.due:
            return found + self._replace("stuck", self._cut_short())
        if self.searching is None and self.turns:
            self._next()
        return found

    def stop(self) -> list[tuple[Hashable, Any]]:
        """Stop the worker for good; every key still asked is answered None (searched in the
        loop)."""
        self.stopped = True
        self.again = None
        self._retire()
        left = [(key, None) for key in self.asked]
        self.inline.update(self.asked)
        self.asked.clear()
        self.queued.clear()
        self.turns.clear()
        self.searching = None
        return left

    def _refuse(self, key: Hashable, failure: str) -> None:
        uid = self.searching[3] if self.searching is not None else "?"
        self.log(f"internal error in the placement worker, on a request of uid {uid}:\n{failure}")
        if len(self.refused) >= MAX_REFUSED:
            self.refused.clear()
        self.refused.add(key)

    def _cut_short(self) -> Any:
        """The greedy answer to the search the stuck worker had, or None (searched in the
        loop) where the request cannot be placed at all."""
        from gpualloc.placement.choose import greedy_choice

        assert self.searching is not None
        _key, occupancy, want, _uid = self.searching
        budget = self.budget_s if self.budget_s is not None else UNBUDGETED_S
        why = (
            f"the placement worker's {want.policy} search ran past its {budget:g} s budget "
            "(placement.time_budget) and was stopped: this is a greedy choice, which may be "
            "worse than the best"
        )
        try:
            return greedy_choice(
                self.topology, occupancy, want, budget_s=self.loop_budget_s or 0.015, why=why
            )
        except Exception:  # cannot be placed (the loop's search says why), or a bug it logs
            return None

    def _replace(self, how: str, answer: Any) -> list[tuple[Hashable, Any]]:
        """The worker ``how`` ("ended", "stuck"): its search answered ``answer`` (None: asked
        of the new worker if it ended, else searched in the loop), the worker replaced, the
        searches waiting given to the new one."""
        found: list[tuple[Hashable, Any]] = []
        if self.searching is not None and how == "ended":
            found += self._died_on(self.searching)
        elif self.searching is not None:
            key = self.searching[0]
            found.append((key, answer))
            self.asked.discard(key)
            if answer is None:
                self.inline.add(key)
        self.searching = None
        self._retire()
        if self._may_start():
            self._spawn()
        restarted = "started again" if self.alive else "searches run in the loop for now"
        self.log(f"warning: the placement worker {how}: {restarted}")
        if self.again is not None and not self.alive:  # refused by defers(), not searched
            found.append((self.again[0], None))
            self.asked.discard(self.again[0])
            self.again = None
        if self.alive and (self.again is not None or self.turns):
            self._next()
        elif not self.alive:  # what waits for a worker is searched in the loop
            found += [(key, None) for key in self.asked]
            self.inline.update(self.asked)
            self.asked.clear()
            self.queued.clear()
            self.turns.clear()
        return found

    def _died_on(self, searching: tuple[Hashable, Any, Any, int]) -> list[tuple[Hashable, Any]]:
        """The worker died with ``searching`` in flight: it is asked of the next worker first,
        or, at its :data:`MAX_DEATHS`-th death, answered (refused by :meth:`defers`)."""
        key, uid = searching[0], searching[3]
        if len(self.deaths) >= MAX_REFUSED:
            self.deaths.clear()
        deaths = self.deaths[key] = self.deaths.get(key, 0) + 1
        if deaths < MAX_DEATHS:
            self.again = searching
            return []
        self.log(
            f"error: the placement worker died {deaths} times while searching a request of "
            f"uid {uid}: that request is refused from now on, without a search"
        )
        self.asked.discard(key)
        return [(key, None)]

    def _may_start(self) -> bool:
        return len(self.starts) < RESTARTS or time.monotonic() - self.starts[0] > RESTART_WINDOW_S

    def _spawn(self, *, restart: bool = True) -> None:
        if restart:
            self.starts.append(time.monotonic())
        try:
            process = subprocess.Popen(
                [sys.executable, *self.worker],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                close_fds=True,
            )
        except OSError as exc:
            self.why = exc.strerror or str(exc)
            return
        self.process, self.inbox, self.alive = process, bytearray(), True
        os.set_blocking(self.fileno(), False)
        if self.selector is not None:
            self.selector.register(self.fileno(), selectors.EVENT_READ, self.mark)
        try:
            self._send((self.topology, self.budget_s))
        except OSError as exc:
            self.why = exc.strerror or str(exc)
            self._retire()

    def _retire(self) -> None:
        """Kill the worker and close its pipes (taken out of the selector first: a new
        worker's pipe may get the same number)."""
        self.alive = False
        process, self.process = self.process, None
        if process is None:
            return
        assert process.stdin is not None and process.stdout is not None
        if self.selector is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(process.stdout.fileno())
        with contextlib.suppress(OSError):
            process.stdin.close()
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            process.kill()
            process.wait(timeout=5)
        process.stdout.close()

    def _next(self) -> None:
        """Give the worker the search a worker died on, else the first search of the user
        whose turn it is."""
        if self.again is not None:
            self.searching, self.again = self.again, None
        else:
            uid = self.turns.popleft()
            waiting = self.queued[uid]
            key, occupancy, want = waiting.popleft()
            if waiting:
                self.turns.append(uid)
            else:
                del self.queued[uid]
            self.searching = (key, occupancy, want, uid)
        key, occupancy, want, _uid = self.searching
        budget = self.budget_s if self.budget_s is not None else UNBUDGETED_S
        self.due = time.monotonic() + 1.5 * budget + STUCK_MARGIN_S
        # the worker died: answers() finds its end of file at the next look
        with contextlib.suppress(OSError):
            self._send((key, occupancy, want))

    def _send(self, message: Any) -> None:
        assert self.process is not None and self.process.stdin is not None
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        self.process.stdin.write(_FRAME.pack(len(data)) + data)
        self.process.stdin.flush()


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
    import traceback

    from gpualloc.placement.choose import searched

    source, sink = sys.stdin.buffer, sys.stdout.buffer
    first = _read_frame(source)
    if first is None:
        return 0
    topology, budget_s = first
    while (job := _read_frame(source)) is not None:
        key, occupancy, want = job
        placement, failure = None, None
        try:
            placement = searched(topology, occupancy, want, budget_s=budget_s)
        except GpuallocError:  # the loop's own search says why, quickly
            pass
        except Exception:  # a bug: this request is refused, the worker serves the next
            failure = traceback.format_exc()
        data = pickle.dumps((key, placement, failure), protocol=pickle.HIGHEST_PROTOCOL)
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
