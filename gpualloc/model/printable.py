"""Text one user wrote, made safe to show on another user's terminal (issue 30, point 5).

A lease's name and command come from whoever made the lease, and ``status`` shows them to every
user of the host: an escape sequence in a name could recolour or rewrite someone else's
terminal, a newline fake a row, a 100 kB argv bury the table. Human output therefore shows them
with every control character escaped (``\\x1b``, ``\\n``) and cut to a length; ``--json`` keeps
them exact, for programs.
"""

from __future__ import annotations

import unicodedata

ELLIPSIS = "..."


def printable(text: str, limit: int | None = None) -> str:
    """``text`` with control and format characters escaped, cut to ``limit`` characters."""
    shown = "".join(_escaped(char) for char in text)
    if limit is not None and len(shown) > limit:
        return shown[: max(0, limit - len(ELLIPSIS))] + ELLIPSIS
    return shown


def _escaped(char: str) -> str:
    if char == "\\":
        return char
    if unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp"):  # controls, bidi overrides, breaks
        return char.encode("unicode_escape").decode("ascii")
    return char


def count_of(n: int, noun: str) -> str:
    """``1 GPU``, ``2 GPUs``: a count with its noun, singular where it is one."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
