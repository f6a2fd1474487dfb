"""The header block a recording may start with, and the quoting people add when they paste.

``../shared/reference/measured`` files (and so the test fixtures) start with ``# source:``,
``# machine:``, ``# captured-by:`` and ``# note:`` lines; the tools' own output may start with
``#`` too (nccl-tests), so only those four keys count as the header. Output pasted into an
issue often carries a markdown quote (``> ``) on some lines; it is removed before parsing.
"""

from __future__ import annotations

import re

from gpualloc.errors import TopologyParseError

_HEADER = re.compile(r"^# (source|machine|captured-by|note):\s?(.*)$")
_QUOTE = re.compile(r"^>\s?")


def split_provenance(text: str) -> tuple[dict[str, str], list[str]]:
    """The header's keys, and the lines after it (numbered from 1 as in the file: the header's
    lines become empty strings so that error messages name the file's own line numbers)."""
    lines = text.splitlines()
    header: dict[str, str] = {}
    for position, line in enumerate(lines):
        match = _HEADER.match(line)
        if not match:
            break
        key, value = match.groups()
        header[key] = f"{header[key]} {value}" if key in header else value
        lines[position] = ""
    return header, lines


def unquoted(line: str) -> str:
    return _QUOTE.sub("", line)


def figure(token: str, *, line_number: int | None, source: str, what: str = "a number") -> float:
    """A non-negative number from a table cell; one error naming the line and the token."""
    try:
        value = float(token)
    except ValueError:
        raise TopologyParseError(
            f"not {what}", line_number=line_number, token=token, source=source
        ) from None
    if value < 0:
        raise TopologyParseError(
            "negative figure", line_number=line_number, token=token, source=source
        )
    return value
