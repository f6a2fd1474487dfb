"""The broker's log: one stamped line per event on standard error (``gpualloc serve``)."""

from __future__ import annotations

import sys
from datetime import datetime, timezone

from gpualloc.model.printable import printable

LOG_LINE_LIMIT = 2000
"""The most characters one line of the broker's log shows of a message."""


def log_line(line: str) -> None:
    """Write ``line`` to the log with a time stamp. Clients' words reach it (an error quoting a
    request, a user's lease): control characters are escaped and every further line of the
    message (a traceback's) is indented, so that no client writes escape sequences to the
    administrator's terminal or a line that reads as the broker's own."""
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    first, *more = line.split("\n")
    text = printable(first, LOG_LINE_LIMIT)
    text += "".join(f"\n    {printable(part, LOG_LINE_LIMIT)}" for part in more)
    sys.stderr.write(f"{stamp} gpualloc serve: {text}\n")
    sys.stderr.flush()
