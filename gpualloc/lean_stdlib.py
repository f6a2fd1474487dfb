"""The standard library's modules that gpualloc's command paths import, without what those
paths never use, as :mod:`gpualloc.lean_msgspec` does for msgspec.

Importing this module imports :mod:`pathlib` so: the command-line fast path imports it before
anything that imports pathlib.
"""

import sys
import types


def import_pathlib_lean() -> None:
    """Import :mod:`pathlib` without :mod:`urllib.parse` (and through it :mod:`ipaddress` and
    six named tuples), loaded on every command for ``Path.as_uri()`` alone, which gpualloc
    never calls. pathlib takes one function from it as it loads; a stand-in gives it one that
    imports the real module when first called, and the real module stays importable by anyone
    after."""
    if "pathlib" in sys.modules or "urllib.parse" in sys.modules:
        return
    stand_in = sys.modules["urllib.parse"] = _urllib_parse_stand_in()
    try:
        import pathlib
    except ImportError:  # a Python whose pathlib takes more of urllib.parse: the real one
        del sys.modules["urllib.parse"]
        import pathlib  # noqa: F401
    finally:
        if sys.modules.get("urllib.parse") is stand_in:
            del sys.modules["urllib.parse"]


def _urllib_parse_stand_in() -> types.ModuleType:
    module = types.ModuleType("urllib.parse")

    def quote_from_bytes(*args: object, **kwargs: object) -> str:
        from urllib.parse import quote_from_bytes as real

        return real(*args, **kwargs)  # type: ignore[arg-type]

    module.quote_from_bytes = quote_from_bytes  # type: ignore[attr-defined]
    return module


import_pathlib_lean()
