"""The command-line fast path: every command without typer, when the line is well formed.

Importing typer (and, through typer, pydantic) costs more than everything ``gpualloc run`` does
itself (issue 18, point 9), and typer 0.29 converts each value through pydantic: about five
times Python's own start-up for ``gpualloc status`` (issue 43, point 3). Most command lines are
simple: global options, a command, its options and arguments. :func:`parse` reads exactly those,
with click's rules for them (``--opt value``, ``--opt=value``, ``-nVALUE``, the last of a
repeated option wins unless it repeats, ``--`` ends the options, and for ``run`` so does the
first argument that is not an option). ``run``, ``alloc`` and ``release`` are read from the
tables below and handed to the functions the typer commands call (:mod:`gpualloc.cli.jobs`);
every other command whose module imports no typer is read from ``fast_commands.json``
(:mod:`gpualloc.cli.fast_table` makes it from typer's command tree) and its command function
called as typer would call it, with every parameter. Anything else returns None and goes to
typer: ``--help``, completion requests, an unknown or malformed option, a value out of range.
So typer still writes every usage error, and the fast path never accepts a line that typer
would refuse or read differently. Tests check these tables against typer's declarations, option
by option, and run corpora of command lines through both.

NamedTuples and a plain class, not msgspec Structs or dataclasses: every command line passes
through :func:`parse`, and those imports cost 10 to 20 ms that ``--help`` does not need.
"""

import os
from collections.abc import Mapping
from typing import Any, Literal, NamedTuple

from gpualloc.job_options import Table, options_of

Kind = Literal["flag", "int", "float", "str", "path"]

COMPLETION_VARIABLE = "_GPUALLOC_COMPLETE"
"""Set by the shell when it asks for completions: typer answers those."""
TABLE_FILE = os.path.join(os.path.dirname(__file__), "fast_commands.json")  # noqa: PTH118, PTH120
"""The other commands (os.path: pathlib is not loaded yet on every path that comes here)."""
FLAG_WORDS = {"1": True, "0": False}
"""Values of a flag's environment variable read here; click's other words (``yes``, ``off``,
...) and its refusal of anything else are left to typer."""


class Option(NamedTuple):
    """One option as typer declares it: its spellings, the parameter it sets, how its value
    reads, and the range typer checks (a value outside it goes to typer, which says so)."""

    names: tuple[str, ...]
    dest: str
    kind: Kind = "str"
    flag_value: bool = True
    """For a flag: the value it sets (``--insensitive`` sets ``sensitive`` to False)."""
    minimum: float | None = None
    maximum: float | None = None
    envvar: str | None = None
    """Read when the option is not given and the variable is not empty, as click does."""
    multiple: bool = False
    """Given again, adds a value to a list (typer's ``list[...]`` option)."""
    checks: tuple[str, ...] = ()
    """For a path: typer's checks (:data:`gpualloc.cli.fast_table.PATH_CHECKS`) it must pass."""

    def convert(self, text: str) -> Any:
        """The value for ``text``; ValueError where typer would refuse it, or might read it
        otherwise (digits other than ASCII, a number that is not finite: pydantic's rules)."""
        if self.kind == "path":
            return _path(text, self.checks)
        if self.kind == "str":
            return text
        if not text.isascii():
            raise ValueError(text)
        value: int | float = int(text) if self.kind == "int" else float(text)
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(text)
        if self.minimum is not None and value < self.minimum:
            raise ValueError(text)
        if self.maximum is not None and value > self.maximum:
            raise ValueError(text)
        return value


def _path(text: str, checks: tuple[str, ...]) -> Any:
    """``Path(text)`` if it passes typer's checks of a path (its ``coerce_cli_path``): an
    existing path readable unless told otherwise, a missing one only if it need not exist."""
    import stat
    from pathlib import Path

    path = Path(text)
    try:
        mode = path.stat().st_mode
    except OSError:
        if "exists" in checks:
            raise ValueError(text) from None
        return path
    if (
        ("file_okay" not in checks and stat.S_ISREG(mode))
        or ("dir_okay" not in checks and stat.S_ISDIR(mode))
        or ("readable" in checks and not os.access(path, os.R_OK))
        or ("writable" in checks and not os.access(path, os.W_OK))
    ):
        raise ValueError(text)
    return path


def _flag(*names: str, dest: str, value: bool = True) -> Option:
    return Option(names, dest, "flag", flag_value=value)


GLOBAL_OPTIONS = (
    Option(("--topology", "-t"), "topology", envvar="GPUALLOC_TOPOLOGY"),
    Option(
        ("--bandwidth-table",),
        "bandwidth_table",
        "path",
        checks=("file_okay", "dir_okay"),
    ),
    _flag("--refresh", dest="refresh"),
    Option(("--debug",), "debug", "flag", envvar="GPUALLOC_DEBUG"),
)


def fast_options(command: str, table: Table | None = None) -> tuple[Option, ...]:
    """The fast path's options for ``command`` from the table of job options
    (:mod:`gpualloc.job_options`): each row's spellings, and a flag's negative ones."""
    options: list[Option] = []
    for row in options_of(command, table):
        if row.kind == "flag":
            options.append(_flag(*row.spellings, dest=row.dest))
            if row.negative:
                options.append(_flag(*row.negative, dest=row.dest, value=False))
        else:
            bounds = (row.minimum, row.maximum)
            options.append(Option(row.spellings, row.dest, row.kind, True, *bounds))
    return tuple(options)


RUN_OPTIONS = (
    *fast_options("run"),
    Option(("--numa",), "numa"),
    _flag("--dry-run", dest="dry_run"),
    _flag("--quiet", "-q", dest="quiet"),
    _flag("--json", dest="as_json"),
)
ALLOC_OPTIONS = (
    *fast_options("alloc"),
    Option(("--pid",), "pid", "int", minimum=1),
    _flag("--hold", dest="hold"),
    Option(("--format",), "output_format"),
)
RELEASE_OPTIONS = (
    _flag("--mine", dest="mine"),
    _flag("--include-running", dest="include_running"),
    _flag("--evict-shared", dest="evict_shared"),
    Option(("--grace",), "grace"),
    _flag("--json", dest="as_json"),
)


class CommandSpec(NamedTuple):
    """A command the fast path takes: its options and what its arguments are."""

    options: tuple[Option, ...]
    arguments: Literal["none", "command", "list", "one"]
    """none: no arguments; command: the job's argv, which ends the options (``run``); list:
    arguments anywhere among the options (``release``'s lease ids); one: at most one, anywhere
    among the options."""
    argument_dest: str | None = None
    function: str = ""
    """The name of the function in :mod:`gpualloc.cli.jobs`; for a command of the table,
    ``module:function``."""
    argument: Option | None = None
    """How a table command's argument reads (its kind and checks), and whether it is required
    (``minimum`` 1)."""
    defaults: dict[str, Any] | None = None
    """For a command of the table: each parameter's value when not given (typer's), since
    typer passes every parameter to the function."""


COMMANDS: dict[str, CommandSpec] = {
    "run": CommandSpec(RUN_OPTIONS, "command", "command", "run_job"),
    "alloc": CommandSpec(ALLOC_OPTIONS, "none", None, "alloc_gpus"),
    "release": CommandSpec(RELEASE_OPTIONS, "list", "leases", "release_gpus"),
}


class FastCommand:
    """A command line the fast path understood: the global options given or set in the
    environment (the rest take their defaults), and the command's values."""

    def __init__(
        self, name: str, global_values: dict[str, Any], values: dict[str, Any], function: str = ""
    ) -> None:
        self.name = name
        self.global_values = global_values
        self.values = values
        self.function = function
        """A table command's ``module:function``."""

    def invoke(self) -> Any:
        """Apply the global options as typer's callback does, then do the command's work; what
        the command function returns (an int is the exit status, as under typer)."""
        from gpualloc import lean_stdlib  # noqa: F401 - pathlib first, without urllib.parse
        from gpualloc.cli.state import STATE

        STATE.apply_global_options(**self.global_values)
        if self.function:
            import importlib

            from gpualloc import lean_msgspec  # noqa: F401 - msgspec first, as jobs.py imports it

            module, _, function = self.function.partition(":")
            return getattr(importlib.import_module(module), function)(**self.values)
        from gpualloc.cli import brokered

        work = COMMANDS[self.name].function
        if brokered.call(work, self.values):
            return None
        from gpualloc.cli import jobs

        jobs.call(work, self.values, broker_tried=True)
        return None


class _NotForUs(Exception):
    """The line is one for typer (help, an error to explain, something the table lacks)."""


def parse(args: list[str], environ: Mapping[str, str]) -> FastCommand | None:
    """The command line as the fast path runs it, or None to leave it to typer."""
    if COMPLETION_VARIABLE in environ:
        return None
    try:
        return _parse(args, environ)
    except _NotForUs:
        return None


def _parse(args: list[str], environ: Mapping[str, str]) -> FastCommand:
    position = 0
    given: dict[str, Any] = {}
    while position < len(args) and args[position].startswith("-"):
        position = _take_option(args, position, GLOBAL_OPTIONS, given)
    if position == len(args):
        raise _NotForUs
    name = args[position]
    spec = COMMANDS.get(name)
    if spec is None:
        table = table_commands()
        if name not in table and position + 1 < len(args):
            name = f"{name} {args[position + 1]}"  # a command of a group: 'topo show'
            position += 1
        spec = table.get(name)
        if spec is None:
            raise _NotForUs
    global_values = {  # options neither given nor in the environment take the defaults
        option.dest: _from_environment(option, environ[option.envvar])
        for option in GLOBAL_OPTIONS
        if option.envvar and environ.get(option.envvar) and option.dest not in given
    }
    global_values.update(given)
    values: dict[str, Any] = {}  # options not given take the functions' defaults, typer's own
    arguments: list[str] = []
    position += 1
    while position < len(args):
        token = args[position]
        if token == "--":
            arguments += args[position + 1 :]
            break
        if token.startswith("-") and token != "-":
            position = _take_option(args, position, spec.options, values)
            continue
        if spec.arguments == "none" or token == "-":
            raise _NotForUs
        if spec.arguments == "command":
            arguments += args[position:]
            break
        arguments.append(token)
        position += 1
    if spec.arguments == "command":
        if not arguments:
            raise _NotForUs  # typer says the command is missing
        values[str(spec.argument_dest)] = arguments
    elif spec.arguments in ("list", "one"):
        _take_arguments(spec, arguments, values)
    elif arguments:
        raise _NotForUs
    if spec.defaults is None:
        return FastCommand(name, global_values, values)
    return FastCommand(name, global_values, {**spec.defaults, **values}, spec.function)


def _take_arguments(spec: CommandSpec, arguments: list[str], values: dict[str, Any]) -> None:
    """The arguments as the command's one argument parameter (typer's value: a list, or None
    when there are none and its default is None)."""
    argument = spec.argument
    if (spec.arguments == "one" and len(arguments) > 1) or (
        argument is not None and argument.minimum and not arguments
    ):
        raise _NotForUs  # typer says what is extra or missing
    try:
        read = [argument.convert(text) if argument else text for text in arguments]
    except ValueError:
        raise _NotForUs from None
    if spec.arguments == "one":
        if read:
            values[str(spec.argument_dest)] = read[0]
    elif read or spec.defaults is None:
        values[str(spec.argument_dest)] = read or None


def _from_environment(option: Option, value: str) -> Any:
    """An option's value from its environment variable, as click reads it."""
    if option.kind != "flag":
        return option.convert(value)
    if value not in FLAG_WORDS:
        raise _NotForUs
    return FLAG_WORDS[value]


def _take_option(
    args: list[str], position: int, options: tuple[Option, ...], values: dict[str, Any]
) -> int:
    """Read the option at ``position`` into ``values``; the position after it."""
    token = args[position]
    text: str | None = None
    if token.startswith("--"):
        name, equals, attached = token.partition("=")
        if equals:
            text = attached
    elif len(token) > 2:
        name, text = token[:2], token[2:]  # -n2
    else:
        name = token
    option = next((o for o in options if name in o.names), None)
    if option is None:
        raise _NotForUs
    if option.kind == "flag":
        if text is not None:
            raise _NotForUs  # --wait=1, or -q combined with other letters
        values[option.dest] = option.flag_value
        return position + 1
    if text is None:
        if position + 1 == len(args) or args[position + 1].startswith("-"):
            raise _NotForUs  # missing value, or one that typer might read differently
        text = args[position + 1]
        position += 1
    try:
        value = option.convert(text)
    except ValueError:
        raise _NotForUs from None
    if option.multiple:
        values[option.dest] = [*values.get(option.dest, ()), value]
    else:
        values[option.dest] = value
    return position + 1


_TABLE: dict[str, CommandSpec] | None = None


def table_commands() -> dict[str, CommandSpec]:
    """The commands of ``fast_commands.json`` (read once; none when it cannot be read: a
    broken install, where typer still answers)."""
    global _TABLE
    if _TABLE is None:
        import json

        try:
            with open(TABLE_FILE, encoding="utf-8") as file:  # noqa: PTH123 (no pathlib)
                entries = json.load(file)
        except (OSError, ValueError):
            entries = {}
        _TABLE = {name: _spec(entry) for name, entry in entries.items()}
    return _TABLE


def _spec(entry: dict[str, Any]) -> CommandSpec:
    """A command of the table (:func:`gpualloc.cli.fast_table.command_entry` wrote ``entry``)."""
    options: list[Option] = []
    defaults: dict[str, Any] = {}
    arguments: Literal["none", "list", "one"] = "none"
    argument: Option | None = None
    argument_dest = None
    for row in entry["params"]:
        checks = tuple(row.get("checks", ()))
        default = row["default"]
        if row["kind"] == "path" and default is not None:
            default = _path(default, ())
        defaults[row["name"]] = default
        if row["argument"]:
            arguments = "list" if row["nargs"] == -1 else "one"
            argument_dest = row["name"]
            argument = Option(
                (), row["name"], row["kind"], minimum=1 if row["required"] else None, checks=checks
            )
            continue
        if row["kind"] == "flag":
            options.append(_flag(*row["opts"], dest=row["name"]))
            if row["secondary"]:
                options.append(_flag(*row["secondary"], dest=row["name"], value=False))
            continue
        bounds = (row["minimum"], row["maximum"])
        options.append(
            Option(
                tuple(row["opts"]),
                row["name"],
                row["kind"],
                True,
                *bounds,
                None,
                row["multiple"],
                checks,
            )
        )
    return CommandSpec(
        tuple(options), arguments, argument_dest, entry["function"], argument, defaults
    )
