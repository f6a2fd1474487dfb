"""The small processes gpualloc leaves beside a job it execs: forked before the exec, detached,
of the job's own user (the eviction watcher of a shared job, the launch verifier).

Each is a grandchild of the gpualloc process (its parent exits at once, so it is never a zombie
of the job), in a session of its own, with every descriptor closed (but one it is asked to
keep) and the standard streams on /dev/null: it holds neither the lease lock nor, unless asked
to, a pipe a caller waits on, and it is not in the
job's process group or process tree, so it never keeps the lease alive nor counts as the job.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path


def fork_detached(body: Callable[[], object], *, keep: int | None = None) -> None:
    """Run ``body`` in a detached grandchild (see above) and return at once in this process;
    ``keep`` is a descriptor the grandchild keeps open (closed here)."""
    child = os.fork()
    if child:
        if keep is not None:
            os.close(keep)
        os.waitpid(child, 0)
        return
    try:
        os.setsid()
        if os.fork():
            os._exit(0)
        _detach(keep)
        body()
    finally:
        os._exit(0)


LOCK_REMOVER = """\
import fcntl, os, sys
fd, path = int(sys.argv[2]), sys.argv[3]
fcntl.flock(fd, fcntl.LOCK_EX)
try:
    if os.path.samestat(os.fstat(fd), os.lstat(path)):
        os.unlink(path)
except OSError:
    pass
"""
"""The remover's program: wait for the lease lock exclusively, then unlink it if the name still
names it. A fresh interpreter without site packages (a few MB), not a fork of this one."""


def remove_lock_when_released(path: Path) -> None:
    """Remove the lease lock ``path`` once every process holding it is gone: when the job and
    every child it left behind have ended, not when a later command reaps
    its lease (tests/test_fuzz_findings.py::test_a_finished_job_leaves_no_lease_lock).

    A detached helper waits for an exclusive ``flock`` on the file, which it gets only when no
    shared holder is left, and unlinks the file while it holds it. Liveness cannot be misread:
    a reader that asks while the helper holds the lock finds it held (the lease lives a moment
    longer), one that opened the file before the unlink takes the lock only after the helper
    has gone, and one that opens it after finds no file, which means "not held" as a free file
    does. Nobody locks the file anew (a lease's lock is made once, with ``O_EXCL``), and the
    lease itself is left to the reapers: it may live on through its process group."""
    import sys

    if not sys.executable:
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return  # gone already: nothing to remove

    def body() -> None:
        os.set_inheritable(fd, True)
        argv = [sys.executable, "-I", "-S", "-c", LOCK_REMOVER, "gpualloc-lease-lock"]
        os.execv(sys.executable, [*argv, str(fd), str(path)])

    fork_detached(body, keep=fd)


def _detach(keep: int | None) -> None:
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        if fd != keep:
            os.dup2(null, fd)
    if keep is None or keep < 3:
        os.closerange(3, _max_fd())
    else:
        os.closerange(3, keep)
        os.closerange(keep + 1, _max_fd())


def _max_fd() -> int:
    try:
        return os.sysconf("SC_OPEN_MAX")
    except (ValueError, OSError):
        return 1024


def end_job(job: int, leads_group: bool, started: float | None, grace_s: float) -> None:
    """SIGTERM the job (its process group when it leads one), SIGKILL after ``grace_s``."""
    from gpualloc.ledger.liveness import process_alive

    def send(sig: signal.Signals) -> None:
        try:
            if leads_group:
                os.killpg(job, sig)
            else:
                os.kill(job, sig)
        except ProcessLookupError:
            pass

    send(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while process_alive(job, started) and time.monotonic() < deadline:
        time.sleep(0.1)
    if process_alive(job, started):
        send(signal.SIGKILL)


def stderr_reopenable() -> bool:
    """Whether this process may open its own standard error anew through ``/proc`` (its
    terminal, or a pipe or file of its user's; not a pipe root made for it, nor a socket)."""
    try:
        os.close(os.open("/proc/self/fd/2", os.O_WRONLY | os.O_APPEND | os.O_NOCTTY))
    except OSError:
        return False
    return True


def tell_job(job: int, text: str) -> bool:
    """Write ``text`` to the job's standard error (``/proc/JOB/fd/2``: its terminal, pipe or
    log, opened only for this write so that no caller waits on a descriptor the watcher keeps);
    False when it cannot be opened (a socket, or the job is gone)."""
    try:
        fd = os.open(f"/proc/{job}/fd/2", os.O_WRONLY | os.O_APPEND | os.O_NOCTTY)
    except OSError:
        return False
    try:
        os.write(fd, text.encode("utf-8", "replace"))
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def job_speaker() -> tuple[Callable[[str], None], int | None]:
    """How a helper forked by this process (about to become the job) warns on the job's
    standard error, and the descriptor it must keep for that (None: it opens the job's stderr
    through ``/proc`` only to write, so a caller reading the job's output to its end never
    waits for the helper; a pipe root made, or a socket, cannot be opened so)."""
    import contextlib

    job = os.getpid()
    kept = None if stderr_reopenable() else os.dup(2)

    def say(text: str) -> None:
        line = f"gpualloc: warning: {text}\n"
        if kept is None:
            tell_job(job, line)
            return
        with contextlib.suppress(OSError):
            os.write(kept, line.encode("utf-8", "replace"))

    return say, kept
