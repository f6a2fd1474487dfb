"""msgspec, imported without ``typing_extensions`` and ``platform`` (issue 43, point 3).

Importing this module imports msgspec so; the embedded ledger's command path
(:mod:`gpualloc.cli.jobs`) imports it before anything that imports msgspec. A client of the
broker imports no msgspec at all.
"""

import os
import sys
import types


def import_msgspec_lean() -> None:
    """Import msgspec without ``typing_extensions`` (issue 43, point 3).

    msgspec 0.22 prefers ``typing_extensions.get_type_hints`` when the package is installed
    (typer installs it, through pydantic), and ``typing_extensions`` imports :mod:`inspect`:
    about 8 ms of every command, for hints that :mod:`typing` resolves alike from Python 3.11
    on (gpualloc's records use no ``TypedDict``). The module stays importable by anyone after.
    """
    if sys.version_info < (3, 11) or "msgspec" in sys.modules or "typing_extensions" in sys.modules:
        return
    sys.modules["typing_extensions"] = None  # type: ignore[assignment]  # ImportError inside
    stand_in = "platform" not in sys.modules and "uuid" not in sys.modules
    if stand_in:
        sys.modules["platform"] = _platform_stand_in()
    try:
        import msgspec  # noqa: F401
    finally:
        del sys.modules["typing_extensions"]
        if stand_in:
            del sys.modules["platform"]


def _platform_stand_in() -> types.ModuleType:
    """What :mod:`uuid` (which msgspec imports for its UUID type) asks of :mod:`platform` when
    it is imported, and never after: the system's name, which ``os.uname()`` gives. The real
    module is 1,300 lines that compile nine regular expressions as they load, about 2 ms of
    every command on the embedded ledger; it stays importable by anyone after."""
    module = types.ModuleType("platform")
    module.system = lambda: os.uname().sysname  # type: ignore[attr-defined]
    return module


import_msgspec_lean()
