"""Opening files in the shared state directory without trusting whatever is found there.

Every user of the host may create files in the state directory (mode 1777, like ``/tmp``), so any
name gpualloc uses may have been planted by someone else before gpualloc first creates it: a
symbolic link to a file of root's, a FIFO that blocks the opener forever, a directory, a file
of another user's with a mode that locks others out. So every open here

- never follows a symbolic link (``O_NOFOLLOW``) and never blocks (``O_NONBLOCK``: opening a
  FIFO returns at once, or fails with ``ENXIO``, instead of waiting for a peer);
- never creates over an existing file (``O_CREAT`` only with ``O_EXCL``): with Linux's
  ``fs.protected_regular``, ``O_CREAT`` on another user's file in a sticky directory fails even
  when the file itself is writable;
- checks what it opened with ``fstat`` (the object behind the descriptor, not the name, so
  nothing can be swapped in between) and accepts only a regular file.

What it refuses becomes a :class:`UnsafeFile` error that names the file, what it is and who owns
it, with the remedy: a clear error within milliseconds, never a hang. Root may remove anything
in a sticky directory, so gpualloc running as root (a Slurm prolog) removes a planted object and
creates the file anew (:func:`replace_planted`); a user cannot, and is told who can.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from gpualloc.errors import FileAccessError, GpuallocError, LedgerError
from gpualloc.user_files import describe_kind

SAFE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class UnsafeFile(LedgerError):
    """A name in the state directory is not the regular file gpualloc expects there."""


def owner_name(uid: int) -> str:
    """The user name of ``uid`` (the number when it has none)."""
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def owner_or_root(owner: str) -> str:
    """Who may remove a file ``owner`` owns: ``alice or root``, but ``root`` once."""
    return owner if owner == "root" else f"{owner} or root"


def _refusal(path: Path, what: str) -> UnsafeFile:
    try:
        info = os.lstat(path)
        what = describe_kind(info.st_mode)
        owner = owner_name(info.st_uid)
    except OSError:
        owner = "unknown"
    return UnsafeFile(
        f"{path} is a {what} (owned by {owner}), not the regular file gpualloc keeps there",
        hint=f"it was put there by hand or by a hostile user: {owner_or_root(owner)} must "
        f"remove it ('rm {path}'); a gpualloc run as root replaces it",
    )


def open_shared(
    path: Path, flags: int, *, create_mode: int | None = None, replace_as_root: bool = False
) -> tuple[int, os.stat_result]:
    """Open ``path`` (``flags`` is the access mode: ``O_RDONLY``, ``O_WRONLY``, ``O_RDWR``,
    plus ``O_APPEND`` if wanted) under the rules of the module docstring.

    With ``create_mode`` a missing file is created (exclusively) with that mode, set with
    ``fchmod`` so that the umask does not narrow a file every user must share. With
    ``replace_as_root``, gpualloc running as root removes a planted object and opens again
    (:func:`replace_planted`). Returns the descriptor (close-on-exec, non-blocking) and its
    ``fstat``. Raises FileNotFoundError when the file is missing and not to be created,
    :class:`UnsafeFile` when it is not a regular file, PermissionError when it is one this user
    may not open so.
    """
    try:
        return _open_checked(path, flags, create_mode)
    except UnsafeFile:
        if not (replace_as_root and replace_planted(path)):
            raise
    return _open_checked(path, flags, create_mode)


def _open_checked(path: Path, flags: int, create_mode: int | None) -> tuple[int, os.stat_result]:
    for _ in range(3):  # a file removed between the two opens is created on the next round
        try:
            descriptor = os.open(path, flags | SAFE_FLAGS)
        except FileNotFoundError:
            if create_mode is None:
                raise
            try:
                descriptor = os.open(path, flags | SAFE_FLAGS | os.O_CREAT | os.O_EXCL, create_mode)
            except FileExistsError:
                continue  # created by someone else just now: open theirs
            os.fchmod(descriptor, create_mode)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.EOPNOTSUPP):
                # ELOOP: a symlink under O_NOFOLLOW; ENXIO: a FIFO without a reader, or a socket
                raise _refusal(path, "special file") from None
            raise
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            os.close(descriptor)
            raise _refusal(path, describe_kind(info.st_mode))
        return descriptor, info
    raise FileExistsError(errno.EEXIST, "created and removed again repeatedly", str(path))


def read_shared(path: Path, *, replace_as_root: bool = False) -> tuple[str, os.stat_result]:
    """The text of the regular file ``path`` and its ``fstat`` (whose owner the caller may have
    to check); FileNotFoundError if missing (also once root removed a planted object)."""
    descriptor, info = open_shared(path, os.O_RDONLY, replace_as_root=replace_as_root)
    with os.fdopen(descriptor, "rb") as handle:
        return handle.read().decode("utf-8", errors="replace"), info


def replace_planted(path: Path) -> bool:
    """As root: remove whatever non-regular object or foreign file sits at ``path`` so that it
    can be created anew. Returns True when something was removed. Users cannot (the sticky
    bit), and get :class:`UnsafeFile` from :func:`open_shared` instead."""
    if os.geteuid() != 0:
        return False
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISDIR(info.st_mode):
        return False  # never rmtree a directory someone made: refuse instead
    path.unlink()
    return True


def adopt(descriptor: int, info: os.stat_result, mode: int) -> None:
    """As root, make a shared file root's own with ``mode``: a user who created it could
    otherwise remove it (the sticky bit lets a file's owner do that) or narrow its mode, and so
    lock every other user out. Nothing for other users."""
    if os.geteuid() != 0:
        return
    if info.st_uid != 0 or info.st_gid != 0:
        os.fchown(descriptor, 0, 0)
    if stat.S_IMODE(info.st_mode) != mode:
        os.fchmod(descriptor, mode)


def access_error(path: Path, exc: OSError, doing: str, *, changed: bool = False) -> GpuallocError:
    """Why ``path`` could not be read or written, with the remedy that fits the cause."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        state = (
            "the ledger may be torn; the next gpualloc recovers it from your good copy"
            if changed
            else "the ledger is unchanged"
        )
        return FileAccessError(
            f"cannot {doing} {path}: the file system is full ({exc.strerror}); {state}",
            hint=f"free space on the file system of {path.parent}",
        )
    if exc.errno in (errno.EACCES, errno.EPERM):
        try:
            info = os.lstat(path)
            whose = f"{owner_name(info.st_uid)}'s, mode {info.st_mode & 0o7777:04o}"
        except OSError:
            whose = "of unknown owner"
        return LedgerError(
            f"cannot {doing} {path} ({whose}): {exc.strerror}",
            hint=f"every user of the host must be able to read and write it: its owner or "
            f"root must 'chmod 0666 {path}' (a gpualloc run as root fixes it)",
        )
    return FileAccessError(
        f"cannot {doing} {path}: {exc.strerror}",
        hint=f"check the state directory {path.parent}",
    )
