"""Text one user wrote, made safe to show on another user's terminal (issue 30, point 5).

A lease's name and command come from whoever made the lease, and ``status`` shows them to every
user of the host: an escape sequence in a name could recolour or rewrite someone else's
terminal, a newline fake a row, a 100 kB argv bury the table. Human output therefore shows them
with every control character escaped (``\\x1b``, ``\\n``) and cut to a length; ``--json`` keeps
them exact, for programs.

Exact, but always text: bytes of an argument that are not UTF-8 reach Python as lone surrogates
(U+DC80..U+DCFF, PEP 383's ``surrogateescape``), which no UTF-8 file or JSON reader accepts
back. One such byte kept in the ledger made every later command of every user fail (issue 40,
hole 3), so what gpualloc keeps is first put through :func:`escape_surrogates`, or refused where
:func:`has_surrogates` (the rule is :mod:`gpualloc.host.terms`'s).
"""

from __future__ import annotations

import unicodedata

ELLIPSIS = "..."


def printable(text: str, limit: int | None = None) -> str:
    """``text`` with control and format characters escaped, cut to ``limit`` characters.

    With a limit, only what is shown is escaped: an error quoting a 6 MB list took seconds
    to escape whole before its first 500 characters were written (issue 42, point 3)."""
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
