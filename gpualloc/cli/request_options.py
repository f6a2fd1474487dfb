"""The typer parameters of the job options, made from their one table
(:mod:`gpualloc.job_options`): ``run``, ``alloc`` and ``plan`` declare only their own options and
take the job's from :func:`with_job_options`, so the three commands cannot drift apart and a new
option is one row of the table. Declared as :mod:`gpualloc.cli.declare` records: typer reads
them only when :mod:`gpualloc.cli.app` builds the command tree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Optional, TypeVar

from gpualloc.cli import complete
from gpualloc.cli.declare import Option
from gpualloc.job_options import JOB_OPTIONS, JobOption, Table, options_of

F = TypeVar("F", bound=Callable[..., Any])
PYTHON_TYPES: dict[str, type] = {"int": int, "float": float, "str": str, "flag": bool}


def typer_annotation(row: JobOption, command: str) -> Any:
    """``Annotated[type, Option(...)]`` for ``row`` as ``command`` takes it."""
    kind = PYTHON_TYPES[row.kind]
    python: Any = Optional[kind] if row.default is None else kind  # noqa: UP045 - typer, 3.10
    if row.kind == "flag" and row.negative:
        names = [f"{row.spellings[0]}/{row.negative[0]}"]
    else:
        names = list(row.spellings)
    settings: dict[str, Any] = {"help": row.help_for(command)}
    if row.metavar:
        settings["metavar"] = row.metavar
    if row.minimum is not None:
        settings["min"] = row.minimum
    if row.maximum is not None:
        settings["max"] = row.maximum
    if row.completion:
        settings["autocompletion"] = getattr(complete, row.completion)
    if row.default is None:
        settings["show_default"] = False
    return Annotated[python, Option(*names, **settings)]


def with_job_options(command: str, table: Table | None = None) -> Callable[[F], F]:
    """Mark the typer command function ``command`` (``run``, ``alloc``, ``plan``) to take the
    job options of ``table`` as parameters (:func:`add_job_options`, when
    :mod:`gpualloc.cli.app` builds the command tree: :mod:`inspect` is not loaded on the fast
    path); the function takes them as ``**job``."""

    def decorate(function: F) -> F:
        function.job_options = (command, table)  # type: ignore[attr-defined]
        return function

    return decorate


def add_job_options(function: Callable[..., Any]) -> None:
    """Give a function :func:`with_job_options` marked its job options as parameters, after its
    own positional ones and before its own options (``__signature__`` and ``__annotations__``,
    which typer reads); once."""
    import inspect

    marked = function.__dict__.pop("job_options", None)
    if marked is None:
        return
    command, table = marked
    own = inspect.signature(function).parameters.values()  # text: app.py evaluates it
    plain = inspect.Parameter.POSITIONAL_OR_KEYWORD
    leading = [p for p in own if p.default is inspect.Parameter.empty and p.kind == plain]
    trailing = [p for p in own if p not in leading and p.kind is not p.VAR_KEYWORD]
    rows = [
        inspect.Parameter(
            row.dest, plain, default=row.default, annotation=typer_annotation(row, command)
        )
        for row in options_of(command, table)
    ]
    parameters = [*leading, *rows, *(p.replace(kind=plain) for p in trailing)]
    function.__signature__ = inspect.Signature(parameters, return_annotation=None)  # type: ignore[attr-defined]
    function.__annotations__ = {p.name: p.annotation for p in parameters}


def given(values: dict[str, Any]) -> dict[str, Any]:
    """A decorated command's ``locals()`` as one mapping: its own parameters and the job's."""
    merged = {key: value for key, value in values.items() if key != "job"}
    merged.update(values.get("job", {}))
    return merged


IgnoreForeignOption = typer_annotation(
    next(row for row in JOB_OPTIONS if row.dest == "ignore_foreign"), "serve"
)
"""``--ignore-foreign/--heed-foreign``, for ``serve`` too."""
