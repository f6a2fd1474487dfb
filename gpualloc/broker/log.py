"""The broker's log: stamped lines on standard error (``gpualloc serve``).

The event loop holds the lines of one turn and writes them together, in one write, when the
turn ends (:class:`TurnLog`): a busy broker logs every lease it makes and releases, and each
write to the journal's pipe is a system call and a wake-up of journald
(``tests/test_broker_throughput.py``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable

from gpualloc.model.printable import printable

LOG_LINE_LIMIT = 2000
"""The most characters one line of the broker's log shows of a message."""
_stamp: tuple[int, str] = (-1, "")
"""The last second stamped, and its stamp (a busy loop writes many turns a second)."""


def log_lines(lines: Iterable[str]) -> None:
    """Write ``lines`` to the log, each with the time stamp of now, in one write. Clients'
    words reach it (an error quoting a request, a user's lease): control characters are
    escaped and every further line of a message (a traceback's) is indented, so that no
    client writes escape sequences to the administrator's terminal or a line that reads as
    the broker's own."""
    global _stamp
    second = int(time.time())
    if _stamp[0] != second:
        _stamp = (second, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second)))
    stamp = _stamp[1]
    text = ""
    for line in lines:
        first, *more = line.split("\n")
        text += f"{stamp} gpualloc serve: {printable(first, LOG_LINE_LIMIT)}"
        text += "".join(f"\n    {printable(part, LOG_LINE_LIMIT)}" for part in more)
        text += "\n"
    if text:
        sys.stderr.write(text)
        sys.stderr.flush()


def log_line(line: str) -> None:
    """Write one line to the log now (outside the loop: starting, stopping)."""
    log_lines((line,))


class TurnLog:
    """The lines logged in one turn of the broker's loop, written by :meth:`flush`."""

    def __init__(self, write: Callable[[list[str]], None]) -> None:
        self.write = write
        self.lines: list[str] = []

    def __call__(self, line: str) -> None:
        self.lines.append(line)

    def flush(self) -> None:
        if self.lines:
            lines, self.lines = self.lines, []
            self.write(lines)
