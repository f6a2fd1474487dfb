"""The interface every placement policy implements, and how set objectives are searched.

A policy turns a :class:`~gpualloc.placement.context.DecisionContext` into a
:class:`~gpualloc.model.request.Placement`. Policies whose objective depends only on the *set* of
GPUs (pack, spread, DRB, MAPA Preserve) share :func:`best_set`, an exact search over the
candidate sets in lexicographic order that keeps the first strict improvement, so ties go to the
lowest indices; the chosen set is then ordered for the job's pattern.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from itertools import combinations
from typing import ClassVar

from gpualloc.model.request import Placement
from gpualloc.placement.context import DecisionContext

SetKey = tuple[float, ...]


class Policy(ABC):
    """One placement policy: a name, a one-line summary, and ``place``."""

    name: ClassVar[str]
    summary: ClassVar[str]
    reference: ClassVar[str]
    """Where the policy comes from (paper section or tool)."""

    @abstractmethod
    def place(self, ctx: DecisionContext) -> Placement:
        """The policy's choice; raises NoFeasiblePlacement only through the context."""

    def objective(self, ctx: DecisionContext) -> str:
        return self.summary

    def set_key(self, ctx: DecisionContext, order: Sequence[int]) -> SetKey | None:
        """The policy's own score of an ordered placement (higher is better), for --explain.

        ``None`` for policies that follow a procedure rather than maximise a score.
        """
        return None


def candidate_sets(ctx: DecisionContext) -> Iterable[tuple[int, ...]]:
    """Every k-set of usable GPUs holding the required ones, lexicographically ordered."""
    required = ctx.request.required
    others = [g for g in ctx.pool if g not in required]
    need = ctx.k - len(required)
    if not required:
        return combinations(others, need)
    base = tuple(sorted(required))
    return (tuple(sorted(base + extra)) for extra in combinations(others, need))


def best_set(
    ctx: DecisionContext,
    key: Callable[[tuple[int, ...]], SetKey],
    bound: Callable[[tuple[int, ...]], SetKey] | None = None,
) -> tuple[int, ...]:
    """The lexicographically first set of maximal ``key``.

    ``bound(set)`` may return an optimistic key that is cheaper to compute; a set whose bound does
    not beat the incumbent is skipped.
    """
    best_key: SetKey | None = None
    best: tuple[int, ...] | None = None
    for gpus in candidate_sets(ctx):
        if best_key is not None and bound is not None and bound(gpus) <= best_key:
            continue
        value = key(gpus)
        if best_key is None or value > best_key:
            best_key, best = value, gpus
    assert best is not None  # the context checked feasibility
    return best
