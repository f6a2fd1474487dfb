"""Tables that fit the terminal they are shown on (tests/test_terminal_output.py).

rich, left to itself, narrows every column of a table wider than the terminal and cuts what
no longer fits with an ellipsis: at 80 columns a 16-GPU link matrix became ``N…`` cells and
``simulate``'s figures ``15…``. Here no number, identifier or header is ever cut. A table
wider than the terminal is laid out in these steps, each taken only while the last one is not
enough:

1. headers wrap at their spaces (``Mean JCT`` over two lines), the widest savings first;
2. columns of prose (:attr:`Table.wrap`: a GPU's name, a finding's detail) wrap at their
   spaces, the widest column first, never below their longest word;
3. the columns are split into blocks shown one under the other, each repeating the table's
   key columns (:attr:`Table.keys`: the row labels), the way ``numactl -H`` and R print a wide
   matrix. The blocks hold as even a share of the columns as fits.

Only the layout is computed here (pure: texts in, widths out);
:func:`gpualloc.cli.output.print_rich` draws it with rich. Plain output (a pipe, a file) is
left whole for ``grep`` and ``awk``, unless ``COLUMNS`` asks for a width (as rich and ``ls``
read it): then its plain columns, two spaces apart (``gap``), are laid out here the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

Measure = Callable[[str], int]

EDGES = 2
"""rich's box (SIMPLE_HEAD, ``pad_edge=False``) takes a space at each edge of the table..."""
BETWEEN = 3
"""...and between two columns their two padding spaces and the (blank) divider."""
PLAIN_GAP = 2
"""Plain text's columns are two spaces apart (and indented by two, as rich's edges take)."""


class ColumnSize(NamedTuple):
    """How narrow a column can be at each step (see the module docstring)."""

    natural: int
    """Everything on one line: the widest cell, or the header where that is wider."""
    header_wrapped: int
    """The header wrapped at its spaces, the cells whole."""
    least: int
    """Also prose wrapped at its spaces: the longest word of the column."""


class Block(NamedTuple):
    """Columns shown together: their indices in the table (key columns first) and widths."""

    columns: list[int]
    widths: list[int]


def table_width(widths: Sequence[int], gap: int = BETWEEN) -> int:
    """The characters a table with columns of these widths, ``gap`` apart, takes on a line."""
    return sum(widths) + gap * len(widths) + EDGES - gap if widths else 0


def column_size(
    header: str, cells: Sequence[str], prose: bool, measure: Measure = len
) -> ColumnSize:
    header_full = measure(header)
    header_word = max((measure(word) for word in header.split()), default=0)
    cells_full = max((measure(cell) for cell in cells), default=0)
    cells_word = cells_full
    if prose:
        cells_word = max((measure(word) for cell in cells for word in cell.split()), default=0)
    natural = max(header_full, cells_full)
    header_wrapped = min(natural, max(header_word, cells_full))
    return ColumnSize(natural, header_wrapped, min(header_wrapped, max(header_word, cells_word)))


def fit_widths(sizes: Sequence[ColumnSize], width: int, gap: int = BETWEEN) -> list[int] | None:
    """Widths for these columns in ``width`` characters, each as wide as it can stay; None
    when even the narrowest layout is wider."""
    widths = [size.natural for size in sizes]
    excess = table_width(widths, gap) - width
    by_saving = sorted(
        range(len(sizes)), key=lambda i: sizes[i].natural - sizes[i].header_wrapped, reverse=True
    )
    for i in by_saving:
        if excess <= 0:
            break
        taken = min(widths[i] - sizes[i].header_wrapped, excess)
        if taken > 0:
            widths[i] -= taken
            excess -= taken
    while excess > 0:
        narrower = [i for i in range(len(sizes)) if widths[i] > sizes[i].least]
        if not narrower:
            return None
        widest = max(narrower, key=lambda i: widths[i])
        taken = min(excess, widths[widest] - sizes[widest].least)
        # A char at a time spreads the wrapping over the prose columns as wide as each other.
        ties = [i for i in narrower if widths[i] == widths[widest]]
        if len(ties) > 1:
            taken = 1
        widths[widest] -= taken
        excess -= taken
    return widths


def layout(
    columns: Sequence[str],
    rows: Sequence[Sequence[str]],
    width: int,
    *,
    wrap: Sequence[int] = (),
    keys: int = 1,
    measure: Measure = len,
    gap: int = BETWEEN,
) -> list[Block]:
    """The blocks a table of these ``columns`` (headers) and ``rows`` is shown in at ``width``
    characters (one when it fits): ``wrap`` are its columns of prose, the first ``keys`` label
    its rows, ``gap`` characters apart."""
    count = len(columns)
    sizes = [
        column_size(columns[i], [row[i] for row in rows], i in wrap, measure) for i in range(count)
    ]
    key_columns = list(range(min(keys, count)))
    rest = list(range(len(key_columns), count))
    whole = fit_widths(sizes, width, gap)
    if whole is not None or not rest:
        return [Block(list(range(count)), whole or [size.least for size in sizes])]

    def fits(group: list[int]) -> bool:
        return table_width([sizes[i].least for i in key_columns + group], gap) <= width

    groups: list[list[int]] = [[]]
    for i in rest:
        if groups[-1] and not fits([*groups[-1], i]):
            groups.append([])
        groups[-1].append(i)
    share = math.ceil(len(rest) / len(groups))
    even = [rest[start : start + share] for start in range(0, len(rest), share)]
    if len(even) == len(groups) and all(fits(group) for group in even):
        groups = even
    blocks = []
    for group in groups:
        shown = key_columns + group
        chosen = [sizes[i] for i in shown]
        blocks.append(Block(shown, fit_widths(chosen, width, gap) or [s.least for s in chosen]))
    return blocks


def wrap_header(header: str, width: int) -> str:
    """``header`` broken at its spaces into lines of at most ``width`` (a word is never cut)."""
    import textwrap

    lines = textwrap.wrap(header, width, break_long_words=False, break_on_hyphens=False)
    return "\n".join(lines) or header
