"""The checkout the tests run from: its root, the optional dependency groups of its
pyproject.toml, and the modules of its ``benchmarks/``."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CHECKOUT = Path(__file__).resolve().parent.parent


def extra_modules(extra: str) -> list[str]:
    """The modules the optional dependency group ``extra`` of pyproject.toml installs (each
    requirement's name is the module it is imported as)."""
    import re

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: tomli, a dependency there
        import tomli as tomllib

    project = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())["project"]
    requirements = project["optional-dependencies"][extra]  # an unknown extra: KeyError
    return [re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0] for requirement in requirements]


def missing_extra(extra: str) -> str | None:
    """Why a test that needs ``extra`` cannot run here (what to install), or None."""
    import importlib.util

    absent = [name for name in extra_modules(extra) if importlib.util.find_spec(name) is None]
    if not absent:
        return None
    return f"needs the {extra} extra ({', '.join(absent)}): pip install -e '.[{extra}]'"


def benchmark_module(name: str) -> Iterator[Any]:
    """A module of ``benchmarks/`` (which is not a package), imported for the test's time."""
    import importlib

    benchmarks = str(CHECKOUT / "benchmarks")
    sys.path.insert(0, benchmarks)
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(benchmarks)
