"""Every child process a test starts ends with the test, passed or failed, within a deadline.

A failed assertion before a child's input was closed left the child reading for ever, and the
suite waiting on it in ``wait()`` with no timeout (four minutes of a hung fast loop). So a test
that starts a process ends it in ``finally`` with :func:`end` (or starts it with
:func:`running`), and no test waits on a child without a deadline.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

STOP_S = 30.0
"""How long a child killed with SIGKILL may take to be reaped: the kernel's work alone, so only
a process stuck in the kernel (an NFS hang) can exceed it."""


def end(
    process: subprocess.Popen[Any],
    *,
    group: bool = False,
    term_s: float = 0.0,
    timeout_s: float = STOP_S,
) -> int:
    """SIGKILL ``process`` unless it has exited (with ``group``, every process of the group it
    leads, which a job's children share), close the pipes to it and reap it within
    ``timeout_s``; its exit status (``subprocess.TimeoutExpired`` past the deadline). With
    ``term_s``, SIGTERM first and that long to exit by itself (a waiter leaves its queue)."""
    if term_s and process.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group:
                os.killpg(process.pid, signal.SIGTERM)
            else:
                process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=term_s)
    if group:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)  # members may outlive their leader
    elif process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):  # input it never read: a broken pipe
                stream.close()
    return process.wait(timeout=timeout_s)


def end_all(processes: Sequence[subprocess.Popen[Any]], **options: Any) -> None:
    """:func:`end` each of ``processes``, every one of them even when one fails to end."""
    problems = []
    for process in processes:
        try:
            end(process, **options)
        except subprocess.TimeoutExpired as problem:
            problems.append(problem)
    if problems:
        raise problems[0]


@contextlib.contextmanager
def running(argv: Sequence[str], *, group: bool = False, **options: Any) -> Iterator[Any]:
    """``subprocess.Popen(argv, **options)`` for the block, ended by :func:`end` after it
    whatever happened (``group``: in a session of its own, the whole group ended)."""
    process = subprocess.Popen(argv, start_new_session=group, **options)
    try:
        yield process
    finally:
        end(process, group=group)


def reap(pid: int, *, timeout_s: float = STOP_S) -> int:
    """The wait status of the forked child ``pid``, waited for at most ``timeout_s``; a child
    still running then is killed, reaped and reported (an AssertionError)."""
    deadline = time.monotonic() + timeout_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)  # SIGKILL: reaped at once
            raise AssertionError(f"the forked child {pid} did not end within {timeout_s:g} s")
        time.sleep(0.01)


def finish(
    process: subprocess.Popen[Any], *, timeout_s: float, input: Any = None
) -> tuple[Any, Any]:
    """``process.communicate(input)`` within ``timeout_s``: its output and errors. A process
    still running at the deadline (or when anything else goes wrong) is ended by :func:`end`
    before the error is raised."""
    try:
        return process.communicate(input, timeout=timeout_s)
    except BaseException:
        end(process)
        raise


def read_all(descriptor: int, *, timeout_s: float) -> bytes:
    """Everything a forked child writes to the pipe ``descriptor`` until it closes it, which
    is closed here; ``TimeoutError`` when the child has not closed it within ``timeout_s``."""
    import select

    deadline = time.monotonic() + timeout_s
    chunks = []
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([descriptor], [], [], left)[0]:
                raise TimeoutError(f"the child did not finish writing within {timeout_s:g} s")
            chunk = os.read(descriptor, 65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(descriptor)


def stderr_until(process: subprocess.Popen[Any], text: str, timeout_s: float = 30) -> str:
    """The job's standard error up to ``text`` (fails after ``timeout_s``), read from the
    descriptor itself: a buffered readline could hold the line that select waits for."""
    import select

    seen = ""
    assert process.stderr is not None
    fd = process.stderr.fileno()
    deadline = time.monotonic() + timeout_s
    while text not in seen:
        ready, _, _ = select.select([fd], [], [], max(0, deadline - time.monotonic()))
        assert ready, f"no {text!r} on the job's stderr within {timeout_s}s: {seen!r}"
        chunk = os.read(fd, 65536).decode()
        assert chunk, f"the job's stderr closed before {text!r}: {seen!r}"
        seen += chunk
    return seen


def live_members(pgid: int) -> list[int]:
    """The processes of group ``pgid`` that have not exited (``/proc/PID/stat``; a zombie whose
    parent, init here, has not reaped it yet holds nothing and does not count)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members
