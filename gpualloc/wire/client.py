"""Finding the host's broker and calling it.

Which socket a command uses is :mod:`.address`'s to say; a configured broker that does not
answer is an error (exit 18), never a silent fall-back to a file every user can write.

A call that loses its connection (the broker restarted, ``kill -9`` included) connects again
and sends the request once more: ``alloc`` names the lease id it wants, so a repeated request
returns the lease the first one made instead of making a second (see :mod:`.service`).

This module imports only the standard library's socket and json, so ``run`` and ``alloc`` start
as fast through the broker as without it.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpualloc.errors import BrokerError
from gpualloc.wire.address import BROKER_DIRECTORY, DEFAULT_SOCKET
from gpualloc.wire.protocol import KEEPALIVE_S, error_from, request_line

RECONNECT_S = 10.0
"""How long a client keeps trying to reach a broker that is restarting (its socket is there,
nobody accepts: a ``kill -9`` and a restart by systemd)."""
MISSING_S = 1.0
"""How long a client waits for a socket that is not there at all (a broker stopping and
starting again removes and makes it): a broker that is simply not running is said quickly."""
ANSWER_S = 10.0
"""How long a client waits in silence for the broker's answer (``host.broker_timeout``,
``GPUALLOC_BROKER_TIMEOUT``); a waiting job hears from the broker every
:data:`gpualloc.wire.protocol.KEEPALIVE_S` seconds, so only a stopped or stalled broker runs it
out (clients waited forever on a SIGSTOPped broker: tests/test_broker_deadlines.py). Slurm's
``MessageTimeout``, as :data:`gpualloc.config.BROKER_TIMEOUT_S` (not imported: this module
loads only the standard library's socket and json)."""
_GONE = (errno.ECONNREFUSED, errno.ENOENT, errno.ECONNRESET, errno.EPIPE, errno.EAGAIN)


class BrokerClient:
    """A connection to the broker; :meth:`call` sends one request and returns its result."""

    def __init__(
        self,
        path: Path,
        *,
        reconnect_s: float | None = RECONNECT_S,
        answer_s: float | None = None,
    ) -> None:
        self.path = path
        self.reconnect_s = RECONNECT_S if reconnect_s is None else reconnect_s
        self.answer_s = ANSWER_S if answer_s is None else answer_s
        self._socket: socket.socket | None = None
        self._reader: Any = None

    def __enter__(self) -> BrokerClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        if self._socket is not None:
            self._reader.close()
            self._socket.close()
            self._socket = self._reader = None

    def call(
        self,
        op: str,
        args: dict[str, Any] | None = None,
        *,
        on_event: Callable[[dict[str, Any]], None] | None = None,
        retry: bool = True,
    ) -> Any:
        """The result of ``op``; the broker's error as the exception the embedded ledger
        raises. With ``retry``, a lost connection is made again and the request sent again
        (with ``"retry": true`` in its arguments, so the broker knows it may be a repeat)."""
        line = request_line(op, args or {})
        deadline = time.monotonic() + self.reconnect_s
        while True:
            try:
                self._connect(deadline)
                assert self._socket is not None
                waiting = bool((args or {}).get("wait"))  # events every KEEPALIVE_S meanwhile
                silence = max(self.answer_s, 2 * KEEPALIVE_S) if waiting else self.answer_s
                self._socket.settimeout(silence)
                self._socket.sendall(line)
                return self._answer(on_event, silence)
            except (ConnectionError, BrokenPipeError) as lost:
                refusal = self._refusal()
                self.close()
                if refusal is not None:
                    raise refusal from None
                if not retry or time.monotonic() >= deadline:
                    raise self._unreachable(lost) from None
                line = request_line(op, {**(args or {}), "retry": True})
                time.sleep(0.05)

    def _connect(self, deadline: float) -> None:
        if self._socket is not None:
            return
        missing_until = time.monotonic() + MISSING_S
        while True:
            connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            try:
                connection.connect(str(self.path))
            except OSError as exc:
                connection.close()
                gone = exc.errno == errno.ENOENT and time.monotonic() >= missing_until
                if exc.errno not in _GONE or gone or time.monotonic() >= deadline:
                    raise self._unreachable(exc) from None
                time.sleep(0.05)
                continue
            try:
                check_server(connection, self.path)
            except BrokerError:
                connection.close()
                raise
            self._socket = connection
            self._reader = connection.makefile("rb")
            return

    def _answer(self, on_event: Callable[[dict[str, Any]], None] | None, silence: float) -> Any:
        while True:
            try:
                raw = self._reader.readline()
            except TimeoutError:
                self.close()  # the broker will not apply a request whose client has gone
                raise BrokerError(
                    f"the broker at {self.path} said nothing for {silence:g} s: it is busy or "
                    "stopped",
                    hint="try again; 'gpualloc doctor' checks the broker (GPUALLOC_BROKER_TIMEOUT "
                    "sets how long to wait)",
                ) from None
            if not raw:
                raise ConnectionResetError(errno.ECONNRESET, "the broker closed the connection")
            try:
                body = json.loads(raw)
            except ValueError:
                raise BrokerError(
                    f"the broker at {self.path} answered something that is not its protocol",
                    hint="is the socket gpualloc's? 'gpualloc doctor' checks the broker",
                ) from None
            if "event" in body:
                if on_event is not None:
                    on_event(body.get("status") or {})
                continue
            if body.get("ok"):
                return body.get("result")
            raise error_from(body)

    def _refusal(self) -> Exception | None:
        """The error the broker sent as it closed the connection, if it sent one: a broker
        that refuses a connection (too many open, too many opened a second) says why and
        closes it at once, often before the request is written, so the write fails with
        ``EPIPE`` while the reason waits unread."""
        if self._reader is None or self._socket is None:
            return None
        try:
            self._socket.settimeout(0.5)
            raw = self._reader.readline()
            body = json.loads(raw) if raw else None
        except (OSError, ValueError):
            return None
        if isinstance(body, dict) and body.get("ok") is False:
            return error_from(body)
        return None

    def _unreachable(self, exc: OSError) -> BrokerError:
        reason = exc.strerror or str(exc)
        leave = (
            f"or remove {BROKER_DIRECTORY} to leave broker mode"
            if str(self.path) == DEFAULT_SOCKET
            else "or unset GPUALLOC_BROKER / host.broker"
        )
        return BrokerError(
            f"the host's broker at {self.path} does not answer ({reason}): it is busy or stopped",
            hint="start it ('systemctl enable --now gpualloc.socket', or 'gpualloc serve'), "
            f"{leave}; 'gpualloc doctor' checks it",
        )


def check_server(connection: socket.socket, path: Path) -> None:
    """Refuse a server that is neither root nor this user (``SO_PEERCRED``): anyone who could
    put a socket where the broker's should be would read every request
    (tests/test_broker_access.py::test_a_client_sends_nothing_to_a_server_another_user_runs)."""
    raw = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    uid = int.from_bytes(raw[4:8], sys.byteorder)  # struct ucred: pid, uid, gid
    if uid not in (0, os.geteuid()):
        raise BrokerError(
            f"the socket {path} is served by uid {uid}, not by root: gpualloc will not send it "
            "a request",
            hint="someone put a socket where the host's broker listens; tell the administrator "
            "('gpualloc doctor' shows who owns the broker's files)",
        )
