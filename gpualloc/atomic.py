"""Atomic file replacement: readers see the old file or the new one, never half of either."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from pathlib import Path

from gpualloc.errors import FileAccessError
from gpualloc.user_files import names_anything, shown_path


def write_text_atomic(
    path: Path,
    text: str,
    *,
    mode: int | None = None,
    sync: bool = True,
    create_parents: bool = True,
) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same directory, fsync, rename.
    ``mode`` sets the new file's permissions (default: the temporary file's 0600). Without
    ``sync`` there is no fsync: the rename still makes the change atomic for every process
    (a killed writer included), only a crash of the machine may lose it.

    Without ``sync`` the temporary file's blocks are allocated before it is written: ext4
    (``auto_da_alloc``, its default) writes out a renamed file's not-yet-allocated data before the
    rename returns (Documentation/admin-guide/ext4.rst in the Linux sources), most of a broker's
    group commit. Allocated first, the data stays in the page cache like any write; a crash of the
    machine may then leave the file's blocks unwritten, which read as zeros, a file that does not
    parse (the broker sets such a ledger aside at start: its leases died with the boot).

    Whatever is at ``path`` is replaced, a link or a file another user planted included
    (root's Slurm hooks rely on it in a shared directory); a path a user names for output goes
    through :func:`write_user_output` instead.

    gpualloc's own files get their directories made (``create_parents``); a user's never do.
    Raises ``OSError`` (the temporary file is removed) when the directory is not writable.
    """
    if create_parents:
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


def write_output(path: Path, text: str, option: str) -> None:
    """:func:`write_user_output`, a failure one :class:`~gpualloc.errors.FileAccessError`
    (exit 8) naming ``option`` and the path, for every command that writes a file a user
    named; a missing directory is named, never made (``tests/test_bad_input_files.py``)."""
    try:
        write_user_output(path, text)
    except OSError as exc:
        shown = shown_path(path)
        hint: str | None
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise missing_directory(option, path) from None
        if exc.errno == errno.ENXIO:  # O_NONBLOCK's answer for a FIFO with no reader
            reason, hint = "no process reads that pipe", "start the pipe's reader first"
        else:
            reason, hint = exc.strerror or str(exc), _WHAT_TO_DO.get(exc.errno or 0)
        raise FileAccessError(f"cannot write {option} {shown}: {reason}", hint=hint) from None


_WHAT_TO_DO = {
    errno.EACCES: "give a path in a directory you may write",
    errno.EPERM: "give a path in a directory you may write",
    errno.EROFS: "give a path on a writable file system",
    errno.ENOSPC: "free some space, or write elsewhere",
    errno.EISDIR: "name a file in it",
}
"""errno -> the hint of :func:`write_output`."""


def missing_directory(option: str, path: Path) -> FileAccessError:
    """The error for output into a directory that does not exist (or a path through a file):
    the first missing directory on the way named, and how to make it. gpualloc makes none: a
    typo in ``-o`` made ``/resluts/`` at the root of the file system for some writers."""
    directory = path.absolute().parent
    while directory.parent != directory and not _is_directory(directory.parent):
        directory = directory.parent
    cannot = f"cannot write {option} {shown_path(path)}:"
    if names_anything(directory):
        return FileAccessError(
            f"{cannot} {shown_path(directory)} is not a directory", hint="give another path"
        )
    return FileAccessError(
        f"{cannot} the directory {shown_path(directory)} does not exist",
        hint=f"create it first (mkdir -p {shown_path(path.parent)}), or give another path",
    )


def check_output_directory(path: Path, option: str) -> None:
    """Refuse now, before the work, output that :func:`write_output` would refuse at the end
    for its missing directory."""
    if not _is_directory(path.absolute().parent):
        raise missing_directory(option, path)


def _is_directory(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:
        return False


def write_user_output(path: Path, text: str) -> None:
    """Write ``text`` to a path a user named for output (``-o``, ``--save-trace``): a link is
    followed (``/dev/stdout``), a device or a FIFO is written in place (never renamed over:
    run as root, that replaced ``/dev/full`` with a file), a FIFO nobody reads is ``ENXIO`` at
    once instead of a wait, and a regular file is replaced atomically. No directory is made:
    a missing one is ``FileNotFoundError``."""
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    try:
        info = path.stat()
    except FileNotFoundError:
        info = None
    if info is None or stat.S_ISREG(info.st_mode):
        write_text_atomic(path, text, create_parents=False)
        return
    if stat.S_ISDIR(info.st_mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    flags = os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC
    descriptor = os.open(path, flags)
    fcntl.fcntl(descriptor, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(text)
