#!/usr/bin/env python3
"""Generate the shell completion scripts and the manual page from the command declarations.

Run from the repository root: ``python scripts/build_docs.py`` writes ``completions/`` (bash,
zsh, fish) and ``man/gpualloc.1``; ``--check`` exits 1 if a committed file differs from what
this script builds (a test runs the same check). Both come from the declarations ``--help``
is rendered from (:mod:`gpualloc.cli.declare`): the completion scripts are static
(:mod:`gpualloc.cli.completion_scripts`: the command tree is in them, so a Tab starts no
process); the manual is rendered by :mod:`gpualloc.cli.manpage`.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMPLETION_FILES = {"bash": "gpualloc.bash", "zsh": "_gpualloc", "fish": "gpualloc.fish"}


def build_all() -> dict[Path, str]:
    """Repository-relative path -> the text it should have."""
    from gpualloc.cli.manpage import render
    from gpualloc.cli.shell import completion_script

    files = {
        Path("completions") / name: completion_script(shell)
        for shell, name in COMPLETION_FILES.items()
    }
    files[Path("man") / "gpualloc.1"] = render()
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
