"""The broker's listening socket: systemd's (socket activation) or one made in a directory no
other user may write: whoever may write it could put a socket of their own there."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from gpualloc.broker.limits import TOO_MANY_CONNECTS
from gpualloc.broker.peers import Peer, peer_of
from gpualloc.errors import BrokerBusy, BrokerError
from gpualloc.user_files import shown_path
from gpualloc.wire import protocol

if TYPE_CHECKING:
    from gpualloc.broker.limits import Limits

LISTEN_FDS_START = 3
"""The first descriptor systemd passes (``sd_listen_fds``)."""
MAX_SOCKET_PATH_BYTES = 107
"""The longest path a Unix socket's address holds (``sun_path`` is 108 bytes with its NUL)."""
BACKLOG = 256
"""The listen queue's length, which the loop drains each turn. Connections are counted per
user only once accepted, so the queue is shared by every user: a flood keeps it full whatever
its length, and a connection that gets in waits behind the whole queue, so a longer one (the
kernel's ``somaxconn``) makes the others wait longer, not less (``tests/test_broker_limits.py``;
what holds them is the broker's CPU priority, :data:`~.startup.NICE`)."""


def _staging(path: Path) -> Path:
    """The name the socket is bound under before it is renamed to ``path``."""
    return path.with_name(f".{path.name}.{os.getpid()}")


def socket_path_too_long(path: Path) -> str | None:
    """Why ``path`` is too long for a Unix socket's address (the name it is bound under first
    is a few bytes longer), or None."""
    size = len(os.fsencode(str(path)))
    longest = MAX_SOCKET_PATH_BYTES - (len(os.fsencode(str(_staging(path)))) - size)
    if size > longest:
        return (
            f"{shown_path(path)} is {size} bytes long; a Unix socket's path may have at most "
            f"{longest} here"
        )
    return None


def check_not_a_file(path: Path) -> None:
    """Refuse a path where something other than a socket is: it is never removed
    (tests/test_broker_access.py::test_serve_keeps_a_file_that_is_not_a_socket)."""
    if os.path.lexists(path) and not stat.S_ISSOCK(os.lstat(path).st_mode):
        raise BrokerError(
            f"{shown_path(path)} exists and is not a socket", hint="give --socket a path of its own"
        )


def activated() -> bool:
    """Whether systemd passed this process its socket (``sd_listen_fds``)."""
    return os.environ.get("LISTEN_PID") == str(os.getpid()) and os.environ.get("LISTEN_FDS") == "1"


def listening_socket(path: Path) -> socket.socket:
    """The socket to serve: systemd's (socket activation) when it passed one, else ``path``
    made now (mode 0666: every user may connect; the kernel names them). A stale socket file
    is replaced; one a live broker answers on is an error."""
    if activated():
        return socket.socket(fileno=LISTEN_FDS_START)
    too_long = socket_path_too_long(path)
    if too_long is not None:
        raise BrokerError(too_long, hint="configure a shorter host.broker path")
    check_not_a_file(path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    check_socket_directory(path.parent)
    if os.path.lexists(path):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except OSError as exc:
            if exc.errno not in (errno.ECONNREFUSED, errno.ENOTSOCK, errno.ENOENT):
                raise
            # A stale socket (a broker killed): left in place until the new one is renamed
            # over it, so that a client never finds no socket at all while this broker starts
            # (it waits only MISSING_S for a missing one, and a loaded host can take longer).
        else:
            raise BrokerError(
                f"another broker already serves {path}",
                hint="stop it first ('systemctl stop gpualloc.service'), or give --socket",
            )
        finally:
            probe.close()
    # Made under another name and renamed into place: a client never finds the socket before
    # its mode lets everyone connect (bind makes it with the umask's mode).
    staging = _staging(path)
    staging.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    listener.bind(str(staging))
    staging.chmod(0o666)
    listener.listen(BACKLOG)
    staging.rename(path)
    return listener


def check_socket_directory(directory: Path) -> None:
    """Refuse to listen in a directory that another user owns or may write: they could swap
    the socket for theirs, and read every request
    (tests/test_broker_access.py::test_serve_refuses_a_socket_directory_another_user_owns)."""
    info = directory.stat()
    if info.st_uid not in (0, os.geteuid()):
        raise BrokerError(
            f"{directory} belongs to uid {info.st_uid}: its owner could replace the socket",
            hint="give --socket a path in a directory of root's (e.g. /run/gpualloc)",
        )
    if info.st_mode & 0o022:
        raise BrokerError(
            f"{directory} may be written by others (mode {stat.S_IMODE(info.st_mode):04o}): "
            "they could replace the socket",
            hint="give --socket a path in a directory only root may write (e.g. /run/gpualloc)",
        )


def accepted(
    listener: socket.socket,
    limits: Limits,
    log: Callable[[str], None],
    close_gone: Callable[[int], None],
) -> Iterator[tuple[socket.socket, Peer]]:
    """The connections the listen queue holds now (at most :data:`BACKLOG`) that their
    users' limits allow, non-blocking; the others are refused at once (their reason, then the
    close). A user at ``broker.max_connections`` first has the connections it has hung up on
    closed (``close_gone``): their end of file may be read after the new connection. The
    queue is shared by every user until a connection is accepted and counted, so the loop
    drains it each turn, and the bound keeps one user's flood from holding the loop off the
    others' requests (``tests/test_broker_limits.py``)."""
    for _ in range(BACKLOG):
        try:
            sock, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:  # EMFILE: out of descriptors; the next turn tries again
            log(f"accept failed: {exc.strerror}")
            return
        sock.setblocking(False)
        peer = peer_of(sock)
        if not limits.connects.take(peer.uid):
            _send_and_close(sock, TOO_MANY_CONNECTS)
            continue
        count = limits.connections.get(peer.uid, 0)
        if count >= limits.max_connections and peer.uid != 0:
            close_gone(peer.uid)
            count = limits.connections.get(peer.uid, 0)
        if count >= limits.max_connections and peer.uid != 0:
            _send_and_close(
                sock,
                protocol.error_line(
                    BrokerBusy(
                        f"you have {count} connections to the broker open, this host's "
                        "limit (broker.max_connections)",
                        hint="close some (end idle gpualloc processes) and try again",
                    )
                ),
            )
            continue
        yield sock, peer


def _send_and_close(sock: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):
        sock.send(data)
    sock.close()
