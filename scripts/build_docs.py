#!/usr/bin/env python3
"""Generate the shell completion scripts and the manual page from the typer app.

Run from the repository root: ``python scripts/build_docs.py`` writes ``completions/`` (bash,
zsh, fish) and ``man/gpualloc.1``; ``--check`` exits 1 if a committed file differs from what
this script builds (a test runs the same check). The completion scripts call ``gpualloc`` back
on every Tab (``_GPUALLOC_COMPLETE``), so they stay right as commands and options change; the
manual is rendered from the command tree by :mod:`gpualloc.cli.manpage`.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMPLETION_FILES = {"bash": "gpualloc.bash", "zsh": "_gpualloc", "fish": "gpualloc.fish"}
COMPLETE_VARIABLE = "_GPUALLOC_COMPLETE"


def build_all() -> dict[Path, str]:
    """Repository-relative path -> the text it should have."""
    import typer
    from typer._completion_shared import get_completion_script

    from gpualloc.cli.app import ENVIRONMENT_VARIABLES, app
    from gpualloc.cli.manpage import render

    files = {
        Path("completions") / name: get_completion_script(
            prog_name="gpualloc", complete_var=COMPLETE_VARIABLE, shell=shell
        ).rstrip("\n")
        + "\n"
        for shell, name in COMPLETION_FILES.items()
    }
    files[Path("man") / "gpualloc.1"] = render(typer.main.get_command(app), ENVIRONMENT_VARIABLES)
    return files


def main(argv: list[str] | None = None) -> int:
    from generated_files import write_or_check

    return write_or_check(
        __doc__.splitlines()[0],
        lambda: {ROOT / relative: text for relative, text in build_all().items()},
        argv,
    )


if __name__ == "__main__":
    sys.exit(main())
