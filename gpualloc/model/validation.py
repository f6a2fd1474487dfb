"""Typed reading of JSON documents into gpualloc's structs, with errors users can read.

Every document gpualloc reads (topologies, the shared ledger, root's journal, bandwidth tables)
is declared as a :class:`msgspec.Struct` and decoded here, strictly: unknown fields, wrong types
(no ``"1"`` for ``1``) and values out of range are refused, naming where. msgspec rather than
pydantic because every command reads the ledger and a topology: importing pydantic and building
its models cost more than all of ``gpualloc run``'s own work (``benchmarks/bench_launch.py``
measures it), msgspec decodes and validates in one pass of C.
"""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

import msgspec

T = TypeVar("T")

NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
PositiveInt = Annotated[int, msgspec.Meta(gt=0)]
Percent = Annotated[int, msgspec.Meta(ge=0, le=100)]
NonNegativeFloat = Annotated[float, msgspec.Meta(ge=0)]
PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]

DecodeError = msgspec.DecodeError
"""Text that is not JSON at all."""
ValidationError = msgspec.ValidationError
"""JSON that is not the document asked for (a subclass of :class:`DecodeError`)."""


def decode_json(text: str | bytes, kind: type[T]) -> T:
    """The ``kind`` that JSON ``text`` holds; :data:`DecodeError` / :data:`ValidationError`."""
    return msgspec.json.decode(text, type=kind)


def from_builtins(data: Any, kind: type[T]) -> T:
    """The ``kind`` that parsed JSON ``data`` holds, with exactly the rules of
    :func:`decode_json` (object keys that are numbers arrive as strings, as in JSON)."""
    return msgspec.json.decode(msgspec.json.encode(data), type=kind)


def to_builtins(value: Any) -> Any:
    """``value`` as JSON-ready dicts, lists, strings and numbers (enums by value, datetimes in
    RFC 3339), fields in declaration order."""
    return msgspec.to_builtins(value)


def describe_validation_error(exc: msgspec.ValidationError) -> str:
    """``where: what`` for msgspec's ``What - at `$.where``` (or ``- at `key` in `$.where```,
    for a bad object key), in the words users read."""
    what, _, where = str(exc).partition(" - at ")
    what = what.replace("`", "")
    if what[1:2].islower():  # "Expected ...", not "GPU 3 ..."
        what = what[:1].lower() + what[1:]
    if not where:
        return what
    _, is_key, where = where.rpartition(" in ")
    where = where.replace("`", "").removeprefix("$").lstrip(".") or "(top level)"
    return f"{where}{' (a key)' if is_key else ''}: {what}"
