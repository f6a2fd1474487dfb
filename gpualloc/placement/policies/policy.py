"""The interface every placement policy implements, and how set objectives are searched.

A policy turns a :class:`~gpualloc.placement.context.DecisionContext` into a
:class:`~gpualloc.model.request.Placement`. Policies whose objective depends only on the *set* of
GPUs (pack, spread, DRB) return the lexicographically first set of their best key, as scoring
every candidate set in order and keeping the first strict improvement would (pack and DRB by
:mod:`gpualloc.placement.sets.search`, spread by socket counts); the chosen set is then ordered by
:meth:`Policy.order_of`. Among the placements the objective rates equal, :meth:`Policy.place`
then applies gpualloc's one tie rule (:mod:`gpualloc.placement.ties`: fewer NUMA nodes, fewer
PCIe root complexes, more NVLink bandwidth left free, lower indices), except in the policies
that reproduce another tool, which break ties as that tool does.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

from msgspec import Struct

from gpualloc.model.request import Placement, Scores
from gpualloc.placement.context import DecisionContext
from gpualloc.placement.ties import break_ties

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
    reads_running_jobs: ClassVar[bool] = True
    """Whether the choice depends on the jobs running, not only on the free GPUs (DRB's
    interference term does; pack's cost and fragmentation read the free GPUs alone). A policy
    that reads the free GPUs alone makes the same choice for the same free GPUs, whoever holds
    the others: the simulator's queue reuses it, scored again for the jobs at hand
    (:func:`gpualloc.placement.choose.searched`; ``tests/test_remembered_choices.py`` holds
    each such policy to it, on states that catch DRB if it were marked so)."""
    breaks_ties: ClassVar[bool] = True
    """Whether :meth:`place` applies the tie rule of :mod:`gpualloc.placement.ties` after the
    policy's objective; False in a policy that reproduces another tool (go-gpuallocator,
    Slurm, the lowest indices), whose answer must be that tool's."""
    keys_sets_alone: ClassVar[bool] = False
    """Whether :meth:`set_key` reads the set alone, not its order (so the tie rule can score
    a set without searching its orders)."""
    scores_partial_sets: ClassVar[bool] = False
    """Whether :meth:`set_key` scores a set of any size, so that a search cut short by its time
    budget can grow a set greedily by it (:mod:`gpualloc.placement.greedy`); otherwise the
    fallback places the pattern rank by rank."""

    def place(self, ctx: DecisionContext) -> Placement:
        """The policy's choice: its :meth:`search`, then the tie rule where it applies."""
        found = self.search(ctx)
        return break_ties(self, ctx, found) if self.breaks_ties else found

    @abstractmethod
    def search(self, ctx: DecisionContext) -> Placement:
        """The best placement under the policy's own objective (its lowest set where several
        tie, for gpualloc's own policies); raises NoFeasiblePlacement only through the
        context."""

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

    def key_bound(self, ctx: DecisionContext, gpus: Sequence[int]) -> SetKey | None:
        """An upper bound on :meth:`set_key` of any placement on ``ctx.k`` of ``gpus``, where a
        cheap one exists, for the tie rule to skip a region no tied set can lie in; ``None``:
        none known."""
        return None

    def reason(
        self, ctx: DecisionContext, placement: Placement, runner_up: Alternative | None
    ) -> str:
        """One line saying why this placement won."""
        versus = f"; runner-up {gpu_list(runner_up.gpus)}" if runner_up else ""
        return f"{self.summary}{versus}"
