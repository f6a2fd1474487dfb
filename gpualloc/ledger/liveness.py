"""Whether a lease's holder is still there: its process, the lease lock its job inherited, its
process group.

Signals, any of which keeps a lease alive:

- the process: its pid exists and started at the recorded time (``/proc/<pid>/stat``, read as
  psutil's ``create_time`` reads it, without importing psutil on every command), so a
  pid the kernel reused for another program does not count;
- the lease lock: ``gpualloc run`` takes a shared ``flock`` on ``lease-<id>.lock`` and lets the
  job inherit the descriptor across ``exec``. Every child the job forks inherits it too, so the
  lock is held until the last of them exits, and the kernel drops it however they end
  (``kill -9`` included). A torchrun launcher that dies while its workers run keeps the GPUs;
- the job's process group, when the job led one: a child that closed every inherited
  descriptor (a daemon's ``closerange(3, 1024)``, which drops the lease lock) but stayed in the
  group still holds the GPUs (the first test of tests/test_lease_lifetime.py). A child that
  also left the group (``setsid``) is found on the GPUs themselves, by the ledger store
  (:func:`started_by`).
"""

from __future__ import annotations

import errno
import fcntl
import functools
import itertools
import os
from collections.abc import Callable
from pathlib import Path

_START_TIME_TOLERANCE_S = 0.05
"""The start time is counted in clock ticks since boot; two readings of one process agree to
the tick (10 ms), a different process started in the same tick is vanishingly unlikely."""


@functools.lru_cache(maxsize=1)
def _boot_time() -> float:
    """The boot time (``btime`` of ``/proc/stat``, seconds since the epoch), as psutil uses it."""
    for line in Path("/proc/stat").read_text(encoding="ascii").splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    raise OSError(errno.ENOENT, "no btime in /proc/stat")


def stat_fields(pid: int) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command name: [state, ppid, ...]. Raises
    ProcessLookupError for no such process, PermissionError where ``/proc`` hides it."""
    if pid <= 0:
        raise ProcessLookupError(pid)
    try:
        text = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except FileNotFoundError:
        raise ProcessLookupError(pid) from None
    return text[text.rindex(")") + 2 :].split()  # the name may hold spaces and parentheses


def started_at(fields: list[str]) -> float:
    """The start time (epoch seconds) in the fields :func:`stat_fields` read."""
    return _boot_time() + int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime


def process_start_time(pid: int) -> float | None:
    """The start time of ``pid`` (seconds since the epoch, as psutil's ``create_time``), or
    None if it cannot be read."""
    try:
        return started_at(stat_fields(pid))
    except (OSError, ValueError, IndexError):
        return None


def process_alive(pid: int, start_time: float | None) -> bool:
    """True if ``pid`` runs and is the process that started at ``start_time`` (any process with
    that pid when the start time was not recorded). A zombie has ended."""
    try:
        fields = stat_fields(pid)
    except ProcessLookupError:
        return False
    except OSError:
        # Another user's process on a hardened /proc (hidepid): it exists but cannot be
        # identified, so it keeps its GPUs rather than lose them on a guess.
        return True
    if fields[0] in ("Z", "X"):
        return False
    return start_time is None or abs(started_at(fields) - start_time) <= _START_TIME_TOLERANCE_S


def lock_held(path: Path) -> bool:
    """True if some process holds a ``flock`` on ``path``. A missing file is not held, and
    neither is anything but a regular file (a FIFO planted in its place must neither hang the
    reaper nor keep GPUs held)."""
    from gpualloc.ledger.shared_files import UnsafeFile, open_shared

    try:
        descriptor, _ = open_shared(path, os.O_RDONLY)
    except (FileNotFoundError, UnsafeFile):
        return False
    except OSError:
        return True  # cannot tell: never free GPUs on a guess
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        return exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
    else:
        fcntl.flock(descriptor, fcntl.LOCK_UN)
        return False
    finally:
        os.close(descriptor)


def take_lease_lock(path: Path) -> int:
    """Create ``path`` and hold a shared ``flock`` on it through a descriptor that survives
    ``exec`` (not close-on-exec). Returns the descriptor."""
    # Exclusive: the name is new (a random lease id), so anything already there was planted.
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    descriptor = os.open(path, flags, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
        os.set_inheritable(descriptor, True)
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


def group_alive(group: int, live_member: Callable[[int], bool] | None = None) -> bool:
    """True while some process of the process group ``group`` (which its leader's pid names)
    lives; asked once the leader itself has ended. The kernel never hands out a pid that names
    a live group, so when another process has the leader's pid now, the job's group is gone.

    ``killpg`` finds zombies too, so whether a member has not ended is asked of
    ``live_member`` (the group's id -> bool): by default a walk of ``/proc``; the broker
    answers from its stepped pass instead (:meth:`gpualloc.broker.watch.ProcessWatch.group_member`),
    so that no request waits for a walk whose length other users' processes decide."""
    import errno

    if process_alive(group, None):
        return False  # the pid was handed out again: the job's group had emptied before
    try:
        os.killpg(group, 0)
    except OSError as exc:
        return exc.errno == errno.EPERM  # another user's members exist
    return (live_member or _live_member)(group)


def _live_member(group: int) -> bool:
    """True if a process of ``group`` has not ended: members that are all zombies (a parent
    that has not waited for them yet) hold nothing, though ``killpg`` still finds them."""
    try:
        entries = [entry.name for entry in Path("/proc").iterdir() if entry.name.isdigit()]
    except OSError:
        return True
    for entry in entries:
        try:
            fields = stat_fields(int(entry))
        except OSError:
            continue
        if fields[2] == str(group) and fields[0] not in ("Z", "X"):
            return True
    return False


WALL_CLOCK_SLACK_S = 2.0
"""How far a start time read from ``/proc`` may lag the wall clock it is compared with: the
boot time it counts from is whole seconds (``btime``, proc(5)), and a virtual machine's wall
clock drifts from the kernel's boot clock (1.0 s measured on a test machine, where a margin
of 1 s failed one run in two)."""


def started_by(pid: int, uid: int, *, since: float) -> bool:
    """True if process ``pid`` runs as ``uid`` and started at or after ``since`` (epoch s),
    within :data:`WALL_CLOCK_SLACK_S`."""
    try:
        fields = stat_fields(pid)
        status = Path(f"/proc/{pid}/status").read_text(encoding="ascii", errors="replace")
    except OSError:
        return False
    real = next((line.split()[1] for line in status.splitlines() if line.startswith("Uid:")), "")
    alive = fields[0] not in ("Z", "X") and real == str(uid)
    return alive and started_at(fields) >= since - WALL_CLOCK_SLACK_S


EMPTY_ARGUMENTS_S = 0.5
"""How long the empty arguments of a live process are read again. From the moment an exec
has released the old program (which is when ``subprocess.Popen`` returns, the exec having
succeeded) until the new program's arguments are mapped, ``/proc/PID/cmdline`` reads empty;
a preempted exec may stay in that window a while."""

_PF_KTHREAD = 0x00200000
"""The kernel-thread bit of ``/proc/PID/stat``'s flags (field 9; ``include/linux/sched.h``)."""


def output_read_by_parent_shell(pid: int) -> bool:
    """True when ``pid`` is a subshell whose output its parent shell reads: a command
    substitution that bash or zsh forked (``X=$(cmd 2>&1)``, ``$(cmd || exit)``, ``$(cmd |
    tee f)``) rather than exec'd its command in. Such a subshell ends as soon as its commands
    do, so a lease tied to it ends with the command that made it.

    The tests, each on ``/proc``: ``pid`` is a fork of its parent that never exec'd (the same
    executable and the same arguments, as POSIX's fork copies them), and its standard output
    is a pipe the parent holds open (the end the shell reads the substitution from). A shell
    started by a shell has arguments of its own, and a subshell writing to a terminal, a file
    or another program (``( cmd; train ) | tee log``) is not one a shell reads. False when any
    of it cannot be read."""
    try:
        parent = int(stat_fields(pid)[1])
        exe = _link(f"/proc/{pid}/exe")
        if parent <= 1 or exe is None or exe != _link(f"/proc/{parent}/exe"):
            return False
        arguments = Path(f"/proc/{pid}/cmdline").read_bytes()
        if arguments != Path(f"/proc/{parent}/cmdline").read_bytes():
            return False
        output = _link(f"/proc/{pid}/fd/1")
        if output is None or not output.startswith("pipe:["):
            return False
        held = itertools.islice(Path(f"/proc/{parent}/fd").iterdir(), MAX_SHELL_FDS)
        return any(_link(str(entry)) == output for entry in held)
    except (OSError, ValueError, IndexError):
        return False


MAX_SHELL_FDS = 1024
"""Descriptors of the parent looked at for the pipe: a shell holds a handful."""


def _link(path: str) -> str | None:
    """Where the ``/proc`` link ``path`` points (``pipe:[123]``, an executable), or None."""
    try:
        return str(Path(path).readlink())
    except OSError:
        return None


def command_line(pid: int) -> tuple[str, ...]:
    """The arguments of process ``pid``; empty where they are not known: no such process, one
    ``/proc`` hides, a zombie or a kernel thread (which have none), a program that emptied its
    own. A live process that reads empty is read again for up to :data:`EMPTY_ARGUMENTS_S`:
    one that has just called exec shows none until its new program's are in place
    (``tests/test_ledger_trust.py``)."""
    deadline = None
    pause = 0.001
    while True:
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return ()
        if raw.strip(b"\0") or not _may_have_arguments(pid):
            break
        import time

        now = time.monotonic()
        deadline = now + EMPTY_ARGUMENTS_S if deadline is None else deadline
        if now >= deadline:
            break
        time.sleep(pause)
        pause = min(2 * pause, 0.02)
    return tuple(part.decode(errors="replace") for part in raw.split(b"\0") if part)


def _may_have_arguments(pid: int) -> bool:
    """Whether ``pid`` is a live process that runs a program: not a zombie, whose memory is
    gone, nor a kernel thread, which never had any."""
    try:
        fields = stat_fields(pid)
        return fields[0] not in ("Z", "X") and not int(fields[6]) & _PF_KTHREAD
    except (OSError, ValueError, IndexError):
        return False
