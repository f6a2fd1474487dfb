"""Finding a registered rule by name, for every registry of rules (share placement, MIG creation),
with one refusal that names them all."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, TypeVar

from gpualloc.errors import RequestError


class Described(Protocol):
    name: str
    description: str


R = TypeVar("R", bound=Described)


def lookup(rules: Mapping[str, R], name: str, what: str) -> R:
    """The rule called ``name``; a :class:`RequestError` naming every rule, each with its
    description, when there is none (``what`` names where the name came from)."""
    rule = rules.get(name)
    if rule is None:
        from gpualloc.user_files import shown_value

        raise RequestError(
            f"unknown {what} {shown_value(name)}",
            hint=" or ".join(rules),
            details=tuple(f"{r.name}: {r.description}" for r in rules.values()),
        )
    return rule
