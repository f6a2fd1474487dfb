"""Text one user wrote, made safe to show on another user's terminal.

A lease's name and command come from whoever made the lease, and ``status`` shows them to every
user of the host: an escape sequence in a name could recolour or rewrite someone else's
terminal, a newline fake a row, a 100 kB argv bury the table. Human output therefore shows them
with every control character escaped (``\\x1b``, ``\\n``) and cut to a length; ``--json`` keeps
them exact, for programs.

Exact, but always text: bytes of an argument that are not UTF-8 reach Python as lone surrogates
(U+DC80..U+DCFF, PEP 383's ``surrogateescape``), which no UTF-8 file or JSON reader accepts back.
One such byte kept in the ledger would make every later command of every user fail, so what gpualloc
keeps is first put through :func:`escape_surrogates`, or refused where :func:`has_surrogates` (the
rule is :mod:`gpualloc.host.terms`'s).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable

ELLIPSIS = "..."


def printable(text: str, limit: int | None = None) -> str:
    """``text`` with control and format characters escaped, cut to ``limit`` characters.

    With a limit, only what is shown is escaped: an error quoting a list of megabytes would
    escape it whole to write its first 500 characters
    (tests/test_fuzz_findings.py::test_printable_escapes_only_what_it_shows)."""
    if text.isprintable():  # nothing to escape (str.isprintable is false for every category
        # _escaped escapes), the common case: a name, a log line (one C pass, not one per char)
        if limit is None or len(text) <= limit:
            return text
        return text[: max(0, limit - len(ELLIPSIS))] + ELLIPSIS
    if limit is None:
        return "".join(_escaped(char) for char in text)
    pieces, size = [], 0
    for char in text:
        piece = _escaped(char)
        pieces.append(piece)
        size += len(piece)
        if size > limit:
            break
    shown = "".join(pieces)
    if len(shown) > limit:
        return shown[: max(0, limit - len(ELLIPSIS))] + ELLIPSIS
    return shown


def has_surrogates(text: str) -> bool:
    """Whether ``text`` holds a lone surrogate: a byte that was not UTF-8, or a JSON ``\\udXXX``
    escape that pairs with nothing. Such text cannot be written as UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def escape_surrogates(text: str) -> str:
    """``text`` with each lone surrogate written out: ``\\xff`` for the byte 0xff of an argument
    that was not UTF-8 (what ``os.fsencode`` would give back), ``\\udXXX`` for any other.
    Text that is UTF-8 already comes back unchanged (the same object)."""
    if not has_surrogates(text):
        return text
    return "".join(_surrogate_escaped(char) for char in text)


MAX_COMMAND_WORDS = 256
MAX_COMMAND_CHARS = 4096
"""A lease keeps its job's command for ``status`` (the job runs with all of it): the first
:data:`MAX_COMMAND_WORDS` words, :data:`MAX_COMMAND_CHARS` characters in all (the last word
cut). So a command as kept always fits a request to the broker
(:data:`gpualloc.wire.protocol.MAX_REQUEST_BYTES`, even at twelve bytes a character, JSON's
``\\udXXX`` pairs), and a job's argv, of any size, never decides whether it runs
(tests/test_broker_access.py, tests/test_broker_limits.py)."""


def lease_command(words: Iterable[str]) -> tuple[str, ...]:
    """The job's command as its lease keeps it: cut to the caps above, each byte that is not
    UTF-8 escaped first (``\\xff``, :func:`escape_surrogates`), so that a command kept once
    is kept again unchanged (the client cuts it, the broker checks the cut).

    Escaped, not refused, unlike a lease's name: a user may rightly run a program or name a
    file whose name is not UTF-8, and the record is only shown, never run
    (tests/test_hostile_bytes.py).
    This module imports no msgspec: ``run`` through the broker cuts the command with it."""
    kept: list[str] = []
    left = MAX_COMMAND_CHARS
    for word in words:
        if len(kept) == MAX_COMMAND_WORDS or left == 0:
            break
        word = escape_surrogates(word[:left])[:left]
        kept.append(word)
        left -= len(word)
    return tuple(kept)


def _surrogate_escaped(char: str) -> str:
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape's stand-in for the byte code - 0xDC00
        return f"\\x{code - 0xDC00:02x}"
    if 0xD800 <= code <= 0xDFFF:
        return f"\\u{code:04x}"
    return char


def _escaped(char: str) -> str:
    if char == "\\":
        return char
    category = unicodedata.category(char)
    if category in ("Cc", "Cf", "Zl", "Zp"):  # controls, bidi overrides, breaks
        return char.encode("unicode_escape").decode("ascii")
    if category == "Cs":  # a byte that was not UTF-8: a terminal cannot even be sent it
        return _surrogate_escaped(char)
    return char


def count_of(n: int, noun: str) -> str:
    """``1 GPU``, ``2 GPUs``: a count with its noun, singular where it is one."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def shown_name(name: str | None) -> str | None:
    """A lease's or waiter's name as other users' terminals may show it (escaped, cut)."""
    return printable(name, 40) if name else name
