#!/usr/bin/env python3
"""Generate the shell completion scripts and the manual page from the typer app.

Run from the repository root: ``python scripts/build_docs.py`` writes ``completions/`` (bash,
zsh, fish), ``man/gpualloc.1``, the help pages ``gpualloc/cli/help_pages.json`` and the fast path's
table of commands ``gpualloc/cli/fast_commands.json``; ``--check``
exits 1 if a committed file differs from what this script builds (a test runs the same check).
The completion scripts are static (:mod:`gpualloc.cli.completion_scripts`: the command tree is in
them, so a Tab starts no process); the manual is rendered from the command tree by
:mod:`gpualloc.cli.manpage`; the help pages are typer's own output
(:mod:`gpualloc.cli.static_help`); the table is typer's parameters, as the fast path reads them
(:mod:`gpualloc.cli.fast_table`).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMPLETION_FILES = {"bash": "gpualloc.bash", "zsh": "_gpualloc", "fish": "gpualloc.fish"}


def build_all() -> dict[Path, str]:
    """Repository-relative path -> the text it should have."""
    import typer

    from gpualloc.cli.app import ENVIRONMENT_VARIABLES, app, completion_script
    from gpualloc.cli.fast_table import table_json
    from gpualloc.cli.manpage import render

    files = {
        Path("completions") / name: completion_script(shell)
        for shell, name in COMPLETION_FILES.items()
    }
    files[Path("man") / "gpualloc.1"] = render(typer.main.get_command(app), ENVIRONMENT_VARIABLES)
    files[Path("gpualloc") / "cli" / "help_pages.json"] = help_pages_json()
    files[Path("gpualloc") / "cli" / "fast_commands.json"] = table_json()
    return files


def help_pages_json() -> str:
    """Every help page as typer prints it (see :mod:`gpualloc.cli.static_help`)."""
    import json

    from gpualloc.cli.static_help import render_pages

    return json.dumps(render_pages(), indent=1, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    from generated_files import write_or_check

    return write_or_check(
        __doc__.splitlines()[0],
        lambda: {ROOT / relative: text for relative, text in build_all().items()},
        argv,
    )


if __name__ == "__main__":
    sys.exit(main())
