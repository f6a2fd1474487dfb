"""Human and JSON rendering. stdout is data, stderr is people (house style habit 6).

Human output is a sequence of :class:`Table` objects: rich tables with colour on a terminal,
plain aligned text when stdout is a pipe or a file (so ``grep`` and ``awk`` work on it), a row
a line, or fitted to ``COLUMNS`` where that is set (``COLUMNS=80 gpualloc topo show | less``,
as rich and ``ls`` read it). JSON is sorted and indented. rich is imported only when a terminal
will show it.
"""

import contextlib
import json
import os
import sys
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from rich.console import Console

STYLE_BY_CLASS = {
    "NV": "bold green",
    "BOARD": "cyan",
    "PIX": "cyan",
    "PXB": "cyan",
    "PHB": "yellow",
    "NODE": "yellow",
    "SYS": "red",
    "UNKNOWN": "dim",
}


class Table(NamedTuple):
    """A titled table; ``styles`` optionally gives a rich style per cell. (A NamedTuple: every
    command loads this module, ``--help`` too, which imports no msgspec:
    tests/test_cli_help.py::test_help_imports_nothing_heavy.)"""

    title: str
    columns: list[str]
    rows: list[list[str]]
    styles: list[list[str | None]] | None = None
    caption: str | None = None
    right_align_from: int | None = None
    """Columns from this index on are right-aligned (numbers)."""
    wrap: tuple[int, ...] = ()
    """Columns of prose (a name, a detail), which may wrap at their spaces on a narrow
    terminal; every other cell stays whole (:mod:`gpualloc.cli.table_fit`)."""
    keys: int = 1
    """Leading columns that label a row, repeated in each block of a table split to fit."""


class StdoutClosed(Exception):
    """The reader of stdout went away (``gpualloc ... | head``).

    Not an OSError on purpose: a command that catches OSError for its own files must not take a
    closed stdout for one of them; writes translate EPIPE here and ``run()`` exits quietly with
    141.
    """


def write_stdout(text: str) -> None:
    """Every write to stdout goes through here (or through :func:`_print_rich`)."""
    with stdout_errors():
        sys.stdout.write(text)
        sys.stdout.flush()


def flush_stdout() -> None:
    """Whatever is still buffered for stdout, written now: a command's output that cannot be
    written is an error (exit 8), not a silent success (tests/test_bad_input_files.py: output to
    a full device or a closed stdout)."""
    if sys.stdout is not None:
        with stdout_errors():
            sys.stdout.flush()


@contextlib.contextmanager
def stdout_errors() -> Iterator[None]:
    """Writes to stdout inside: a reader that went away is :class:`StdoutClosed` (exit 141,
    quietly); stdout closed (``>&-``) or failing (a full disk, ``> /dev/full``) is a
    :class:`~gpualloc.errors.FileAccessError` (exit 8): output that was lost is never a
    success."""
    from gpualloc.errors import FileAccessError

    if sys.stdout is None:  # Python's stdout when descriptor 1 was closed at start
        raise _closed()
    try:
        yield
    except BrokenPipeError as exc:
        raise StdoutClosed from exc
    except (OSError, ValueError) as exc:  # ValueError: "I/O operation on closed file"
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise FileAccessError(f"cannot write the output to stdout: {reason}") from exc


def _closed() -> Exception:
    from gpualloc.errors import FileAccessError

    return FileAccessError(
        "stdout is closed: the output has nowhere to go",
        hint="run it with stdout open ('> /dev/null' discards the output)",
    )


class CheckedStdout:
    """``sys.stdout`` while a command runs (:func:`gpualloc.cli.main.run` installs it): every
    write, whoever makes it (a help page, rich, a command's own), fails as
    :func:`stdout_errors` says, so that no command can lose its output and exit 0."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        if self._stream is None:
            raise _closed()
        with stdout_errors():
            return self._stream.write(text)

    def flush(self) -> None:
        if self._stream is not None:
            with stdout_errors():
                self._stream.flush()

    def isatty(self) -> bool:
        return self._stream is not None and self._stream.isatty()

    def __getattr__(self, name: str) -> Any:
        if self._stream is None:
            raise _closed()
        return getattr(self._stream, name)


def stdout_is_terminal() -> bool:
    return sys.stdout is not None and sys.stdout.isatty()


def print_json(data: Any) -> None:
    write_stdout(json.dumps(data, indent=2, sort_keys=True) + "\n")


def print_json_line(data: Any) -> None:
    """``data`` as one compact line, flushed: a document of JSON Lines (``status --json
    --watch``), which ``jq`` and a reader of a pipe take one line at a time."""
    write_stdout(json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n")


def print_lines(lines: list[str]) -> None:
    write_stdout("".join(line + "\n" for line in lines))


def print_tables(
    tables: list[Table], *, heading: str | None = None, footer: list[str] | None = None
) -> None:
    """``tables`` for people. Every text in them is shown with its control characters escaped:
    a topology file's GPU names, a process's name, a fault's detail or a lease's name may hold
    an escape sequence that would recolour or rewrite the reader's terminal
    (tests/test_fuzz_findings.py::test_printable_escapes_only_what_it_shows)."""
    from gpualloc.model.printable import printable

    tables = [_shown(table) for table in tables]
    heading = printable(heading) if heading else heading
    footer = [printable(line) for line in footer or []]
    if stdout_is_terminal():
        with stdout_errors():
            _print_rich(tables, heading, footer or [])
    else:
        _print_plain(tables, heading, footer or [], piped_width())


def piped_width() -> int | None:
    """The width ``COLUMNS`` asks plain output to fit (a positive number), else None: each
    table row then stays on one line, whole, for ``grep`` and ``awk``."""
    text = os.environ.get("COLUMNS", "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def figure(value: float | None, unit: str = " GB/s") -> str:
    """A score in a sentence: ``57.9 GB/s``, ``125 GB/s`` (one decimal at most: ``57.8579``
    beside ``107.88`` read as noise); ``n/a`` where there is none (one GPU has no
    link to score). In a table column, :func:`fixed`."""
    return "n/a" if value is None else f"{value:.1f}".removesuffix(".0") + unit


def fixed(value: float | None, digits: int = 1) -> str:
    """A figure in a table column: the same decimals down the column, so that its points line
    up (``125.0`` over ``57.9``); ``n/a`` where there is none."""
    return "n/a" if value is None else f"{value:.{digits}f}"


def say(message: str) -> None:
    """A line for people, on stderr, its control characters escaped (it may name a file, a
    GPU or a fault as a topology file words it)."""
    from gpualloc.model.printable import printable

    sys.stderr.write(printable(message) + "\n")


MAX_ERROR_CHARS = 500
"""An error line echoes what the user gave (a 3,000-character --exclude, a file name): each
line is cut to this many characters and its control characters escaped
(tests/test_fuzz_findings.py, the long values echoed cut)."""


def write_error(message: str, hint: str | None, details: tuple[str, ...] = ()) -> None:
    """``error: MESSAGE``, the details, ``hint: HINT`` on stderr, each line cut and its control
    characters escaped: also for the problems a command reports before it exits (release)."""
    from gpualloc.model.printable import printable

    sys.stderr.write(f"error: {printable(message, MAX_ERROR_CHARS)}\n")
    for line in details:
        sys.stderr.write(f"  {printable(line, MAX_ERROR_CHARS)}\n")
    if hint:
        sys.stderr.write(f"hint: {printable(hint, MAX_ERROR_CHARS)}\n")


def _shown(table: Table) -> Table:
    from gpualloc.model.printable import printable

    return table._replace(
        title=printable(table.title),
        columns=[printable(column) for column in table.columns],
        rows=[[printable(cell) for cell in row] for row in table.rows],
        caption=printable(table.caption) if table.caption else table.caption,
    )


def _print_plain(
    tables: list[Table], heading: str | None, footer: list[str], width: int | None = None
) -> None:
    """Aligned columns two spaces apart, a row a line; within ``width`` characters where it
    is given, laid out as :func:`print_rich` fits a terminal (:mod:`gpualloc.cli.table_fit`)."""

    def fit(line: str) -> list[str]:
        return [line] if width is None else _wrapped(line, width)

    out: list[str] = []
    if heading:
        out += [*fit(heading), ""]
    for table in tables:
        out += fit(table.title)
        if width is None:
            rows = [[[cell] for cell in row] for row in [table.columns, *table.rows]]
            widths = [max(len(row[i][0]) for row in rows) for i in range(len(table.columns))]
            out += _plain_lines(table, rows, range(len(widths)), widths)
        else:
            out += _fitted_lines(table, width)
        if table.caption:
            out += fit("  " + table.caption)
        out.append("")
    for line in footer:
        out += fit(line)
    while out and not out[-1]:
        out.pop()
    print_lines(out)


def _fitted_lines(table: Table, width: int) -> list[str]:
    """``table`` in ``width`` characters: its headers and prose wrapped at their spaces, or
    its columns in blocks one under the other, each repeating the row labels."""
    from gpualloc.cli.table_fit import PLAIN_GAP, layout, wrap_header

    out: list[str] = []
    blocks = layout(
        table.columns, table.rows, width, wrap=table.wrap, keys=table.keys, gap=PLAIN_GAP
    )
    for block in blocks:
        shown = list(zip(block.columns, block.widths, strict=True))
        rows = [[wrap_header(table.columns[i], w).split("\n") for i, w in shown]]
        rows += [
            [_wrapped(row[i], w) if i in table.wrap else [row[i]] for i, w in shown]
            for row in table.rows
        ]
        out += ([""] if out else []) + _plain_lines(table, rows, block.columns, block.widths)
    return out


def _plain_lines(
    table: Table, rows: list[list[list[str]]], columns: Iterable[int], widths: list[int]
) -> list[str]:
    """The lines of ``rows``, each a cell (the lines its text takes) per one of ``columns``,
    every cell padded to its column's width and aligned as the column is."""
    right = [table.right_align_from is not None and i >= table.right_align_from for i in columns]
    out = []
    for row in rows:
        for k in range(max((len(cell) for cell in row), default=1)):
            texts = [cell[k] if k < len(cell) else "" for cell in row]
            parts = [
                text.rjust(w) if r else text.ljust(w)
                for text, w, r in zip(texts, widths, right, strict=True)
            ]
            out.append("  " + "  ".join(parts).rstrip())
    return out


def _wrapped(line: str, width: int) -> list[str]:
    """``line`` broken at its spaces into lines of at most ``width``, each keeping its indent
    (a word longer than that stays whole)."""
    import textwrap

    text = line.lstrip(" ")
    indent = " " * (len(line) - len(text))
    lines = textwrap.wrap(
        text,
        width,
        initial_indent=indent,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    )
    return lines or [line]


def _print_rich(tables: list[Table], heading: str | None, footer: list[str]) -> None:
    from rich.console import Console

    print_rich(Console(highlight=False), tables, heading, footer)


def print_rich(
    console: "Console", tables: list[Table], heading: str | None, footer: list[str]
) -> None:
    """``tables`` on ``console``, each fitted to its width (:mod:`gpualloc.cli.table_fit`);
    the titles, captions and footer lines wrap at their spaces."""
    from rich import box
    from rich.cells import cell_len
    from rich.padding import Padding
    from rich.table import Table as RichTable
    from rich.text import Text

    from gpualloc.cli.table_fit import layout, wrap_header

    if heading:
        console.print(Text(heading, style="bold"))
        console.print()
    for table in tables:
        console.print(Text(table.title, style="bold"))
        blocks = layout(
            table.columns,
            table.rows,
            console.width,
            wrap=table.wrap,
            keys=table.keys,
            measure=cell_len,
        )
        for block in blocks:
            rich_table = RichTable(box=box.SIMPLE_HEAD, pad_edge=False)
            for i, width in zip(block.columns, block.widths, strict=True):
                right = table.right_align_from is not None and i >= table.right_align_from
                rich_table.add_column(
                    Text(wrap_header(table.columns[i], width)),
                    justify="right" if right else "left",
                    width=width,
                    # Only prose is narrower than its cells; "fold" rather than an ellipsis for
                    # a word wider than the whole terminal.
                    overflow="fold",
                )
            for r, row in enumerate(table.rows):
                styles = table.styles[r] if table.styles else [None] * len(row)
                rich_table.add_row(*(Text(row[i], style=styles[i] or "") for i in block.columns))
            console.print(rich_table)
        if table.caption:
            console.print(Text(table.caption))
    for line in footer:
        # An indented line (a note under the line above it) keeps its indent when it wraps.
        text = line.lstrip(" ")
        indent = len(line) - len(text)
        shown = Text(text, style="dim" if indent >= 2 else "")
        console.print(Padding(shown, (0, 0, 0, indent), expand=False) if indent else shown)
