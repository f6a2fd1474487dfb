"""The fast path's table of the other commands, made from typer's command tree.

``run``, ``alloc`` and ``release`` have their own table in :mod:`gpualloc.cli.fastpath`. Every
other command whose module imports no typer (the command modules declare their parameters with
:mod:`gpualloc.cli.declare`) is one entry of ``fast_commands.json``: the function typer calls,
and each parameter as typer reads it (spellings, type, range, default, whether it repeats).
``scripts/build_docs.py`` writes the file from typer's own command objects, as it does the help
pages, and a test fails when it is stale. A parameter the fast path would not read exactly as
typer does (a choice, a callback, a path typer checks, an environment variable, ...) keeps its
command out of the table: typer reads those command lines, as before.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

SCALARS = {bool: "flag", int: "int", float: "float", str: "str", Path: "path"}
PATH_CHECKS = ("exists", "file_okay", "dir_okay", "readable", "writable")
"""typer's checks of a path, which the fast path makes too (leaving a line that fails one to
typer, which says why); a path typer resolves, or reads as ``-`` or as bytes, is not for it."""


def render_table() -> dict[str, dict[str, Any]]:
    """Command path (``status``, ``topo show``) -> its entry, for the generator and the test."""
    import typer

    from gpualloc.cli.app import app
    from gpualloc.cli.fastpath import COMMANDS

    table: dict[str, dict[str, Any]] = {}

    def visit(command: Any, path: list[str]) -> None:
        commands = getattr(command, "commands", None)
        if commands is not None:
            for name, sub in sorted(commands.items()):
                visit(sub, [*path, name])
        elif path[0] not in COMMANDS:
            entry = command_entry(command)
            if entry is not None:
                table[" ".join(path)] = entry

    visit(typer.main.get_command(app), [])
    return table


def table_json() -> str:
    return json.dumps(render_table(), indent=1, sort_keys=True) + "\n"


def command_entry(command: Any) -> dict[str, Any] | None:
    """The fast path's entry for a click command typer made, or None to leave it to typer."""
    function = getattr(command.callback, "__wrapped__", command.callback)
    if "typer" in vars(sys.modules[function.__module__]):
        return None  # its module imports typer (typer.Context, typer.Exit, ...)
    if command.context_settings or not command.allow_interspersed_args:
        return None
    parameters = [parameter_entry(param) for param in command.params]
    if None in parameters or sum(p["argument"] for p in parameters if p) > 1:
        return None
    return {"function": f"{function.__module__}:{function.__qualname__}", "params": parameters}


def parameter_entry(param: Any) -> dict[str, Any] | None:
    """One parameter as the fast path reads it; None where it would not read it as typer."""
    if param.callback or param.is_eager or param.envvar or not param.expose_value:
        return None
    kind, repeated = _kind(param)
    default = param.default
    if isinstance(default, Path):
        default = str(default)
    if kind is None or not (default is None or isinstance(default, (bool, int, float, str))):
        return None
    entry: dict[str, Any] = {"name": param.name, "kind": kind, "default": default}
    if kind == "path":
        info = param.type_descriptor.parameter_info
        entry["checks"] = [check for check in PATH_CHECKS if getattr(info, check)]
    if param.param_type_name == "argument":
        if param.nargs not in (1, -1) or (param.nargs == -1) != repeated:
            return None
        entry.update(argument=True, nargs=param.nargs, required=param.required)
        return entry
    if param.nargs != 1 or repeated != param.multiple or getattr(param, "count", False):
        return None
    if getattr(param, "prompt", None) is not None or (kind == "flag") != param.is_bool_flag:
        return None
    entry.update(
        argument=False,
        opts=list(param.opts),
        secondary=list(param.secondary_opts),
        multiple=param.multiple,
        minimum=param.min if kind in ("int", "float") else None,
        maximum=param.max if kind in ("int", "float") else None,
    )
    return entry


def _kind(param: Any) -> tuple[str | None, bool]:
    """The value's kind (None: one the fast path does not read) and whether it is a list."""
    descriptor = getattr(param, "type_descriptor", None)  # typer 0.20 and later
    if descriptor is None or descriptor.is_choice or descriptor.is_file:
        return None, False
    info = descriptor.parameter_info
    if info.parser is not None or getattr(info, "clamp", False):
        return None, False
    annotation, repeated = descriptor.annotation, descriptor.is_list
    if repeated:
        (annotation,) = annotation.__args__
    kind = SCALARS.get(annotation)
    if kind == "path" or descriptor.is_path:
        plain = not (info.resolve_path or info.allow_dash or info.path_type)
        kind = "path" if kind == "path" and plain else None
    if kind == "flag" and (repeated or not getattr(param, "is_flag", False)):
        kind = None
    return kind, repeated
