"""``--help``: each page rendered from the declarations (:mod:`gpualloc.cli.declare`).

The layout is the one click gave gpualloc's pages, which users and scripts know: a usage
line, the help text's paragraphs, then ``Options:`` (each option's spellings, what it takes, its
help, and in brackets its variable, default and range) and, for gpualloc itself and its groups,
``Commands:`` with each command's one-line summary; gpualloc's own page ends with the
environment variables and the exit codes. Text wraps at the terminal's width up to 80 columns,
so a page reads the same in any terminal that wide and in a pipe.
"""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Iterable

from gpualloc.cli.commands import COMMANDS, ENVIRONMENT_VARIABLES, GLOBAL_OPTIONS, HELP
from gpualloc.cli.declare import Command, Group, Opt, usage
from gpualloc.errors import ExitCode

MAX_WIDTH = 80
NAMES_WIDTH = 30
"""The widest first column; longer spellings put their help on the next line (click's)."""
HELP_OPTION = Opt(("-h", "--help"), "help", "Show this message and exit.")


def page(path: str, node: Command | Group | None) -> str:
    """The help page of ``gpualloc PATH`` (``node`` None: gpualloc itself)."""
    width = max(min(shutil.get_terminal_size((MAX_WIDTH, 24)).columns, MAX_WIDTH) - 2, 50)
    options: tuple[Opt, ...]
    if node is None:
        text, options = HELP, (*GLOBAL_OPTIONS, HELP_OPTION)
        commands = [(entry.name, entry.summary) for entry in COMMANDS]
    elif isinstance(node, Group):
        text, options = node.help, (HELP_OPTION,)
        commands = [(command.name, command.summary) for command in node.commands]
    else:
        text, options, commands = clean(node.help), (*node.options, HELP_OPTION), []
    parts = [f"Usage: {usage(path, node)}\n", paragraphs(text, width, "  ")]
    parts.append("Options:\n" + columns([(spelled(o), described(o)) for o in options], width))
    if commands:
        parts.append("Commands:\n" + columns(commands, width))
    if node is None:
        parts.append(epilog())
    return "\n".join(parts)


def clean(docstring: str) -> str:
    """A docstring's text without the indentation of its source (as ``inspect.cleandoc``)."""
    first, _, rest = docstring.strip("\n").partition("\n")
    return "\n".join([first.strip(), textwrap.dedent(rest)]).strip()


def paragraphs(text: str, width: int, indent: str) -> str:
    """``text``'s paragraphs (separated by blank lines) each wrapped at ``width``."""
    blocks = [" ".join(block.split()) for block in text.split("\n\n") if block.strip()]
    wrapped = [
        textwrap.fill(b, width, initial_indent=indent, subsequent_indent=indent) for b in blocks
    ]
    return "\n\n".join(wrapped) + "\n"


def spelled(opt: Opt) -> str:
    """An option's spellings as the first column shows them: ``-n, --num-gpus N``."""
    names = sorted(opt.names, key=lambda name: name.startswith("--"))
    shown = ", ".join(names)
    if opt.negative:
        shown += " / " + ", ".join(opt.negative)
    return f"{shown} {opt.metavar}" if opt.takes_value and opt.metavar else shown


def described(opt: Opt) -> str:
    """An option's help with its variable, default and range, as click showed them."""
    extra = []
    if opt.envvar:
        extra.append(f"env var: {opt.envvar}")
    default = opt.default
    if opt.show_default and default is not None and default is not False and not opt.repeat:
        shown = opt.names[0].lstrip("-") if default is True and opt.negative else default
        extra.append(f"default: {shown}")
    if opt.minimum is not None and opt.maximum is not None:
        extra.append(f"{opt.minimum:g}<=x<={opt.maximum:g}")
    elif opt.minimum is not None:
        extra.append(f"x>={opt.minimum:g}")
    elif opt.maximum is not None:
        extra.append(f"x<={opt.maximum:g}")
    return opt.help + (f"  [{'; '.join(extra)}]" if extra else "")


def columns(rows: Iterable[tuple[str, str]], width: int) -> str:
    """Two columns, the second wrapped beside the first (click's definition lists)."""
    rows = list(rows)
    first = min(max(len(term) for term, _ in rows), NAMES_WIDTH)
    at = 2 + first + 2
    lines = []
    for term, text in rows:
        wrapped = textwrap.wrap(text, max(width - at, 10)) or [""]
        if len(term) <= first:
            lines.append(f"  {term.ljust(first)}  {wrapped[0]}".rstrip())
            wrapped = wrapped[1:]
        else:
            lines.append(f"  {term}")
        lines += [" " * at + line for line in wrapped]
    return "\n".join(lines) + "\n"


def epilog() -> str:
    """gpualloc's own page ends with every variable it reads and every exit code."""
    variables = [f"    {name}: {meaning}" for name, meaning in ENVIRONMENT_VARIABLES]
    codes = list(ExitCode)
    rows = [codes[i : i + 5] for i in range(0, len(codes), 5)]
    exits = [
        "    " + ", ".join(f"{int(code)} {code.name.lower().replace('_', '-')}" for code in row)
        for row in rows
    ]
    return "\n".join(
        ["  Environment variables:", "", *variables, "", "  Exit codes:", "", *exits, ""]
    )
