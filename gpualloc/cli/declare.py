"""The command line, declared once: each command, its options and its argument as records.

Every command module declares its commands as :class:`Command` records (a group of them as a
:class:`Group`) beside the functions that do the work; the job's options come from their one
table, :mod:`gpualloc.job_options`, through :func:`job_options`; the global options and the
list of commands are :mod:`gpualloc.cli.commands`. From these records alone
:mod:`gpualloc.cli.parser` builds the one argparse parser (for the command being run only),
:mod:`gpualloc.cli.help` the ``--help`` pages, :mod:`gpualloc.cli.manpage` the manual and
:mod:`gpualloc.cli.completion_scripts` the shell completions: no second description to keep in
step (pip's ``cli/cmdoptions.py``, nvitop's one argparse parser).

Plain classes: every command line imports this module, and nothing heavier.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from gpualloc.job_options import JobOption, Table, options_of

Kind = Literal["flag", "int", "float", "str", "path"]
"""A flag takes no value; the others read their text as a whole number, a number, the text
itself, or a :class:`pathlib.Path` (which the command checks, saying why a file cannot be
used: :mod:`gpualloc.user_files`)."""


class Opt:
    """One option: how it is spelled, the parameter it sets, and how its value reads.

    A plain class, as the others here: NamedTuple's fields, evaluated as every command line
    starts, cost more than the rest of this module (its annotations, compiled one by one)."""

    __slots__ = (
        "completion",
        "default",
        "dest",
        "envvar",
        "help",
        "kind",
        "maximum",
        "metavar",
        "minimum",
        "names",
        "negative",
        "repeat",
        "show_default",
    )

    def __init__(
        self,
        names: tuple[str, ...],
        dest: str,
        help: str,
        kind: Kind = "flag",
        default: Any = False,
        metavar: str | None = None,
        minimum: float | None = None,
        maximum: float | None = None,
        *,
        negative: tuple[str, ...] = (),
        repeat: bool = False,
        completion: str | None = None,
        envvar: str | None = None,
        show_default: bool = True,
    ) -> None:
        self.names = names
        self.dest = dest
        self.help = help
        self.kind = kind
        self.default = default
        self.metavar = metavar
        self.minimum = minimum
        self.maximum = maximum
        self.negative = negative
        """A flag's spellings that set it to False (``--insensitive``)."""
        self.repeat = repeat
        """Given again, it adds a value: the parameter is a list (None when never given)."""
        self.completion = completion
        """The function of :mod:`gpualloc.cli.complete` that offers its values on Tab."""
        self.envvar = envvar
        """The variable read when the option is not given (and the variable is not empty)."""
        self.show_default = show_default

    @property
    def takes_value(self) -> bool:
        return self.kind != "flag"

    @property
    def label(self) -> str:
        """How an error names it: ``'-n' / '--num-gpus'``."""
        return " / ".join(f"'{name}'" for name in self.names)


def flag(
    *names: str, dest: str | None = None, help: str, default: bool | None = False,
    negative: tuple[str, ...] = (),
) -> Opt:  # fmt: skip
    """A flag: ``--json`` sets ``as_json``-like parameters to True."""
    return Opt(names, dest or _dest(names), help, "flag", default, negative=negative)


def value(
    *names: str,
    dest: str | None = None,
    help: str,
    kind: Kind = "str",
    metavar: str,
    default: Any = None,
    minimum: float | None = None,
    maximum: float | None = None,
    repeat: bool = False,
    completion: str | None = None,
    envvar: str | None = None,
    show_default: bool = True,
) -> Opt:
    """An option that takes a value, named by ``metavar`` in help and usage."""
    return Opt(
        names,
        dest or _dest(names),
        help,
        kind,
        default,
        metavar,
        minimum,
        maximum,
        repeat=repeat,
        completion=completion,
        envvar=envvar,
        show_default=show_default,
    )


def _dest(names: tuple[str, ...]) -> str:
    long = next(name for name in names if name.startswith("--"))
    return long[2:].replace("-", "_")


def json_flag(help: str = "Print JSON instead.") -> Opt:
    """``--json``, as most commands that report take it."""
    return flag("--json", dest="as_json", help=help)


class Arg:
    """A command's argument (each command has at most one)."""

    __slots__ = ("completion", "dest", "kind", "many", "metavar", "required")

    def __init__(
        self,
        dest: str,
        metavar: str,
        kind: Kind = "str",
        *,
        many: bool = False,
        required: bool = False,
        completion: str | None = None,
    ) -> None:
        self.dest = dest
        self.metavar = metavar
        self.kind = kind
        self.many = many
        """Any number of words: a list, None when none is given."""
        self.required = required
        self.completion = completion


class Command:
    """A command: the function that does its work (called with every parameter by name), its
    options and argument; its help is the function's docstring."""

    __slots__ = ("argument", "job_argv", "name", "options", "run", "summary")

    def __init__(
        self,
        name: str,
        run: Callable[..., Any],
        options: tuple[Opt, ...] = (),
        argument: Arg | None = None,
        *,
        summary: str = "",
        job_argv: bool = False,
    ) -> None:
        self.name = name
        self.run = run
        self.options = options
        self.argument = argument
        self.summary = summary
        """Its line in its group's help (a top-level command's is in :mod:`.commands`)."""
        self.job_argv = job_argv
        """``run``: its argument is the job's argv, which the first word that is not an option
        (or ``--``) starts; every word from there on is the job's."""

    @property
    def help(self) -> str:
        return self.run.__doc__ or ""


class Group:
    """Commands under one word (``topo show``); given nothing, it shows its help."""

    __slots__ = ("commands", "help", "name")

    def __init__(self, name: str, help: str, commands: tuple[Command, ...]) -> None:
        self.name = name
        self.help = help
        self.commands = commands

    def command(self, name: str) -> Command | None:
        return next((command for command in self.commands if command.name == name), None)


def job_options(command: str, table: Table | None = None) -> tuple[Opt, ...]:
    """The options of a job that ``command`` (``run``, ``alloc``, ``plan``) takes, from their
    one table (:mod:`gpualloc.job_options`), in its order."""
    return tuple(_from_row(row, command) for row in options_of(command, table))


def job_option(dest: str, command: str) -> Opt:
    """The job option ``dest`` for a command the table does not name (``serve`` heeds or
    ignores foreign processes as ``run`` does)."""
    from gpualloc.job_options import JOB_OPTIONS

    return _from_row(next(row for row in JOB_OPTIONS if row.dest == dest), command)


def _from_row(row: JobOption, command: str) -> Opt:
    if row.kind == "flag":
        default = row.default if isinstance(row.default, bool) else None
        return flag(
            *row.spellings,
            dest=row.dest,
            help=row.help_for(command),
            default=default,
            negative=row.negative,
        )
    return value(
        *row.spellings,
        dest=row.dest,
        help=row.help_for(command),
        kind=row.kind,
        metavar=row.metavar or row.dest.upper(),
        default=row.default,
        minimum=row.minimum,
        maximum=row.maximum,
        completion=row.completion,
    )


def usage(path: str, node: Command | Group | None) -> str:
    """The one-line usage of ``gpualloc PATH`` (``node`` None: gpualloc itself)."""
    words = ["gpualloc", *path.split(), "[OPTIONS]"]
    if not isinstance(node, Command):
        words.append("COMMAND [ARGS]...")
    elif node.argument is not None:
        words.append(node.argument.metavar)
    return " ".join(words)
