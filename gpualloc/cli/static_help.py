"""``--help`` without typer: every help page as typer prints it, read from a file.

Importing typer and building its command tree costs about 90 ms; a help page is a fixed text
once the declarations are (issue 29, point 5). ``scripts/build_docs.py`` renders every page
through typer at the width click uses for a terminal of 80 columns or more (and for a pipe),
into ``help_pages.json`` beside this module; a test fails when a page there differs from what
typer prints now. :func:`page_for` answers only the lines it knows exactly, a command path and
``--help``/``-h`` or a group given nothing to do; anything else (global options before
``--help``, a narrower terminal, an unknown command) goes to typer as before.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

PAGES_FILE = os.path.join(os.path.dirname(__file__), "help_pages.json")  # noqa: PTH118, PTH120
"""(os.path, not pathlib: pathlib would be most of what ``--help`` imports.)"""
HELP_FLAGS = ("--help", "-h")
GROUPS = frozenset({"", "topo", "slurm", "config"})
"""The groups, which show their help when given nothing (a test holds this to the pages): any
other one-word line is a command to run, decided here without reading the pages."""
WIDTH = 80
"""Click wraps help at ``min(columns, 80) - 2``: the same text at any width of 80 or more."""


class Page:
    """A help page, and where it goes: stdout for ``--help``; stderr with exit 2 for a group
    given no command (click's ``no_args_is_help``)."""

    def __init__(self, text: str, *, usage_error: bool) -> None:
        self.text = text
        self.usage_error = usage_error


def page_for(args: Sequence[str]) -> Page | None:
    """The page for ``gpualloc ARGS``, or None to let typer answer."""
    if args and args[-1] in HELP_FLAGS:
        path, usage_error = " ".join(args[:-1]), False
    elif len(args) <= 1:  # gpualloc's groups are one word deep: 'gpualloc', 'gpualloc topo'
        path, usage_error = " ".join(args), True
        if path not in GROUPS:
            return None  # 'gpualloc status': a command to run
    else:
        return None  # a command line to run: no page to read
    if any(word.startswith("-") for word in path.split()):
        return None  # an option before --help: typer reads it first (and may refuse it)
    import shutil  # here: every command line passes through, run's included

    if shutil.get_terminal_size((WIDTH, 24)).columns < WIDTH:
        return None  # click wraps narrower there
    pages = _pages()
    entry = pages.get(path)
    if entry is None or (usage_error and not entry["group"]):
        return None
    return Page(entry["text"], usage_error=usage_error)


def _pages() -> dict[str, dict]:
    try:
        with open(PAGES_FILE, encoding="utf-8") as file:  # noqa: PTH123 (no pathlib)
            return json.load(file)
    except (OSError, ValueError):
        return {}  # a broken install: typer still answers


def render_pages() -> dict[str, dict]:
    """Command path -> {"text": its help as typer prints it, "group": whether it is a group that
    shows its help when given nothing}; for the generator and the drift test."""
    import contextlib
    import io
    import sys

    import typer

    from gpualloc.cli.app import app

    exceptions = sys.modules[typer.BadParameter.__module__]  # typer's click, vendored or not
    click_exit = getattr(exceptions, "Exit", typer.Exit)
    pages: dict[str, dict] = {}

    def visit(command: object, path: list[str]) -> None:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.suppress(click_exit, typer.Exit):
            app(args=[*path, "--help"], standalone_mode=False, prog_name="gpualloc")
        group = hasattr(command, "commands")
        pages[" ".join(path)] = {
            "text": out.getvalue(),
            "group": group and bool(getattr(command, "no_args_is_help", False)),
        }
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            if not getattr(sub, "hidden", False):
                visit(sub, [*path, name])

    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(WIDTH)  # what shutil.get_terminal_size, and so click, reads
    try:
        visit(typer.main.get_command(app), [])
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved
    return pages
