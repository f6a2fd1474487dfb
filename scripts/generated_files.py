"""What the generators share: write their files, or with ``--check`` report the stale ones."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def write_or_check(
    description: str, build: Callable[[], dict[Path, str]], argv: list[str] | None = None
) -> int:
    """Write every path -> text of ``build()``; with --check, exit status 1 if any differs."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--check", action="store_true", help="fail if the files are stale")
    args = parser.parse_args(argv)
    stale = []
    for path, text in build().items():
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print(f"stale: {', '.join(stale)}; run python {sys.argv[0]}", file=sys.stderr)
        return 1
    return 0
