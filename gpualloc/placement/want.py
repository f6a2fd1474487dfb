"""What a job asks the placement engine for: a :class:`Want`.

One request type for every way in: the command line and the Python API build it (through
:mod:`gpualloc.job_options`), the queue stores it (:meth:`Want.queued`) and places it again
for a waiting job (:meth:`Want.from_queued`), and :func:`gpualloc.placement.choose.choose` answers
it. Who the lease belongs to and how long it lives is not part of it (that is the ledger's
:class:`~gpualloc.host.lease_terms.LeaseTerms`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from msgspec import Struct

from gpualloc.config import DEFAULT_POLICY
from gpualloc.model.job import JobOptions
from gpualloc.model.mig import MigRequest
from gpualloc.model.request import CommunicationPattern, JobRequest
from gpualloc.model.share import ShareRequest
from gpualloc.placement.mapa.scores import EffectiveModel
from gpualloc.placement.sets.utility import UtilityWeights

if TYPE_CHECKING:
    from collections.abc import Iterable

    from gpualloc.model.queued import QueuedRequest
    from gpualloc.model.topology import Gpu


class Want(Struct, frozen=True):
    """What the caller wants: the engine's choice for ``request``, or exactly ``explicit``;
    with ``min_utility`` / ``min_bandwidth_gbps``, only a placement at least that good
    (postponement, DRB paper section 4.4)."""

    request: JobRequest
    policy: str = DEFAULT_POLICY
    explicit: tuple[int, ...] | None = None
    effective_model: EffectiveModel = EffectiveModel.AUTO
    weights: UtilityWeights | None = None
    min_utility: float | None = None
    min_bandwidth_gbps: float | None = None
    mig: MigRequest | None = None
    """A MIG device instead of whole GPUs (``request`` then asks for one GPU)."""
    share: ShareRequest | None = None
    """A shared place on one GPU instead of whole GPUs (``request`` then asks for one)."""
    options: JobOptions | None = None
    """The options it was made from (:func:`gpualloc.placement.options.want_of`), its policy
    resolved: what a broker client sends, for the broker to make the same Want."""

    def queued(self) -> QueuedRequest:
        """This request as the queue stores it."""
        from gpualloc.model.queued import QueuedRequest

        weights = self.weights
        return QueuedRequest(
            gpus=self.request.gpus,
            pattern=self.request.pattern.name,
            edges=self.request.pattern.edges,
            sensitive=self.request.sensitive,
            required=tuple(sorted(self.request.required)),
            excluded=tuple(sorted(self.request.excluded)),
            explicit=self.explicit,
            policy=self.policy,
            score=self.effective_model.value,
            drb_weights=(
                (weights.communication, weights.interference, weights.fragmentation)
                if weights
                else None
            ),
            min_utility=self.min_utility,
            min_bandwidth_gbps=self.min_bandwidth_gbps,
            mig=self.mig,
            share=self.share,
        )

    @classmethod
    def from_queued(cls, queued: QueuedRequest) -> Want:
        """The request of a waiting job, as any gpualloc process can place it. A pattern
        outside the model's rules (a pair named twice over three ranks or more, written by a
        gpualloc that allowed it, or sent to the broker) is a :class:`RequestError`, before
        any search."""
        try:
            request = JobRequest(
                gpus=queued.gpus,
                pattern=CommunicationPattern(queued.pattern, queued.gpus, queued.edges),
                sensitive=queued.sensitive,
                required=frozenset(queued.required),
                excluded=frozenset(queued.excluded),
            )
        except ValueError as bad:
            from gpualloc.errors import RequestError

            raise RequestError(
                f"the job's pattern: {bad}", hint="list each pair of ranks that talk once"
            ) from None
        return cls(
            request=request,
            policy=queued.policy,
            explicit=queued.explicit,
            effective_model=EffectiveModel(queued.score),
            weights=UtilityWeights(*queued.drb_weights) if queued.drb_weights else None,
            min_utility=queued.min_utility,
            min_bandwidth_gbps=queued.min_bandwidth_gbps,
            mig=queued.mig,
            share=queued.share,
        )


def check_declared_memory(gpus: Iterable[Gpu], declared: int | None) -> None:
    """Refuse (exit 9, as ``--share --mem`` is) a ``--shareable`` job's declared memory when
    it is more than any of ``gpus`` (those it could be placed on) has: a job that says it uses
    40 GiB of a 32 GiB GPU leaves nothing true to share beside it. The command line and the
    broker both ask this before any GPU is taken."""
    if declared is None:
        return
    known = [g.memory_total_bytes for g in gpus if g.memory_total_bytes is not None]
    if known and declared > max(known):
        from gpualloc.errors import NoFeasiblePlacement
        from gpualloc.model.mig import format_size

        raise NoFeasiblePlacement(
            f"--mem {format_size(declared)} is more than any GPU here has "
            f"({format_size(max(known))})",
            hint="declare the memory the job uses on each of its GPUs, at most the GPU's",
        )
