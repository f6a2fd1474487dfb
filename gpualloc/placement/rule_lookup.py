"""Finding a registered rule by name, for every registry of rules (share placement, MIG creation),
with one refusal that names them all."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, TypeVar


class Described(Protocol):
    """A rule as the refusal names it (read-only: the rules say theirs as class constants)."""

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...


R = TypeVar("R", bound=Described)


def lookup(rules: Mapping[str, R], name: str, what: str) -> R:
    """The rule called ``name``; a :class:`RequestError` naming every rule, each with its
    description, when there is none (``what`` names where the name came from)."""
    rule = rules.get(name)
    if rule is None:
        from gpualloc.model.option_values import unknown_choice

        described = tuple(f"{r.name}: {r.description}" for r in rules.values())
        raise unknown_choice(what, name, rules, details=described)
    return rule
