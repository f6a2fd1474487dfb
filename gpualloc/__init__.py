"""gpualloc: a topology-aware GPU allocator and job launcher for one shared multi-GPU host."""

import sys as _sys

__version__ = "0.1.0"


def import_msgspec_lean() -> None:
    """Import msgspec without ``typing_extensions`` (issue 43, point 3).

    msgspec 0.22 prefers ``typing_extensions.get_type_hints`` when the package is installed
    (typer installs it, through pydantic), and ``typing_extensions`` imports :mod:`inspect`:
    about 8 ms of every command, for hints that :mod:`typing` resolves alike from Python 3.11
    on (gpualloc's records use no ``TypedDict``). The module stays importable by anyone after.
    Called by the first module of the embedded ledger's path that imports msgspec; a client
    of the broker imports no msgspec at all.
    """
    if (
        _sys.version_info < (3, 11)
        or "msgspec" in _sys.modules
        or "typing_extensions" in _sys.modules
    ):
        return
    _sys.modules["typing_extensions"] = None  # type: ignore[assignment]  # ImportError inside
    try:
        import msgspec  # noqa: F401
    finally:
        del _sys.modules["typing_extensions"]
