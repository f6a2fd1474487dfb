"""The interface every placement policy implements, and how set objectives are searched.

A policy turns a :class:`~gpualloc.placement.context.DecisionContext` into a
:class:`~gpualloc.model.request.Placement`. Policies whose objective depends only on the *set* of
GPUs (pack, spread, DRB) share :func:`best_set`, an exact search over the candidate sets in
lexicographic order that keeps the first strict improvement, so ties go to the lowest indices;
the chosen set is then ordered by :meth:`Policy.order_of`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import ClassVar

from msgspec import Struct

from gpualloc.model.request import Placement, Scores
from gpualloc.placement import deadline
from gpualloc.placement.candidates import candidate_sets
from gpualloc.placement.context import DecisionContext

SetKey = tuple[float, ...]


class Alternative(Struct, frozen=True):
    """A runner-up placement for ``plan --explain``, ranked by the policy's own key."""

    gpus: tuple[int, ...]
    key: SetKey
    scores: Scores


def gpu_list(gpus: Sequence[int]) -> str:
    return ",".join(str(g) for g in gpus)


class Policy(ABC):
    """One placement policy: a name, a one-line summary, ``place`` and how to explain it."""

    name: ClassVar[str]
    summary: ClassVar[str]
    reference: ClassVar[str]
    """Where the policy comes from (paper section or tool)."""
    scores_partial_sets: ClassVar[bool] = False
    """Whether :meth:`set_key` scores a set of any size, so that a search cut short by its time
    budget can grow a set greedily by it (:mod:`gpualloc.placement.greedy`); otherwise the
    fallback places the pattern rank by rank."""

    @abstractmethod
    def place(self, ctx: DecisionContext) -> Placement:
        """The policy's choice; raises NoFeasiblePlacement only through the context."""

    def objective(self, ctx: DecisionContext) -> str:
        return self.summary

    def order_of(self, ctx: DecisionContext, gpus: tuple[int, ...]) -> tuple[int, ...]:
        """How the policy orders a set: by default, the most bandwidth for the pattern."""
        return ctx.order_for_set(gpus)

    def set_key(self, ctx: DecisionContext, order: Sequence[int]) -> SetKey | None:
        """The policy's own score of an ordered placement (higher is better), for --explain.

        ``None`` for policies that follow a procedure rather than maximise a score.
        """
        return None

    def reason(
        self, ctx: DecisionContext, placement: Placement, runner_up: Alternative | None
    ) -> str:
        """One line saying why this placement won."""
        versus = f"; runner-up {gpu_list(runner_up.gpus)}" if runner_up else ""
        return f"{self.summary}{versus}"


def best_set(ctx: DecisionContext, key: Callable[[tuple[int, ...]], SetKey]) -> tuple[int, ...]:
    """The lexicographically first candidate set of maximal ``key``."""
    best_key: SetKey | None = None
    best: tuple[int, ...] | None = None
    for gpus in deadline.current().watch(candidate_sets(ctx.pool, ctx.request.required, ctx.k)):
        value = key(gpus)
        if best_key is None or value > best_key:
            best_key, best = value, gpus
    assert best is not None  # the context checked feasibility
    return best
