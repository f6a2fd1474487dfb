"""The ledger's lock: an exclusive ``flock`` on ``ledger.lock``, shared by every user of the host.

The kernel drops a ``flock`` when the last descriptor of its holder closes, so a killed gpualloc
never leaves the host locked. What this module adds to the bare system call:

- the lock file is opened as :mod:`.shared_files` opens everything in the state directory: it
  may have been created by any user (opened without ``O_CREAT``, so Linux's
  ``fs.protected_regular`` does not refuse another user's file), and a FIFO or symlink planted in
  its place is an error, not a hang; root takes it over (:func:`.shared_files.adopt`) so that
  the user who created it can no longer remove it while others wait on it;
- after locking, the name is checked to still be the locked inode: a lock on a file that was
  removed or replaced meanwhile guards nothing, and is taken again on the new file;
- waiting blocks in the kernel, which hands the lock on the moment it is dropped, bounded by an
  interval timer (``flock -w`` does the same); where a timer cannot be used (not the main
  thread, or the program uses ``SIGALRM`` itself) it polls with a back-off from half a
  millisecond up to 20 ms. Polling alone lets newcomers overtake a waiter asleep in its
  back-off again and again, and a fixed poll interval is a floor under every contended
  transaction;
- a lock held too long is reported with its holder, read from ``/proc/locks``: user, pid and
  command, so that a user who holds it by hand (``flock ledger.lock sleep 1000``) is named, and
  :class:`~gpualloc.errors.LedgerLocked` (exit 16) tells scripts that nothing was changed.

Any user who can open the file can lock it; gpualloc is cooperative (docs/administration.md,
"Trust model"). Root's Slurm hooks therefore never depend on winning it: :mod:`.journal`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import sys
import time
from pathlib import Path

from msgspec import Struct

from gpualloc import notices
from gpualloc.errors import FileAccessError, LedgerLocked
from gpualloc.ledger.shared_files import adopt, open_shared, owner_name
from gpualloc.user_files import shown_path

SHARED_MODE = 0o666
FIRST_DELAY_S = 0.0005
MAX_DELAY_S = 0.02
NOTICE_AFTER_S = 2.0
"""A wait longer than this is announced (through :data:`gpualloc.notices.slow_wait`) with the
holder."""


class LockHolder(Struct, frozen=True):
    """Who holds a lock, as ``/proc/locks`` and ``/proc/<pid>`` tell."""

    pid: int
    user: str | None
    command: str | None

    def __str__(self) -> str:
        text = f"pid {self.pid}"
        if self.user:
            text = f"{self.user} ({text}"
            text += f": {self.command})" if self.command else ")"
        elif self.command:
            text += f" ({self.command})"
        return text


def lock_holders(descriptor: int) -> list[LockHolder]:
    """The processes holding a ``flock`` on the file open as ``descriptor`` (best effort: an
    empty list where ``/proc/locks`` cannot be read)."""
    info = os.fstat(descriptor)
    inode = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    try:
        text = Path("/proc/locks").read_text(encoding="ascii", errors="replace")
    except OSError:
        return []
    holders = []
    for line in text.splitlines():
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234 0 EOF"; waiters are marked "->"
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == inode:
            try:
                pid = int(fields[4])
            except ValueError:
                continue
            if pid > 0:
                holders.append(_describe_pid(pid))
    return holders


def _describe_pid(pid: int) -> LockHolder:
    from gpualloc.ledger.liveness import command_line

    try:
        user = owner_name(Path(f"/proc/{pid}").stat().st_uid)
    except OSError:
        return LockHolder(pid, None, None)
    return LockHolder(pid, user, " ".join(command_line(pid))[:80] or None)


def describe_holders(descriptor: int) -> str:
    holders = lock_holders(descriptor)
    return ", ".join(map(str, holders)) if holders else "a process /proc/locks does not name"


class _Expired(Exception):
    """The interval timer ran out while waiting in ``flock``."""


def _timer_usable() -> bool:
    """Whether waiting may use ``SIGALRM``: only the main thread receives it, a program that
    uses it itself must keep it, and a launcher may have blocked it (then the timer would never
    interrupt the wait, and a lock held forever would hang gpualloc forever)."""
    import signal

    # Threads are started through threading: where it is not loaded, this is the only one (and
    # importing it only to ask would load it on every command's path)
    threading = sys.modules.get("threading")
    return (
        (threading is None or threading.current_thread() is threading.main_thread())
        and signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None)
        and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
        and signal.SIGALRM not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    )


def _lock_within(descriptor: int, seconds: float) -> bool:
    """Wait in the kernel for the ``flock`` on ``descriptor`` for at most ``seconds``."""
    import signal

    armed = [True]

    def expire(signum: int, frame: object) -> None:
        if armed[0]:
            raise _Expired

    previous = signal.signal(signal.SIGALRM, expire)
    try:
        signal.setitimer(signal.ITIMER_REAL, seconds)
        with contextlib.suppress(_Expired):
            fcntl.flock(descriptor, fcntl.LOCK_EX)
        armed[0] = False
    except _Expired:  # the timer fired just after flock returned: asked again below
        pass
    finally:
        armed[0] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return SharedLock._try_lock(descriptor)  # true if this descriptor holds it now


class SharedLock:
    """An exclusive ``flock`` on ``path``; a context manager."""

    def __init__(
        self, path: Path, *, timeout_s: float, what: str = "the ledger", mode: int = SHARED_MODE
    ) -> None:
        self.path = path
        self.mode = mode
        """The lock file's mode: 0666 in a shared directory, 0600 in a broker's."""
        self.timeout_s = timeout_s
        self.what = what
        self._descriptor: int | None = None

    def __enter__(self) -> SharedLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def acquire(self) -> None:
        started = time.monotonic()
        delay = FIRST_DELAY_S
        noticed = False
        blocking = _timer_usable()
        while True:
            descriptor = self._open()
            try:
                while True:
                    waited = time.monotonic() - started
                    checkpoint = self.timeout_s if noticed else min(NOTICE_AFTER_S, self.timeout_s)
                    if self._try_lock(descriptor) or (
                        blocking and _lock_within(descriptor, max(checkpoint - waited, 0.001))
                    ):
                        if self._still_named(descriptor):
                            self._descriptor = descriptor
                            return
                        break  # replaced while we waited: lock the file now at the name
                    waited = time.monotonic() - started
                    if waited >= self.timeout_s:
                        raise LedgerLocked(
                            f"{self.what} in {self.path.parent} stayed locked for "
                            f"{self.timeout_s:g} s by {describe_holders(descriptor)}; nothing "
                            "was changed",
                            hint="gpualloc holds this lock for milliseconds: a process that "
                            "holds it longer is stuck or hostile; ask its owner or root to end "
                            "it, then try again",
                        )
                    if not noticed and waited >= NOTICE_AFTER_S:
                        noticed = True
                        if notices.slow_wait is not None:
                            notices.slow_wait(
                                f"waiting for {self.what}'s lock, held by "
                                f"{describe_holders(descriptor)} (gives up after "
                                f"{self.timeout_s:g} s)"
                            )
                    if not blocking:
                        time.sleep(delay)
                        delay = min(delay * 2, MAX_DELAY_S)
            except BaseException:
                os.close(descriptor)
                raise
            os.close(descriptor)

    def release(self) -> None:
        if self._descriptor is not None:
            descriptor, self._descriptor = self._descriptor, None
            os.close(descriptor)  # closing drops the flock
            # The kernel woke a waiter, which must still be scheduled; with more processes than
            # cores the releaser, still on its CPU, took the lock back for its next transaction
            # again and again, the waiter starved; sched_yield(2) lets the woken waiter run
            # first. Without anyone else to run, it returns at once.
            os.sched_yield()

    def holders(self) -> str:
        """Who holds the lock now (for a note while reading without it)."""
        descriptor = self._open()
        try:
            return describe_holders(descriptor)
        finally:
            os.close(descriptor)

    def try_acquire(self) -> bool:
        """Take the lock if nobody holds it; never waits."""
        descriptor = self._open()
        if self._try_lock(descriptor) and self._still_named(descriptor):
            self._descriptor = descriptor
            return True
        os.close(descriptor)
        return False

    def _open(self) -> int:
        try:
            try:
                descriptor, info = open_shared(
                    self.path, os.O_RDWR, create_mode=self.mode, replace_as_root=True
                )
            except PermissionError as denied:
                # Another user's file they made read-only: flock needs only a read descriptor.
                try:
                    descriptor, info = open_shared(self.path, os.O_RDONLY)
                except FileNotFoundError:
                    raise denied from None  # no file, and none may be made here
        except OSError as exc:
            raise self._open_error(exc) from exc
        with contextlib.suppress(OSError):  # a file system that refuses chown: still a lock
            adopt(descriptor, info, self.mode)
        return descriptor

    def _open_error(self, exc: OSError) -> FileAccessError:
        """Why the lock file could not be opened: a directory where it cannot be made (read-only
        for this user, or on a read-only file system) is said as such, not as a missing file
        with a chmod of the file for a hint
        (tests/test_bad_input_settings.py::test_a_read_only_state_directory_is_named_as_such)."""
        directory = self.path.parent
        cannot_make = exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS)
        if cannot_make and not os.path.lexists(self.path):
            if exc.errno == errno.EROFS:
                return FileAccessError(
                    f"cannot create the lock file {shown_path(self.path)}: the state directory "
                    f"{shown_path(directory)} is on a read-only file system",
                    hint="point GPUALLOC_STATE_DIR (or state_dir) at a directory on a writable one",
                )
            try:
                info = directory.stat()
                whose = f"{owner_name(info.st_uid)}'s, mode {info.st_mode & 0o7777:04o}"
            except OSError:
                whose = "owner unknown"
            return FileAccessError(
                f"cannot create the lock file {shown_path(self.path)}: the state directory "
                f"{shown_path(directory)} is read-only for you ({whose})",
                hint=f"ask root to make it writable for every user ('chmod 1777 "
                f"{shown_path(directory)}'), "
                "or point GPUALLOC_STATE_DIR at another directory",
            )
        return FileAccessError(
            f"cannot open the lock file {shown_path(self.path)}: {exc.strerror}",
            hint="every user of the host must be able to read it: ask root to "
            f"'chmod 0666 {shown_path(self.path)}'",
        )

    @staticmethod
    def _try_lock(descriptor: int) -> bool:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return False
            raise
        return True

    def _still_named(self, descriptor: int) -> bool:
        held = os.fstat(descriptor)
        try:
            named = os.lstat(self.path)
        except FileNotFoundError:
            return False
        return held.st_nlink > 0 and (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)
