"""``gpualloc serve``'s event loop: one thread, non-blocking sockets, the ledger in between.

One thread owns the ledger, so requests are serialised without any lock a client could hold:
the loop never waits on a client (every socket is non-blocking, answers are buffered), and a
request is handled only once its whole line has arrived. What a hostile or broken client can
do is bounded (docs/administration.md lists each bound with its test):

- a request over 64 KiB, or one not complete within :data:`~.protocol.REQUEST_DEADLINE_S`, gets
  an error (if it can be sent) and its connection is closed;
- one user holds at most ``broker.max_connections`` connections and makes at most
  ``broker.max_requests_per_s`` requests a second (a token bucket with twice that as burst);
  over either, an error with exit 18;
- an answer the client does not read piles up to :data:`MAX_UNREAD_BYTES`, then the connection
  is closed;
- a request that fails inside gpualloc (a bug) is logged with its traceback and answered with
  an internal error; the loop goes on.

Besides requests the loop wakes when a lease's process ends (its pidfd, :mod:`.watch`), for a
step of the watch's walk of ``/proc``, and every :data:`~.watch.LOOK_S`: it asks NVML again
(every :data:`PROCESS_REFRESH_S`), reaps dead leases, times out waiters, starts every waiter
whose turn it is (:meth:`.service.LedgerService.turns`) and tells waiting clients where they stand.

What a turn says goes out as it ends, after its ledger write (:meth:`Broker._in_batch`): each
connection's answers in one write, the log's lines in one (:class:`~.log.TurnLog`).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import time
import traceback
from collections.abc import Callable
from datetime import datetime, timezone
from functools import partial
from typing import Any

from gpualloc.broker.connection import Connection
from gpualloc.broker.limits import TOO_MANY_REQUESTS, Limits, request_cost
from gpualloc.broker.listener import accepted
from gpualloc.broker.log import TurnLog
from gpualloc.broker.peers import Peer
from gpualloc.broker.placer import MAX_ASKS, Parking, Placer
from gpualloc.broker.service import LedgerService, Started
from gpualloc.broker.watch import LOOK_S
from gpualloc.errors import BrokerError, GpuallocError, NotPermitted, RequestError, WaitTimedOut
from gpualloc.host.local import PlacementPending
from gpualloc.user_files import shown_repr
from gpualloc.wire import protocol

MAX_UNREAD_BYTES = 4 * 1024 * 1024
WAKE = "wake"
PLACER = "placer"
"""The selector's mark of the pipe a signal writes to (``signal.set_wakeup_fd``)."""
CLOSE = b""
"""In the answers held back for a batch: close the connection here (after what it was sent)."""
PROCESS_REFRESH_S = 2.0
USER_SLICE_S = 0.005
"""Broker time one user's requests may take in one turn of the loop; the rest of them wait for
the next turn, after the others' (a user who pipelines slow requests delays others by about
one request: tests/test_broker_limits.py). Root is never put off."""


class Broker:
    """The loop. ``log`` takes the lines of one turn (``gpualloc serve`` writes them to stderr:
    :func:`~.log.log_lines`)."""

    def __init__(
        self,
        service: LedgerService,
        listener: socket.socket,
        limits: Limits,
        *,
        idle_policy: Any = None,
        log: Callable[[list[str]], None] = lambda lines: None,
        search_budget_s: float | None = None,
    ) -> None:
        self.service = service
        self.search_budget_s = search_budget_s
        """The placement worker's budget (``placement.time_budget``); the loop's own searches
        have ``broker.placement_budget``."""
        self.parking = Parking()
        self.listener = listener
        self.limits = limits
        self.idle_policy = idle_policy
        self.log = TurnLog(log)
        self.selector = selectors.DefaultSelector()
        self.waiting: dict[str, Connection] = {}
        self.stopping = False
        self.next_look = 0.0
        self.next_refresh = time.monotonic() + PROCESS_REFRESH_S
        self.requests: list[tuple[Connection, bytes]] = []
        """Complete request lines read in this turn of the loop, answered in one batch."""
        self.held_back: list[tuple[Connection, bytes]] | None = None
        """Answers of the batch being handled, sent once it is written (None: no batch)."""
        self.reap_due = False
        self.unsent: dict[Connection, None] = {}
        """Connections with answers to send when the turn ends, in the order they were given."""

    # ---- the loop ------------------------------------------------------------------------

    def serve(self) -> None:
        wake_read, wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_write)  # a signal wakes the loop at once
        self.selector.register(wake_read, selectors.EVENT_READ, WAKE)
        self.start()
        for name in ("SIGTERM", "SIGINT"):
            signal.signal(getattr(signal, name), self._stop)
        self._start_placer()
        try:
            while not self.stopping:
                self.turn()
        finally:
            if self.service.host.placer is not None:
                self.service.host.placer.stop()
            self.log.flush()
        self.selector.close()

    def start(self) -> None:
        """Listen, and follow the leases the ledger holds: what serving begins with."""
        self.listener.setblocking(False)
        self.selector.register(self.listener, selectors.EVENT_READ, None)
        for lease_id in self.service.adopt():
            self.log(f"lease {lease_id} released: its job ended while no broker ran")
        self._register_pidfds()
        self.log.flush()

    def _start_placer(self) -> None:
        try:
            placer = Placer.start(
                self.service.host.topology,
                self.search_budget_s,
                selector=self.selector,
                mark=PLACER,
                log=self.log,
                loop_budget_s=self.service.host.placement_budget_s,
            )
        except OSError as exc:
            self.log(f"warning: no placement worker ({exc.strerror}): searches run in the loop")
            return
        self.service.host.placer = placer

    def turn(self) -> None:
        """One turn of the loop: wait for something to do, do it, say what it made."""
        placer = self.service.host.placer
        due = placer.wake_at() if placer is not None else None
        deadline = min(filter(None, (self.service.next_deadline(), due)), default=None)
        wake = self.next_look if deadline is None else min(self.next_look, deadline)
        step = self.service.watch.wake_at() or wake  # the next step of its pass over /proc
        timeout = 0.0 if self.requests else max(0.0, min(wake, step) - time.monotonic())
        for key, mask in self.selector.select(timeout):
            self._event(key, mask)
        if due is not None and time.monotonic() > due:  # a stuck worker is replaced
            self._placed()
        if time.monotonic() >= step:
            self._guarded(self.service.watch.step)
        look = time.monotonic() >= wake
        if self.requests or self.reap_due or look:
            self._in_batch(look)
        if look:
            self.next_look = time.monotonic() + LOOK_S
        self.log.flush()  # before the answers: what a client was answered is in the log
        unsent, self.unsent = self.unsent, {}
        for connection in unsent:
            self._flush(connection)

    def _in_batch(self, look: bool) -> None:
        """Everything that arrived in this turn of the loop, in one group commit: the answers
        go out only once the ledger is written. A failed write sends none of them: one that
        fails as gpualloc knows (a full disk) is said to each of their clients, any other
        closes their connections, so that the clients send the requests again."""
        self.held_back = []
        queued_before = set(self.waiting)
        try:
            with self.service.store.batch():
                if self.reap_due or look:
                    self.reap_due = False
                    self._guarded(self._reap_and_start)
                if look:
                    self._look()
                requests, self.requests = self.requests, []
                spent: dict[int, float] = {}
                for connection, line in requests:
                    uid = connection.peer.uid
                    if connection.parked is not None:  # behind its request that waits
                        connection.parked.append(line)
                        continue
                    if uid and spent.get(uid, 0.0) >= USER_SLICE_S:
                        self.requests.append((connection, line))  # the next turn, in order
                        continue
                    if connection.open and not connection.closing:
                        began = time.perf_counter()
                        self._request(connection, line)
                        spent[uid] = spent.get(uid, 0.0) + time.perf_counter() - began
        except GpuallocError as failed:  # a full disk, say: said to every client of the batch
            self.log(f"error: the ledger could not be written: {failed.message}")
            held_back, self.held_back = self.held_back, None
            told = protocol.error_line(failed)
            for connection in self._failed_batch(held_back, queued_before):
                self._send(connection, told)
                self._close(connection, flush=True)
            return
        except Exception:
            self.log("error: the ledger could not be written:\n" + traceback.format_exc())
            held_back, self.held_back = self.held_back, None
            for connection in self._failed_batch(held_back, queued_before):
                self._close(connection)
            return
        held_back, self.held_back = self.held_back, None
        for connection, data in held_back:
            if data is CLOSE:
                self._close(connection, flush=True)
            else:
                self._send(connection, data)

    def _failed_batch(
        self, held_back: list[tuple[Connection, bytes]], queued_before: set[str]
    ) -> list[Connection]:
        """The clients of a batch whose write failed: those with an answer held back, and
        those whose job it queued, which have no answer yet: their waiters were never
        written, and without this they heard nothing until their deadline (a waiter on a
        full state disk, tests/test_broker_deadlines.py)."""
        clients = [connection for connection, _ in held_back]
        clients += [self.waiting[w] for w in self.waiting.keys() - queued_before]
        return list(dict.fromkeys(clients))

    def _stop(self, signum: int, frame: object) -> None:
        self.stopping = True

    def _event(self, key: selectors.SelectorKey, mask: int) -> None:
        if key.data is None:
            self._accept()
        elif key.data is WAKE:
            with contextlib.suppress(OSError):
                os.read(key.fd, 512)
        elif key.data is PLACER:
            self._placed()
        elif isinstance(key.data, Connection):
            if mask & selectors.EVENT_READ:
                self._read(key.data)
            if mask & selectors.EVENT_WRITE and key.data.open:
                self.unsent[key.data] = None
        else:  # "pidfd": the lease's process ended
            self.selector.unregister(key.fd)
            os.close(key.fd)
            self.service.watch.ended(key.fd)
            self.reap_due = True

    def _look(self) -> None:
        if time.monotonic() >= self.next_refresh:
            self._guarded(self.service.refresh_processes)
            self.next_refresh = time.monotonic() + PROCESS_REFRESH_S
        for waiter_id, timeout_s in self.service.expired():
            connection = self.waiting.pop(waiter_id, None)
            reason = connection.said.get(waiter_id, (0, ""))[1] if connection else ""
            self._guarded(partial(self.service.leave, waiter_id))
            if connection is not None:
                connection.waiters.discard(waiter_id)
                self._send(
                    connection,
                    protocol.error_line(
                        WaitTimedOut(
                            f"no GPUs for this job within {timeout_s:g} s"
                            + (f" ({reason})" if reason else ""),
                            hint="raise --timeout, or see 'gpualloc status'",
                        )
                    ),
                )
        for line in self._guarded(self.service.end_overdue) or ():
            self.log(line)
        self._tell_waiters()
        now = time.monotonic()
        for key in list(self.selector.get_map().values()):
            connection = key.data
            if (
                isinstance(connection, Connection)
                and connection.begun is not None
                and now - connection.begun > protocol.REQUEST_DEADLINE_S
            ):
                self._refuse(connection, "the request did not arrive in time")
            elif (
                isinstance(connection, Connection)
                and connection.open
                and not connection.waiters
                and now - connection.last_heard() > self.limits.idle_timeout_s
            ):
                self._close(connection)  # idle: asks nothing, waits for nothing, reads nothing

    def _guarded(self, work: Callable[[], Any]) -> Any:
        """Run ``work``; a failure is logged, never the end of the broker."""
        try:
            return work()
        except GpuallocError as problem:
            self.log(f"error: {problem.message}")
        except Exception:  # a bug: keep serving everyone else
            self.log("internal error:\n" + traceback.format_exc().rstrip())
        return None

    def _reap_and_start(self) -> None:
        for lease_id in self.service.reap():
            self.log(f"lease {lease_id} released: its job ended")
        self._started(self.service.turns())

    def _started(self, started: list[Started]) -> None:
        for start in started:
            connection = self.waiting.pop(start.waiter_id, None)
            if start.allocation is None:  # its turn failed: it alone hears why
                assert start.error is not None
                self.log(f"waiter {start.waiter_id} dropped: {start.error.message}")
                if connection is not None and connection.open:
                    connection.waiters.discard(start.waiter_id)
                    self._send(connection, protocol.error_line(start.error))
                continue
            lease = start.allocation.lease
            if connection is None or not connection.open:
                self.service.host.release(lease.id)  # its client went away meanwhile
                continue
            connection.waiters.discard(start.waiter_id)
            connection.unread.append(lease.id)
            self.log(f"{lease.user}: lease {lease.id} from the queue: {_gpus(lease)}")
            self._send(connection, protocol.result_line(start.answer))
        self._register_pidfds()

    def _tell_waiters(self) -> None:
        if not self.waiting:
            return
        positions = self._guarded(self.service.positions) or {}
        for waiter_id, status in positions.items():
            connection = self.waiting.get(waiter_id)
            if connection is None:
                continue
            said = (status["position"], status["reason"], status["holders"])
            now = time.monotonic()
            quiet = now - connection.said_at.get(waiter_id, 0.0) >= protocol.KEEPALIVE_S
            if connection.said.get(waiter_id) != said or quiet:
                connection.said[waiter_id] = said
                connection.said_at[waiter_id] = now
                self._send(connection, protocol.event_line("waiting", status))

    def _register_pidfds(self) -> None:
        for fd in self.service.old_fds:
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(fd)
            os.close(fd)
        self.service.old_fds.clear()
        for fd, _lease_id in self.service.new_fds:
            self.selector.register(fd, selectors.EVENT_READ, "pidfd")
        self.service.new_fds.clear()

    # ---- connections ---------------------------------------------------------------------

    def _accept(self) -> None:
        for sock, peer in accepted(self.listener, self.limits, self.log, self._close_gone):
            self.limits.connections[peer.uid] = self.limits.connections.get(peer.uid, 0) + 1
            connection = Connection(sock, peer)
            self.selector.register(sock, selectors.EVENT_READ, connection)

    def _close_gone(self, uid: int) -> None:
        """Close ``uid``'s connections whose clients have hung up and sent nothing unread: a
        client that closes its connections and opens another at once is not refused for those
        whose end of file the loop has yet to read (``tests/test_broker_limits.py``)."""
        for key in list(self.selector.get_map().values()):
            held = key.data
            if isinstance(held, Connection) and held.peer.uid == uid and held.gone():
                self._close(held)

    def _read(self, connection: Connection) -> None:
        try:
            data = connection.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # ECONNRESET: it closed with answers unread
            connection.reset, data = True, b""
        if not data:
            self._close(connection)
            return
        if connection.unread and connection.read_all():  # it has read its leases' answers
            connection.unread.clear()
        connection.inbox += data
        connection.active = time.monotonic()
        while connection.open:
            end = connection.inbox.find(b"\n")
            if end < 0:
                break
            if end > protocol.MAX_REQUEST_BYTES:
                break
            self.requests.append((connection, bytes(connection.inbox[:end])))
            del connection.inbox[: end + 1]
        if not connection.open:
            return
        if len(connection.inbox) > protocol.MAX_REQUEST_BYTES:
            self._refuse(connection, f"a request is at most {protocol.MAX_REQUEST_BYTES} bytes")
            return
        connection.begun = (connection.begun or time.monotonic()) if connection.inbox else None

    def _request(self, connection: Connection, line: bytes) -> None:
        peer = connection.peer
        try:
            if self.limits.exhausted(peer.uid):  # a flood: said once, then hung up on
                self._refuse_flood(connection)
                return
            op, args = protocol.parse_request(line)
            if not self.limits.take(peer.uid, request_cost(op, args)):
                self._refuse_flood(connection)
                return
            started = time.perf_counter()
            placer = self.service.host.placer
            if placer is not None:
                placer.deferring = connection.asks < MAX_ASKS
            try:
                answer = self._handle(connection, op, args)
            finally:
                self.limits.charge_time(peer.uid, time.perf_counter() - started)
            connection.asks = 0
        except protocol.VersionMismatch as mismatch:
            self._send(connection, protocol.error_line(mismatch))
            self._close(connection, flush=True)
            return
        except PlacementPending as pending:  # the worker searches; the request waits for it
            self.parking.park(self.service.host.placer, connection, line, pending)
            return
        except GpuallocError as problem:
            answer = protocol.error_line(problem)
        except UnicodeEncodeError:  # a lone surrogate where no check expected text
            answer = protocol.error_line(
                RequestError(
                    "the request holds text that is not UTF-8 (a lone surrogate)",
                    hint="send UTF-8 text (a command's words may be any bytes)",
                )
            )
        except Exception:
            self.log(f"internal error in a request of uid {peer.uid}:\n{traceback.format_exc()}")
            answer = protocol.error_line(
                GpuallocError("the broker failed on this request (its log has the traceback)")
            )
        self._register_pidfds()
        if answer is not None:
            self._send(connection, answer)

    def _placed(self) -> None:
        """The worker's answers: remembered, and the requests that waited for them run again
        (in the next batch, before anything their connections sent later)."""
        placer = self.service.host.placer
        assert placer is not None
        self.requests += self.parking.answered(placer, self.service.host)

    def _handle(self, connection: Connection, op: str, args: dict[str, Any]) -> bytes | None:
        peer, service = connection.peer, self.service
        if op in protocol.CHANGES and connection.gone():
            self.log(f"a {op} of uid {peer.uid} whose client has gone: not applied")
            return None
        if op == "hello":
            return protocol.result_line(self._hello(peer))
        if op == "alloc":
            asked = datetime.now(timezone.utc)
            made = service.alloc(peer, args)
            if isinstance(made, str):  # queued: the answer comes when it starts
                self.waiting[made] = connection
                connection.waiters.add(made)
                self._started(service.turns())
                if made in self.waiting:
                    self._tell_waiters()
                return None
            allocation, answer = made
            lease = allocation.lease
            if lease.created >= asked:  # made now, not a lease a request sent again made
                connection.unread.append(lease.id)
            self.log(f"{lease.user}: lease {lease.id}: {_gpus(lease)}")
            return protocol.result_line(answer)
        if op == "confirm":
            service.confirm(peer, args)
            return protocol.result_line({})
        if op == "release":
            result = service.release(peer, args)
            for lease in result["released"]:
                self.log(f"{lease['user']}: lease {lease['id']} released by uid {peer.uid}")
            self._started(service.turns())
            return protocol.result_line(result)
        if op in ("adopt", "exited"):
            self.log((service.adopt_job if op == "adopt" else service.exited)(peer, args))
            self._started(service.turns())
            return protocol.result_line({})
        if op == "evict":
            return protocol.result_line(service.evict(peer, args))
        if op == "snapshot":
            return protocol.result_line(service.snapshot(args))
        if op == "gc":
            result = service.gc(self.idle_policy)
            self._started(service.turns())
            return protocol.result_line(result)
        if op == "slurm":
            if not peer.root:
                raise NotPermitted("only root's Slurm hooks may record Slurm jobs")
            from gpualloc.broker.slurm_requests import slurm_request

            result = slurm_request(service.host, args)
            self._started(service.turns())
            return protocol.result_line(result)
        raise BrokerError(f"unknown request {shown_repr(op)}")

    def _hello(self, peer: Peer) -> dict[str, Any]:
        from gpualloc import __version__

        store = self.service.host.ledger_store()
        return {
            "protocol": protocol.VERSION,
            "gpualloc": __version__,
            "broker_pid": os.getpid(),
            "broker_uid": os.geteuid(),
            "you": {"uid": peer.uid, "gid": peer.gid, "pid": peer.pid},
            "state_dir": str(store.directory.path),
            "ledger": str(store.directory.ledger_file),
            "topology": self.service.host.topology.name,
            "gpus": self.service.host.topology.gpu_count,
            "waiting": len(self.waiting),
        }

    def _send(self, connection: Connection, data: bytes) -> None:
        if not connection.open:
            return
        # Not idle while it is being answered: a waiter's answer is held back until its batch
        # is written, and its connection, with no waiter left, would otherwise be closed as
        # idle in the same turn (tests/test_broker_deadlines.py).
        connection.active = time.monotonic()
        if self.held_back is not None:  # inside a batch: after its commit
            self.held_back.append((connection, data))
            return
        connection.outbox += data
        if len(connection.outbox) > MAX_UNREAD_BYTES:
            self._flush(connection)  # what the socket takes now is the client's to read
            if len(connection.outbox) > MAX_UNREAD_BYTES:
                self._close(connection)
            return
        self.unsent[connection] = None  # with the turn's other answers, in one write

    def _flush(self, connection: Connection) -> None:
        if not connection.open:
            return
        try:
            while connection.outbox:
                sent = connection.sock.send(connection.outbox)
                del connection.outbox[:sent]
                connection.progress = time.monotonic()
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self._close(connection)
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if connection.outbox else 0)
        self.selector.modify(connection.sock, events, connection)

    def _refuse_flood(self, connection: Connection) -> None:
        self._send(connection, TOO_MANY_REQUESTS)
        self._close(connection, flush=True)

    def _refuse(self, connection: Connection, why: str) -> None:
        self._send(connection, protocol.error_line(BrokerError(why, hint="see gpualloc.broker")))
        self._close(connection, flush=True)

    def _close(self, connection: Connection, *, flush: bool = False) -> None:
        if not connection.open:
            return
        if flush and self.held_back is not None:  # after the batch's answers
            connection.closing = True
            self.held_back.append((connection, CLOSE))
            return
        if flush and connection.outbox:
            try:
                connection.sock.setblocking(True)
                connection.sock.settimeout(0.1)
                connection.sock.sendall(connection.outbox)
                connection.outbox.clear()
            except OSError:
                pass
        held = self.held_back is not None and any(c is connection for c, _ in self.held_back)
        if connection.reset or connection.outbox or held:  # it never had its leases' answers
            for lease_id in connection.unread:
                self.log(f"lease {lease_id} released: its client went before reading its id")
                self._guarded(partial(self.service.host.release, lease_id))
                self.service.forget(lease_id)
        connection.open = False
        self.selector.unregister(connection.sock)
        connection.sock.close()
        uid = connection.peer.uid
        self.limits.connections[uid] = max(0, self.limits.connections.get(uid, 1) - 1)
        for waiter_id in connection.waiters:  # a waiter whose client went away
            self.waiting.pop(waiter_id, None)
            self._guarded(partial(self.service.leave, waiter_id))
        connection.waiters.clear()


def _gpus(lease: Any) -> str:
    from gpualloc.ledger.occupancy import held_devices

    return held_devices(lease)
