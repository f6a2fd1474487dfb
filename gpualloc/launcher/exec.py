"""The one place where gpualloc replaces itself with the job (``os.execvpe``).

After exec the job *is* the gpualloc process: same pid (the lease's pid), signals from the
terminal or a scheduler reach it directly, and its exit status is the one the caller sees. The
lease lock descriptor is inheritable and so survives; every other descriptor Python opened is
close-on-exec. Python ignores SIGPIPE and SIGXFSZ for itself; ignored signals stay ignored across
exec, so both are reset first (a job in ``job | head`` must die of SIGPIPE, as subprocess's
``restore_signals`` also ensures).
"""

from __future__ import annotations

import errno
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from typing import NoReturn

from gpualloc.errors import CommandNotExecutable, CommandNotFound
from gpualloc.launcher.binding import Binding

_RESTORED_SIGNALS = ("SIGPIPE", "SIGXFSZ")


def exec_job(argv: Sequence[str], environment: Mapping[str, str], binding: Binding) -> NoReturn:
    """Exec ``argv`` with ``environment``; on failure raise the shell's 127/126 errors."""
    if binding.method == "affinity":
        os.sched_setaffinity(0, binding.cpus)
    for name in _RESTORED_SIGNALS:
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(argv[0], list(argv), dict(environment))
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            raise CommandNotFound(f"{argv[0]}: command not found") from None
        raise CommandNotExecutable(f"{argv[0]}: {exc.strerror}") from None
