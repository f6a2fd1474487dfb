"""The MIG creation rules: how the places where a new GPU instance could be created are ranked.
One declared object per rule behind one registry, as the whole-GPU policies
(:mod:`gpualloc.placement.policies.registry`) and the share placement rules
(:mod:`gpualloc.placement.sharing.rules`) are:

- ``fgd`` (the default): where the GPU's expected fragmentation grows least (FGD, Weng et al.,
  "Beware of Fragmentation", USENIX ATC'23, section 4.3, on NVIDIA's slice rules: see
  :mod:`.slots`), then on the GPU with the most slices taken, then the
  lowest start and GPU;
- ``best-fit``: the GPU with the most slices taken, then the lowest start;
- ``first-fit``: the lowest GPU, then the lowest start (what creating without a placement
  gets).

Each sorts the n free places in O(n log n); ``fgd`` also needs each place's growth, which
:func:`.slots.rank_slots` computes only for a rule that :attr:`weighs`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import ClassVar

from msgspec import Struct

from gpualloc.placement.rule_lookup import lookup

__all__ = ["MigRule", "Slot", "get_mig_rule", "mig_rule_names", "mig_rules"]


class Slot(Struct, frozen=True):
    """A place a GPU instance of ``profile`` could be created now."""

    gpu: int
    profile: str
    start: int
    size: int
    growth: float
    """How much the GPU's expected fragmentation grows (in slices; 0 for a rule that does not
    weigh it)."""
    taken_before: int
    """Slices of the GPU already occupied."""

    @property
    def slices(self) -> str:
        return f"{self.start}" if self.size == 1 else f"{self.start}-{self.start + self.size - 1}"


class MigRule(ABC):
    """One MIG creation rule: a name, a one-line description, and :meth:`key`."""

    name: ClassVar[str]
    description: ClassVar[str]
    weighs: ClassVar[bool] = False
    """Whether the rule ranks by expected fragmentation (so each slot's growth is computed)."""

    @abstractmethod
    def key(self, slot: Slot) -> tuple:
        """The slot's rank (lower is better)."""

    def rank(self, slots: Iterable[Slot]) -> list[Slot]:
        """``slots``, best first."""
        return sorted(slots, key=self.key)


class FgdMig(MigRule):
    name = "fgd"
    description = "where the GPU's expected fragmentation grows least (FGD, ATC'23)"
    weighs = True

    def key(self, slot: Slot) -> tuple:
        return (slot.growth, -slot.taken_before, slot.start, slot.gpu)


class BestFitMig(MigRule):
    name = "best-fit"
    description = "the GPU with the most slices taken, then the lowest start"

    def key(self, slot: Slot) -> tuple:
        return (-slot.taken_before, slot.start, slot.gpu)


class FirstFitMig(MigRule):
    name = "first-fit"
    description = "the lowest GPU, then the lowest start"

    def key(self, slot: Slot) -> tuple:
        return (slot.gpu, slot.start)


_MIG_RULES: dict[str, MigRule] = {
    rule.name: rule for rule in (FgdMig(), BestFitMig(), FirstFitMig())
}


def mig_rule_names() -> list[str]:
    return list(_MIG_RULES)


def mig_rules() -> list[MigRule]:
    """Every MIG creation rule, in the registry's order (the default first)."""
    return list(_MIG_RULES.values())


def get_mig_rule(name: str, *, what: str = "MIG creation rule") -> MigRule:
    """The rule called ``name``; a :class:`RequestError` naming every rule when there is
    none."""
    return lookup(_MIG_RULES, name, what)
