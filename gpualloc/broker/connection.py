"""One client connection of the broker: its peer, what it sent and what it is sent."""

from __future__ import annotations

import fcntl
import socket
import struct
import termios
import time
from typing import Any

from gpualloc.broker.peers import Peer


class Connection:
    def __init__(self, sock: socket.socket, peer: Peer) -> None:
        self.sock = sock
        self.peer = peer
        self.inbox = bytearray()
        self.outbox = bytearray()
        self.begun: float | None = None
        """When the request now arriving began (None: no partial request)."""
        self.waiters: set[str] = set()
        self.said: dict[str, tuple[Any, ...]] = {}
        self.said_at: dict[str, float] = {}
        self.open = True
        self.closing = False
        """Closed once the batch's answers are out: its further requests are not read."""
        self.active = time.monotonic()
        """When it last sent anything (idle connections are closed: ``broker.idle_timeout``)."""
        self.progress = self.active
        """When its client last took some of what it was sent: one that reads nothing for
        ``broker.idle_timeout`` is closed too, whatever its unread answers hold."""
        self.parked: list[bytes] | None = None
        """Its requests waiting for the placement worker, in order (:mod:`.placer`)."""
        self.asks = 0
        """Times its first parked request has asked the worker."""
        self.unread: list[str] = []
        """Leases its requests made whose answers it has not been seen to read: released if
        it goes before reading them (an applied change is one its client was told of)."""
        self.reset = False
        """It closed with something it was sent unread (Linux then gives its peer ECONNRESET,
        ``unix_release_sock`` in net/unix/af_unix.c; a clean close reads as end of file)."""

    def read_all(self) -> bool:
        """Whether the client has taken everything it was sent: nothing in the outbox, and
        none of it still in the kernel (SIOCOUTQ: a Unix socket's bytes its peer has not
        read, ``unix_ioctl`` in net/unix/af_unix.c)."""
        if self.reset or self.outbox:
            return False
        try:
            queued = fcntl.ioctl(self.sock.fileno(), termios.TIOCOUTQ, bytes(4))
        except OSError:
            return False
        return struct.unpack("i", queued)[0] == 0

    def last_heard(self) -> float:
        """When the client last showed it is there (monotonic): while answers it was sent wait
        unread, when it last took some of them, whatever it sent since (a request a minute
        kept a connection that read nothing, and its 4 MiB of answers, open for good); else
        that or its last request."""
        if self.outbox or not self.read_all():
            return self.progress
        return max(self.active, self.progress)

    def gone(self) -> bool:
        """Whether the client closed its end (a request it sent before leaving is not applied:
        it timed out waiting, or was killed, and will not hear the answer)."""
        try:
            return self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            self.reset = True
            return True
