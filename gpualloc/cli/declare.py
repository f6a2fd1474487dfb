"""Typer's declarations, written down without importing typer (issue 43, point 3).

The command modules declare their parameters as typer would take them, ``Annotated[bool,
Option("--json", help=...)]``, and their groups as ``Group(help=...)`` with ``@group.command(...)``:
the same arguments as ``typer.Option``, ``typer.Argument`` and ``typer.Typer``, recorded here.
:mod:`gpualloc.cli.app` turns them into typer's own when it builds the command tree; the
command-line fast path (:mod:`gpualloc.cli.fastpath`) imports the modules and calls the command
functions without it. Importing typer costs about 50 ms, and typer 0.29 converts every value it
parses through pydantic: together about five times Python's own start-up.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, NamedTuple, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class Declared(NamedTuple):
    """``typer.Option(*args, **settings)`` (``kind`` "option") or ``typer.Argument(...)``."""

    kind: str
    args: tuple[Any, ...]
    settings: dict[str, Any]


def Option(*args: Any, **settings: Any) -> Any:
    """``typer.Option``'s arguments, for :mod:`gpualloc.cli.app`."""
    return Declared("option", args, settings)


def Argument(*args: Any, **settings: Any) -> Any:
    """``typer.Argument``'s arguments, for :mod:`gpualloc.cli.app`."""
    return Declared("argument", args, settings)


class Group:
    """A ``typer.Typer`` group to be: its settings, and its commands in the order declared."""

    def __init__(self, **settings: Any) -> None:
        self.settings = settings
        self.commands: list[tuple[str, Callable[..., Any], dict[str, Any]]] = []

    def command(self, name: str, **settings: Any) -> Callable[[F], F]:
        """Declare the decorated function as the command ``name`` (``typer.Typer.command``)."""

        def decorate(function: F) -> F:
            self.commands.append((name, function, settings))
            return function

        return decorate


JsonOption = Annotated[bool, Option("--json", help="Print JSON instead.")]
"""``--json``, as most commands that report take it."""
