"""The command-line fast path: ``run``, ``alloc`` and ``release`` without typer.

Importing typer (and, through typer, pydantic) costs more than everything ``gpualloc run`` does
itself (issue 18, point 9). The command lines that scripts and job launchers repeat all day are
simple: global options, one of these three commands, its options, and for ``run`` the job's
argv. :func:`parse` reads exactly those, with click's rules for them (``--opt value``,
``--opt=value``, ``-nVALUE``, the last of a repeated option wins, ``--`` ends the options, and
for ``run`` so does the first argument that is not an option), and hands the values to the same
functions the typer commands call (:mod:`gpualloc.cli.jobs`). Anything else returns None and
goes to typer: ``--help``, completion requests, an unknown or malformed option, a value out of
range. So typer still writes every usage error, and the fast path never accepts a line that
typer would refuse or read differently. Tests check this table against typer's declarations,
option by option, and run a corpus of command lines through both.

NamedTuples and a plain class, not msgspec Structs or dataclasses: every command line passes
through :func:`parse`, and those imports cost 10 to 20 ms that ``--help`` does not need.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NamedTuple

from gpualloc.job_options import Table, options_of

Kind = Literal["flag", "int", "float", "str", "path"]

COMPLETION_VARIABLE = "_GPUALLOC_COMPLETE"
"""Set by the shell when it asks for completions: typer answers those."""
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

    def convert(self, text: str) -> Any:
        """The value for ``text``; ValueError where typer would refuse it."""
        if self.kind == "path":
            from pathlib import Path

            return Path(text)
        if self.kind == "str":
            return text
        value: int | float = int(text) if self.kind == "int" else float(text)
        if self.minimum is not None and value < self.minimum:
            raise ValueError(text)
        if self.maximum is not None and value > self.maximum:
            raise ValueError(text)
        return value


def _flag(*names: str, dest: str, value: bool = True) -> Option:
    return Option(names, dest, "flag", flag_value=value)


GLOBAL_OPTIONS = (
    Option(("--topology", "-t"), "topology", envvar="GPUALLOC_TOPOLOGY"),
    Option(("--bandwidth-table",), "bandwidth_table", "path"),
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
    _flag("--evict-shared", dest="evict_shared"),
    Option(("--grace",), "grace"),
    _flag("--json", dest="as_json"),
)


class CommandSpec(NamedTuple):
    """A command the fast path takes: its options and what its arguments are."""

    options: tuple[Option, ...]
    arguments: Literal["none", "command", "list"]
    """none: no arguments; command: the job's argv, which ends the options (``run``); list:
    arguments anywhere among the options (``release``'s lease ids)."""
    argument_dest: str | None = None
    function: str = ""
    """The name of the function in :mod:`gpualloc.cli.jobs`."""


COMMANDS: dict[str, CommandSpec] = {
    "run": CommandSpec(RUN_OPTIONS, "command", "command", "run_job"),
    "alloc": CommandSpec(ALLOC_OPTIONS, "none", None, "alloc_gpus"),
    "release": CommandSpec(RELEASE_OPTIONS, "list", "leases", "release_gpus"),
}


class FastCommand:
    """A command line the fast path understood: the global options given or set in the
    environment (the rest take their defaults), and the command's values."""

    def __init__(self, name: str, global_values: dict[str, Any], values: dict[str, Any]) -> None:
        self.name = name
        self.global_values = global_values
        self.values = values

    def invoke(self) -> None:
        """Apply the global options as typer's callback does, then do the command's work."""
        from gpualloc.cli import brokered
        from gpualloc.cli.state import STATE

        STATE.apply_global_options(**self.global_values)
        work = COMMANDS[self.name].function
        if brokered.call(work, self.values):
            return
        from gpualloc.cli import jobs

        jobs.call(work, self.values, broker_tried=True)


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
    if position == len(args) or args[position] not in COMMANDS:
        raise _NotForUs
    global_values = {  # options neither given nor in the environment take the defaults
        option.dest: _from_environment(option, environ[option.envvar])
        for option in GLOBAL_OPTIONS
        if option.envvar and environ.get(option.envvar) and option.dest not in given
    }
    global_values.update(given)
    name = args[position]
    spec = COMMANDS[name]
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
    elif spec.arguments == "list":
        values[str(spec.argument_dest)] = arguments or None
    elif arguments:
        raise _NotForUs
    return FastCommand(name, global_values, values)


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
        values[option.dest] = option.convert(text)
    except ValueError:
        raise _NotForUs from None
    return position + 1
