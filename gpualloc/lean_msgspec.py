"""msgspec, imported without ``typing_extensions``, ``platform`` and the modules gpualloc
never uses, which the hot path would pay for.

Importing this module imports msgspec so; the embedded ledger's command path
(:mod:`gpualloc.cli.jobs`) imports it before anything that imports msgspec. A client of the
broker imports no msgspec at all.
"""

import os
import sys
import types
from typing import Any

LAZY_MODULES = ("msgspec.inspect", "msgspec._json_schema")
"""msgspec's modules that its package imports and gpualloc never uses: type introspection and
JSON Schema (with :mod:`textwrap`), loaded by every command that reads a ledger. Each loads
when first used (see :func:`_lazy_module`)."""


def import_msgspec_lean() -> None:
    """Import msgspec without ``typing_extensions``.

    msgspec 0.22 prefers ``typing_extensions.get_type_hints`` when the package is installed
    (typer installs it, through pydantic), and ``typing_extensions`` imports :mod:`inspect`,
    on every command, for hints that :mod:`typing` resolves alike from Python 3.11
    on (gpualloc's records use no ``TypedDict``). The module stays importable by anyone after.
    """
    if sys.version_info < (3, 11) or "msgspec" in sys.modules or "typing_extensions" in sys.modules:
        return
    sys.modules["typing_extensions"] = None  # type: ignore[assignment]  # ImportError inside
    stand_in = "platform" not in sys.modules and "uuid" not in sys.modules
    if stand_in:
        sys.modules["platform"] = _platform_stand_in()
    for name in LAZY_MODULES:
        sys.modules[name] = _lazy_module(name)
    try:
        import msgspec
    except (ImportError, AttributeError):  # a Python or msgspec that asks the stand-ins more
        for name in [m for m in sys.modules if m.split(".")[0] in ("msgspec", "uuid")]:
            del sys.modules[name]
        del sys.modules["typing_extensions"]
        if stand_in:
            del sys.modules["platform"]
        stand_in = False
        import msgspec  # noqa: F401  # whole, as anyone imports it
    finally:
        if sys.modules.get("typing_extensions", False) is None:
            del sys.modules["typing_extensions"]
        if stand_in:
            del sys.modules["platform"]


def _platform_stand_in() -> types.ModuleType:
    """What :mod:`uuid` (which msgspec imports for its UUID type) asks of :mod:`platform` when
    it is imported, and never after: the system's name, which ``os.uname()`` gives. The real
    module is 1,300 lines that compile nine regular expressions as they load, on
    every command on the embedded ledger; it stays importable by anyone after."""
    module = types.ModuleType("platform")
    module.system = lambda: os.uname().sysname  # type: ignore[attr-defined]
    return module


def _lazy_module(name: str) -> types.ModuleType:
    """A stand-in for the module ``name`` that imports the real one when first used, and from
    then on has all of its names: any attribute asked of it, and, for ``_json_schema``, the two
    functions the package takes from it when it is imported (``msgspec.json.schema`` and
    ``msgspec.schema``), which load the real module when called."""
    module = types.ModuleType(name)

    def load() -> types.ModuleType:
        import importlib

        if sys.modules.get(name) is module:
            del sys.modules[name]
        real = importlib.import_module(name)  # the package's attribute becomes the real one
        module.__dict__.update({k: v for k, v in vars(real).items() if k != "__getattr__"})
        return real

    def __getattr__(attribute: str) -> Any:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        return getattr(load(), attribute)

    def calls(function: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            return getattr(load(), function)(*args, **kwargs)

        call.__name__ = call.__qualname__ = function
        return call

    module.__getattr__ = __getattr__  # type: ignore[method-assign]
    if name == "msgspec._json_schema":
        module.schema = calls("schema")  # type: ignore[attr-defined]
        module.schema_components = calls("schema_components")  # type: ignore[attr-defined]
    return module


import_msgspec_lean()
