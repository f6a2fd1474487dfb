"""Atomic file replacement: readers see the old file or the new one, never half of either."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from pathlib import Path


def write_text_atomic(path: Path, text: str, *, mode: int | None = None, sync: bool = True) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same directory, fsync, rename.
    ``mode`` sets the new file's permissions (default: the temporary file's 0600). Without
    ``sync`` there is no fsync: the rename still makes the change atomic for every process
    (a killed writer included), only a crash of the machine may lose it.

    Without ``sync`` the temporary file's blocks are allocated before it is written: ext4
    (``auto_da_alloc``, its default) writes out a renamed file's not-yet-allocated data before
    the rename returns, about 1.5 ms a write, most of a broker's group commit (issue 43, point
    4). Allocated first, the data stays in the page cache like any write; a crash of the machine
    may then leave the file's blocks unwritten, which read as zeros, a file that does not parse
    (the broker sets such a ledger aside at start: its leases died with the boot).

    Whatever is at ``path`` is replaced, a link or a file another user planted included
    (root's Slurm hooks rely on it in a shared directory); a path a user names for output goes
    through :func:`write_user_output` instead.

    Raises ``OSError`` (the temporary file is removed) when the directory is not writable.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    # What tempfile.mkstemp does, without importing tempfile (and shutil, random) on every
    # command's path: a new name nobody else can have opened, created 0600.
    temporary = path.with_name(f".{path.name}.{os.urandom(6).hex()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    data = text.encode()
    descriptor = os.open(temporary, flags, 0o600)
    try:
        if mode is not None:
            os.fchmod(descriptor, mode)
        if not sync and data:
            with contextlib.suppress(OSError):  # a file system without it writes as before
                os.posix_fallocate(descriptor, 0, len(data))
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            if sync:
                os.fsync(handle.fileno())
        temporary.replace(path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def write_user_output(path: Path, text: str) -> None:
    """Write ``text`` to a path a user named for output (``-o``, ``--save-trace``): a link is
    followed (``/dev/stdout``), a device or a FIFO is written in place (never renamed over:
    run as root, that replaced ``/dev/full`` with a file), a FIFO nobody reads is ``ENXIO`` at
    once instead of a wait, and a regular file is replaced atomically."""
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    try:
        info = path.stat()
    except FileNotFoundError:
        info = None
    if info is None or stat.S_ISREG(info.st_mode):
        write_text_atomic(path, text)
        return
    if stat.S_ISDIR(info.st_mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    flags = os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC
    descriptor = os.open(path, flags)
    fcntl.fcntl(descriptor, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(text)
