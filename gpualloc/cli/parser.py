"""The one parser of gpualloc's command line: the standard library's argparse, built from the
declarations (:mod:`gpualloc.cli.declare`), for the command being run only.

It is built in steps, each as far as the command line goes: gpualloc's own parser knows the
global options and the command words (:mod:`gpualloc.cli.commands`, no command module
imported); once the word is found, its module is imported and the parser of that command (or of
its group, then of the group's command) is built from its declaration. The grammar is
argparse's: ``--opt value``, ``--opt=value``, ``-nVALUE``, short flags together (``-qn 2``),
the last of a repeated option wins unless it repeats, ``--`` ends the options; for ``run`` so
does the first word that is not an option, which starts the job's argv.

Every refusal is one :class:`~gpualloc.errors.RequestError` (exit 2): argparse's own messages,
and its usage block and exit, are reshaped into gpualloc's ``error:`` line and one hint
(:class:`Parser` overrides ``error``): the usage, or what was meant, "did you mean" for a
mistyped command or option, where a global option given after the command goes.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

from gpualloc.cli.commands import ALONE, COMMANDS, GLOBAL_OPTIONS, entry, load
from gpualloc.cli.declare import Arg, Command, Group, Opt, usage
from gpualloc.errors import RequestError

HELP_NAMES = ("-h", "--help")
WORDS = "words"
"""The parameter that collects the words after the options (a command's argument, or the
command below gpualloc or a group)."""


class ShowHelp(Exception):
    """``-h``/``--help`` was given at ``path`` (``node`` None: gpualloc itself); or a group was
    given no command (``usage_error``: its page goes to stderr, exit 2, as click's did)."""

    def __init__(self, path: str, node: Command | Group | None, *, usage_error: bool = False):
        super().__init__(path)
        self.path = path
        self.node = node
        self.usage_error = usage_error


class Invocation:
    """A command line read: the command's path (``topo show``), its declaration and the value
    of each of its parameters."""

    __slots__ = ("command", "path", "values")

    def __init__(self, path: str, command: Command, values: dict[str, Any]) -> None:
        self.path = path
        self.command = command
        self.values = values


class _ArgparseSaid(Exception):
    """argparse's ``error()``, held for :func:`_reshaped` instead of its usage block and exit."""


class Parser(argparse.ArgumentParser):
    """argparse's parser, speaking gpualloc's words: no help of its own (``--help`` shows the
    declarations' page, :mod:`gpualloc.cli.help`), no abbreviated options (a new option would
    change what an old abbreviation means), and errors raised to be reshaped, never printed."""

    def __init__(self, path: str) -> None:
        super().__init__(
            prog=" ".join(["gpualloc", *path.split()]),
            add_help=False,
            allow_abbrev=False,
            exit_on_error=False,
        )

    def error(self, message: str) -> NoReturn:
        raise _ArgparseSaid(message)

    def _get_formatter(self) -> argparse.HelpFormatter:
        # add_argument() makes a formatter to check each option's metavar; argparse's own asks
        # the terminal its width (importing shutil) every time, for a page never printed here.
        return argparse.HelpFormatter(prog=self.prog, width=80)


class _Help(argparse.Action):
    def __init__(self, option_strings: list[str], dest: str, **settings: Any) -> None:
        self.path = settings.pop("path")
        self.node = settings.pop("node")
        super().__init__(option_strings, argparse.SUPPRESS, nargs=0, default=argparse.SUPPRESS)

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        raise ShowHelp(self.path, self.node)


class _Value(argparse.Action):
    """Store an option's value, or add it to the list of one that repeats; a value of ``--``
    (``--name=--``) is read as the text it is: argparse before Python 3.13 dropped it and
    stored an empty list (tests/test_cli.py)."""

    def __init__(self, option_strings: list[str], dest: str, **settings: Any) -> None:
        self.repeat = settings.pop("repeat")
        super().__init__(option_strings, dest, **settings)

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        if values == []:
            try:
                assert callable(self.type)  # every value option is declared with its reader
                values = self.type("--")
            except argparse.ArgumentTypeError as exc:
                raise argparse.ArgumentError(self, str(exc)) from None
        if self.repeat:
            values = [*(getattr(namespace, self.dest) or []), values]
        setattr(namespace, self.dest, values)


class Reader:
    """An option's or argument's text as its kind reads it (argparse's ``type=``), or the
    one-line refusal that names the option and what the value must be."""

    def __init__(self, kind: str, label: str, minimum: float | None, maximum: float | None):
        self.kind, self.label, self.minimum, self.maximum = kind, label, minimum, maximum

    @classmethod
    def of(cls, opt: Opt) -> Reader:
        return cls(opt.kind, opt.label, opt.minimum, opt.maximum)

    def __call__(self, text: str) -> Any:
        if self.kind == "str":
            return text
        if self.kind == "path":
            from pathlib import Path

            return Path(text)
        number: float = self._number(text.strip())
        bounded = self.minimum is not None or self.maximum is not None
        if bounded and number != number:  # nan is no number to compare with a bound; unbounded,
            self._refuse("must be a number")  # the command says what it must be (--load)
        if self.minimum is not None and not number >= self.minimum:
            self._refuse(f"must be at least {self.minimum:g}")
        if self.maximum is not None and not number <= self.maximum:
            self._refuse(f"must be at most {self.maximum:g}")
        return number

    def _number(self, text: str) -> float:
        # ASCII digits only: int() and float() read other scripts' digits ("٣") too.
        if self.kind == "int":
            digits = text[1:] if text[:1] in "+-" else text
            if not (digits.isascii() and digits.isdigit()):
                self._refuse("must be a whole number")
            try:
                return int(text)
            except ValueError:  # more digits than int() reads (sys.get_int_max_str_digits)
                self._refuse(
                    f"must be a whole number of at most {sys.get_int_max_str_digits()} digits"
                )
        try:
            number = float(text) if text.isascii() else None
        except ValueError:
            number = None
        if number is None:
            self._refuse("must be a number")
        if number in (math.inf, -math.inf) and "inf" not in text.lower():
            # 1e309 overflows to inf: a value the user never wrote (tests/test_fuzz_options.py)
            self._refuse(f"must be a number a double holds (at most {sys.float_info.max:.1e})")
        return number

    def _refuse(self, why: str) -> NoReturn:
        raise argparse.ArgumentTypeError(f"invalid value for {self.label}: {why}")


def _add_help(parser: Parser, path: str, node: Command | Group | None) -> None:
    parser.add_argument(*HELP_NAMES, action=_Help, path=path, node=node)


def _add(parser: Parser, opt: Opt) -> None:
    if opt.kind == "flag":
        parser.add_argument(
            *opt.names, dest=opt.dest, action="store_const", const=True, default=opt.default
        )
        if opt.negative:
            parser.add_argument(
                *opt.negative,
                dest=opt.dest,
                action="store_const",
                const=False,
                default=opt.default,
            )
        return
    parser.add_argument(
        *opt.names,
        dest=opt.dest,
        type=Reader.of(opt),
        default=opt.default,
        action=_Value,
        repeat=opt.repeat,
        metavar=opt.metavar,
    )


# ---- the steps ---------------------------------------------------------------------------------


def parse_globals(args: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """The global options (given, else from their variables) and the words from the command on;
    ``gpualloc`` alone shows its help (:class:`ShowHelp`, on stderr)."""
    if not args:
        raise ShowHelp("", None, usage_error=True)
    parser = Parser("")
    _add_help(parser, "", None)
    for opt in GLOBAL_OPTIONS:
        _add(parser, opt)
    parser.add_argument(WORDS, nargs=argparse.REMAINDER)
    namespace, unknown = _parse(parser, args, "", None, intermixed=False)
    words = _after_dashes(getattr(namespace, WORDS))
    if unknown:
        raise _unknown_option(unknown[0], "", None, GLOBAL_OPTIONS, meant_for=words)
    values = {opt.dest: getattr(namespace, opt.dest) for opt in GLOBAL_OPTIONS}
    return _from_variables(GLOBAL_OPTIONS, values), words


def parse_command(words: list[str]) -> Invocation:
    """The command the words name, and its parameters' values."""
    if not words:
        raise RequestError("missing command", hint=_usage_hint("", None))
    found = entry(words[0])
    if found is None:
        raise _no_such_command(words[0], "", [each.name for each in COMMANDS])
    declared = load(found)
    if isinstance(declared, Command):
        return Invocation(found.name, declared, _parse_command(found.name, declared, words[1:]))
    return _parse_group(declared, words[1:])


def _parse_group(group: Group, args: list[str]) -> Invocation:
    if not args:
        raise ShowHelp(group.name, group, usage_error=True)
    parser = Parser(group.name)
    _add_help(parser, group.name, group)
    parser.add_argument(WORDS, nargs=argparse.REMAINDER)
    namespace, unknown = _parse(parser, args, group.name, group, intermixed=False)
    words = _after_dashes(getattr(namespace, WORDS))
    if unknown:
        raise _unknown_option(unknown[0], group.name, group, (), meant_for=words)
    if not words:
        raise RequestError("missing command", hint=_usage_hint(group.name, group))
    command = group.command(words[0])
    if command is None:
        raise _no_such_command(words[0], group.name, [c.name for c in group.commands])
    path = f"{group.name} {command.name}"
    return Invocation(path, command, _parse_command(path, command, words[1:]))


def _parse_command(path: str, command: Command, args: list[str]) -> dict[str, Any]:
    parser = Parser(path)
    _add_help(parser, path, command)
    for opt in command.options:
        _add(parser, opt)
    if command.job_argv:  # the first word that is not an option starts the job's argv
        parser.add_argument(WORDS, nargs=argparse.REMAINDER)
        namespace, unknown = _parse(parser, args, path, command, intermixed=False)
        words = _after_dashes(getattr(namespace, WORDS))
    else:
        # Options and words in any order (release ID --json ID), and after "--" only words:
        # split there first, as argparse's intermixed parsing reads "--" itself otherwise.
        end = args.index("--") if "--" in args else len(args)
        parser.add_argument(WORDS, nargs="*")
        namespace, unknown = _parse(parser, args[:end], path, command, intermixed=True)
        words = [*getattr(namespace, WORDS), *args[end + 1 :]]
    if unknown:
        raise _unknown_option(unknown[0], path, command, command.options)
    values = {opt.dest: getattr(namespace, opt.dest) for opt in command.options}
    if command.argument is not None:
        values[command.argument.dest] = _argument(path, command, command.argument, words)
    elif words:
        raise _unexpected(words, path, command)
    return _from_variables(command.options, values)


def _argument(path: str, command: Command, argument: Arg, words: list[str]) -> Any:
    if argument.required and not words:
        raise RequestError(
            f"missing argument '{argument.metavar}'", hint=_usage_hint(path, command)
        )
    if command.job_argv:
        return words
    if not argument.many and len(words) > 1:
        raise _unexpected(words[1:], path, command)
    label = f"'{argument.metavar}'"
    read = [_read(Reader(argument.kind, label, None, None), word, path, command) for word in words]
    if argument.many:
        return read or None
    return read[0] if read else None


def _read(reader: Reader, text: str, path: str, node: Command | Group | None) -> Any:
    try:
        return reader(text)
    except argparse.ArgumentTypeError as exc:
        raise RequestError(str(exc), hint=_usage_hint(path, node)) from None


def _from_variables(options: Iterable[Opt], values: dict[str, Any]) -> dict[str, Any]:
    """An option not given takes its variable's value where that is set and not empty (as
    click read it: an empty variable is none at all)."""
    for opt in options:
        if opt.envvar and values[opt.dest] is None and os.environ.get(opt.envvar):
            label = f"{opt.label} (from {opt.envvar})"
            reader = Reader(opt.kind, label, opt.minimum, opt.maximum)
            values[opt.dest] = _read(reader, os.environ[opt.envvar], "", None)
    return values


def _after_dashes(words: list[str]) -> list[str]:
    """The words after the options, without the ``--`` that ended them (argparse keeps it)."""
    return words[1:] if words[:1] == ["--"] else words


def _parse(
    parser: Parser,
    args: Sequence[str],
    path: str,
    node: Command | Group | None,
    *,
    intermixed: bool,
) -> tuple[argparse.Namespace, list[str]]:
    try:
        if intermixed:
            return parser.parse_known_intermixed_args(list(args))
        return parser.parse_known_args(list(args))
    except argparse.ArgumentError as exc:
        raise _reshaped(exc.argument_name, exc.message, args, path, node) from None
    except _ArgparseSaid as said:
        raise _reshaped(None, str(said), args, path, node) from None


# ---- argparse's words, as gpualloc says them ---------------------------------------------------


def _usage_hint(path: str, node: Command | Group | None) -> str:
    where = " ".join(["gpualloc", *path.split(), "--help"])
    return f"{usage(path, node)} ('{where}' explains)"


def _reshaped(
    name: str | None, message: str, args: Sequence[str], path: str, node: Command | Group | None
) -> RequestError:
    """argparse's refusal of an option (``name``: its spellings joined by "/") as one line."""
    from gpualloc.user_files import shown_text

    if message.startswith("invalid value for "):  # a Reader's: already gpualloc's words
        return RequestError(message, hint=_usage_hint(path, node))
    typed, position = _typed(name, args)
    if message.startswith("expected ") and "argument" in message:
        following = args[position + 1] if position + 1 < len(args) else ""
        hint = _usage_hint(path, node)
        if following.startswith("-") and typed.startswith("--"):
            hint = f"a value that starts with '-' follows '=': {typed}={shown_text(following)}"
        return RequestError(f"option '{typed}' requires an argument", hint=hint)
    if message.startswith("ignored explicit argument"):
        token = args[position] if position < len(args) else typed
        if token.startswith("--"):
            return RequestError(
                f"option '{typed}' does not take a value", hint=_usage_hint(path, node)
            )
        letter = message.rpartition(" ")[2].strip("'")[:1]  # -wq: -w, then no -q
        return RequestError(f"no such option: -{letter}", hint=_usage_hint(path, node))
    said = message[:1].lower() + message[1:]
    return RequestError(shown_text(said), hint=_usage_hint(path, node))


def _typed(name: str | None, args: Sequence[str]) -> tuple[str, int]:
    """Which spelling of the option ``name`` names was typed, and where (argparse names all)."""
    spellings = (name or "").split("/")
    for position, token in enumerate(args):
        for spelling in spellings:
            if spelling and (token == spelling or token.startswith(f"{spelling}=")):
                return spelling, position
            if len(spelling) == 2 and token.startswith(spelling) and not token.startswith("--"):
                return spelling, position
    return spellings[0], len(args)


def _names(options: Iterable[Opt]) -> list[str]:
    return [name for opt in options for name in (*opt.names, *opt.negative)]


def _unknown_option(
    token: str,
    path: str,
    node: Command | Group | None,
    options: Iterable[Opt],
    *,
    meant_for: Sequence[str] = (),
) -> RequestError:
    """No such option at ``path``: said as click said it, with what was meant as the hint (a
    global option after the command; an option of the command given before it; a spelling
    close to one of this command's), else the usage."""
    from gpualloc.user_files import shown_text

    name = token.partition("=")[0] if token.startswith("--") else token[:2]
    message = f"no such option: {shown_text(name)}"
    if path and name in _names(GLOBAL_OPTIONS):
        option = next(opt for opt in GLOBAL_OPTIONS if name in opt.names)
        given = f"{name} ..." if option.takes_value else name
        example = f"gpualloc {given}" if option.dest in ALONE else f"gpualloc {given} {path} ..."
        return RequestError(
            message, hint=f"{name} is a global option: it goes before the command ('{example}')"
        )
    owner = _owner_of(name, meant_for)
    if owner:
        return RequestError(
            message,
            hint=f"{name} is an option of '{owner}': it goes after the command "
            f"('gpualloc {owner} {name} ...')",
        )
    close = meant(name, [*_names(options), *HELP_NAMES])
    hint = f"did you mean {close}?" if close else _usage_hint(path, node)
    return RequestError(message, hint=hint)


def _owner_of(name: str, words: Sequence[str]) -> str | None:
    """The command of ``words`` (``status``, ``topo show``) when it takes the option ``name``;
    the first word may be that option's value (``--output x topo record``)."""
    if words and entry(words[0]) is None:
        words = words[1:]
    found = entry(words[0]) if words else None
    if found is None:
        return None
    loaded = load(found)
    declared = loaded.command(words[1]) if isinstance(loaded, Group) and len(words) > 1 else loaded
    if not isinstance(declared, Command):
        return None
    path = found.name if declared is loaded else f"{found.name} {declared.name}"
    return path if name in _names(declared.options) else None


def meant(typed: str, names: Sequence[str]) -> str | None:
    """The name ``typed`` most likely meant: the one it begins (options are never abbreviated,
    so ``--dry`` is a near miss of ``--dry-run``), else the closest, compared without their
    dashes (which every option shares), when close enough."""
    import difflib

    starting = [name for name in names if name.startswith(typed) and typed.strip("-")]
    if len(starting) == 1:
        return starting[0]
    bare = {name.lstrip("-"): name for name in names}
    close = difflib.get_close_matches(typed.lstrip("-"), list(bare), n=1, cutoff=0.65)
    return bare[close[0]] if close else None


def _no_such_command(word: str, path: str, names: list[str]) -> RequestError:
    from gpualloc.user_files import shown_text

    close = meant(word, names)
    node = load(entry(path)) if path else None  # type: ignore[arg-type]
    hint = f"did you mean {close}?" if close else _usage_hint(path, node)
    return RequestError(f"no such command '{shown_text(word)}'", hint=hint)


def _unexpected(words: list[str], path: str, node: Command | Group) -> RequestError:
    from gpualloc.user_files import shown_text

    quoted = " ".join(f"'{shown_text(word)}'" for word in words[:3])
    more = f" and {len(words) - 3} more" if len(words) > 3 else ""
    noun = "argument" if len(words) == 1 else "arguments"
    return RequestError(f"unexpected {noun} {quoted}{more}", hint=_usage_hint(path, node))
