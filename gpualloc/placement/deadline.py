"""A time budget for one placement decision (``tests/test_placement_budget.py``).

The exact searches are exponential in the worst case: on a 32-GPU PCIe host ``plan -n 10
--policy drb`` walks C(32, 10) = 64 million sets. A decision therefore runs under a
:class:`Deadline` that does not grow with the request: the searches call :meth:`Deadline.tick`
in their inner loops (a counter; the clock is read every :data:`CHECK_EVERY` ticks) and it raises
:class:`OverBudget` once the budget is spent. :func:`gpualloc.placement.choose.choose` then
answers with a greedy placement (:mod:`.greedy`) and says so (``Placement.cut_short``).

The deadline in force is a context variable (:func:`within`, :func:`current`), so the searches
deep in the engine need no extra parameter and each thread has its own. Outside :func:`within`
the deadline is :data:`UNLIMITED`: the simulator and the benchmarks measure exact answers.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TypeVar

T = TypeVar("T")

CHECK_EVERY = 256
"""Ticks between readings of the clock: a tick is a counter increment, a reading a call of
:func:`time.monotonic`, so the clock costs a fraction of a tick; a deadline is overrun by at
most this many of the engine's slowest ticks (one realisation step), which keeps a decision
within its budget's margin (``tests/test_placement_budget.py``)."""


class OverBudget(Exception):
    """The decision's time budget is spent (caught by the caller that set the deadline)."""


class Deadline:
    """When the decision in progress must stop: ``budget_s`` from now, or never (``None``)."""

    __slots__ = ("_at", "_count", "budget_s", "tick")

    def __init__(self, budget_s: float | None = None) -> None:
        self.budget_s = budget_s
        self._at = math.inf if budget_s is None else time.monotonic() + budget_s
        self._count = 0
        self.tick: Callable[[], None] = self._counted if budget_s is not None else _untimed
        """One unit of search work; raises :class:`OverBudget` once the budget is spent. A
        call that does nothing when there is no budget: the exact searches of the simulator
        and the benchmarks pay no count."""

    @property
    def limited(self) -> bool:
        return self.budget_s is not None

    def _counted(self) -> None:
        self._count += 1
        if not self._count % CHECK_EVERY and time.monotonic() > self._at:
            raise OverBudget

    def check(self) -> None:
        """Read the clock now (for loops whose steps are slow); raises :class:`OverBudget`."""
        if time.monotonic() > self._at:
            raise OverBudget

    def watch(self, items: Iterable[T]) -> Iterable[T]:
        """``items``, ticking once per item (unchanged when the deadline is unlimited)."""
        if not self.limited:
            return items
        return self._watched(items)

    def _watched(self, items: Iterable[T]) -> Iterator[T]:
        for item in items:
            self.tick()
            yield item


def _untimed() -> None:
    """:attr:`Deadline.tick` where there is no budget."""


UNLIMITED = Deadline()
_current: ContextVar[Deadline] = ContextVar("gpualloc_placement_deadline", default=UNLIMITED)


def current() -> Deadline:
    """The deadline of the decision in progress (:data:`UNLIMITED` outside :func:`within`)."""
    return _current.get()


@contextmanager
def within(budget_s: float | None) -> Iterator[Deadline]:
    """Run the block's searches under a budget of ``budget_s`` seconds (``None``: none)."""
    deadline = Deadline(budget_s)
    token = _current.set(deadline)
    try:
        yield deadline
    finally:
        _current.reset(token)
