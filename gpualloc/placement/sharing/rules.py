"""The share placement rules: how a shared job's GPU is chosen among those that fit it (the
system config's ``share.placement``, ``simulate --share-placement``). One declared object per
rule behind one registry, as the whole-GPU policies are
(:mod:`gpualloc.placement.policies.registry`):

- ``fgd`` (the default): where the workload's expected fragmentation grows least (Weng et al.,
  "Beware of Fragmentation", USENIX ATC'23, section 4.3; :mod:`.fragmentation`),
  then the least free capacity left, then the best fit. O(n^2 T) for n GPUs and T task types.
- ``best-fit``: a GPU in use first, then the least of the GPU left (for a job that names its
  part with ``--sm-share``), then the least memory left, the fewest shared jobs, the index.
  DeepPool's placement of background jobs onto the GPUs of foreground jobs (seed 004,
  section 3); gpualloc's rule before FGD. O(n log n).
- ``first-fit``: the lowest-numbered GPU. O(n log n).
- ``spread``: the most free capacity, then the fewest shared jobs. O(n log n).

The configuration is a leaf and cannot import this module, so it keeps the names itself
(:data:`gpualloc.config.SHARE_PLACEMENT_NAMES`); a test holds the two lists equal.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import ClassVar

from msgspec import Struct

from gpualloc.model.share import ShareRequest
from gpualloc.placement.rule_lookup import lookup
from gpualloc.placement.sharing.candidates import ShareCandidate

__all__ = [
    "ShareChoice",
    "ShareContext",
    "SharePolicy",
    "get_share_policy",
    "share_policies",
    "share_policy_names",
]


class ShareChoice(Struct, frozen=True):
    candidate: ShareCandidate
    reason: str
    runners_up: tuple[ShareCandidate, ...]


class ShareContext(Struct, frozen=True):
    """What a rule ranks by: the GPUs that fit the job, and the host around them."""

    request: ShareRequest
    fitting: Sequence[ShareCandidate]
    """The GPUs whose memory and unheld part fit the job, by index (never empty)."""
    part: float
    """The part of a GPU the job takes: its ``--sm-share``, else one of ``max_jobs`` slices."""
    free: Sequence[float]
    """Each GPU's free capacity (:func:`~.candidates.free_capacity`)."""
    mix: Mapping[tuple[int, float], float] | None = None
    """The workload's task types and their shares (None: the default mix)."""
    mix_source: str = "the default mix"

    def best_fit(self, c: ShareCandidate) -> tuple:
        """A GPU in use first, then the least of it left, the least memory left, the fewest
        shared jobs, the lowest index."""
        need = self.request.memory_bytes or 0
        left = (c.free_bytes - need) if c.free_bytes is not None else float("inf")
        room = 1 - c.used_fraction - self.part if self.request.fraction is not None else 0.0
        return (c.state == "free", room, left, c.jobs, c.gpu)

    def choice(self, ranked: Sequence[ShareCandidate], why: str) -> ShareChoice:
        best = ranked[0]
        return ShareChoice(best, f"{best.describe()}: {why}", tuple(ranked[1:]))


class SharePolicy(ABC):
    """One share placement rule: a name, a one-line description, and :meth:`choose`."""

    name: ClassVar[str]
    description: ClassVar[str]

    @abstractmethod
    def choose(self, ctx: ShareContext) -> ShareChoice:
        """The rule's GPU among ``ctx.fitting``, the others as runners-up, best first."""


class FgdShare(SharePolicy):
    name = "fgd"
    description = "where the workload's expected fragmentation grows least (FGD, ATC'23)"

    def choose(self, ctx: ShareContext) -> ShareChoice:
        from gpualloc.placement.sharing.fragmentation import (
            DEFAULT_MIX,
            expected_fragmentation,
            growth,
        )

        free, part, fitting = ctx.free, ctx.part, ctx.fitting
        weights = ctx.mix or DEFAULT_MIX
        now = expected_fragmentation(free, weights)
        grown = {c.gpu: round(growth(free, c.gpu, part, weights, now), 9) for c in fitting}
        ranked = sorted(fitting, key=lambda c: (grown[c.gpu], free[c.gpu] - part, *ctx.best_fit(c)))
        best = ranked[0]
        why = (
            f"the workload's expected fragmentation grows least there ({grown[best.gpu]:+.3f} "
            f"GPU, weighed by {ctx.mix_source}; FGD, Weng et al. ATC'23)"
        )
        if sum(grown[c.gpu] == grown[best.gpu] for c in fitting) > 1:
            why += "; among the GPUs that tie, the best fit"
        return ctx.choice(ranked, why)


class BestFitShare(SharePolicy):
    name = "best-fit"
    description = "a GPU in use first, then the least of it (or of its memory) left"

    def choose(self, ctx: ShareContext) -> ShareChoice:
        ranked = sorted(ctx.fitting, key=ctx.best_fit)
        if ranked[0].state == "free":
            why = "no GPU in use has room, so a free one"
        else:
            left = "of it" if ctx.request.fraction is not None else "memory"
            why = f"the GPU in use with the least {left} left after it (best fit)"
        return ctx.choice(ranked, why)


class FirstFitShare(SharePolicy):
    name = "first-fit"
    description = "the lowest-numbered GPU that fits"

    def choose(self, ctx: ShareContext) -> ShareChoice:
        ranked = sorted(ctx.fitting, key=lambda c: c.gpu)
        return ctx.choice(ranked, "the lowest-numbered GPU that fits (first fit)")


class SpreadShare(SharePolicy):
    name = "spread"
    description = "the GPU with the most free capacity"

    def choose(self, ctx: ShareContext) -> ShareChoice:
        free = ctx.free
        ranked = sorted(ctx.fitting, key=lambda c: (-free[c.gpu], c.jobs, c.gpu))
        return ctx.choice(ranked, "the GPU with the most free capacity (spread)")


_SHARE_POLICIES: dict[str, SharePolicy] = {
    policy.name: policy for policy in (FgdShare(), BestFitShare(), FirstFitShare(), SpreadShare())
}


def share_policy_names() -> list[str]:
    return list(_SHARE_POLICIES)


def share_policies() -> list[SharePolicy]:
    """Every share placement rule, in the registry's order (the default first)."""
    return list(_SHARE_POLICIES.values())


def get_share_policy(name: str, *, what: str = "share placement") -> SharePolicy:
    """The rule called ``name``; a :class:`RequestError` naming every rule when there is none
    (``what`` names where the name came from: ``--share-placement``)."""
    return lookup(_SHARE_POLICIES, name, what)
