"""Starting a job's supervisor, detached from the terminal that submitted it.

The client forks twice, as a daemon detaches (W. R. Stevens, *Advanced Programming in the
UNIX Environment*, section 13.3): the first child calls ``setsid`` (a session of its own, so
no terminal's hang-up reaches it) and forks the supervisor, then exits, so the supervisor is
nobody's child but init's (or the nearest subreaper's) and the client, reaping the first
child at once, returns without waiting for anything else. The supervisor's standard input is
``/dev/null`` and its output the job's log; SIGHUP is ignored before its exec, as nohup(1)
does. It runs as the submitting user: nothing changes uid.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def start_supervisor(directory: Path, log: Path) -> None:
    """Start the supervisor of the job in ``directory`` (its output appended to ``log``) and
    return once it is detached. Raises OSError when the log cannot be opened or the process
    cannot be made."""
    import signal

    output = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        argv = [sys.executable, "-m", "gpualloc.cli.supervisor", str(directory)]
        first = os.fork()
        if first == 0:  # pragma: no cover - the child's path, seen by the tests' supervisors
            try:
                os.setsid()
                if os.fork() != 0:
                    os._exit(0)
                signal.signal(signal.SIGHUP, signal.SIG_IGN)
                os.dup2(null, 0)
                os.dup2(output, 1)
                os.dup2(output, 2)
                os.execv(argv[0], argv)
            except BaseException:
                os._exit(127)
        os.waitpid(first, 0)
        os.close(null)
    finally:
        os.close(output)
