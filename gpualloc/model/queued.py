"""A waiting job's request as the queue keeps it: the placement engine's request in a form any
gpualloc process can store, send to the broker and place again (:meth:`gpualloc.placement.want.
Want.queued` and :meth:`~gpualloc.placement.want.Want.from_queued`). Part of the ledger's
schema (:class:`gpualloc.ledger.schema.Waiter` holds one), kept in the model so that placement
needs nothing of the ledger (house style: ``placement`` never imports ``ledger``).
"""

from typing import Annotated

from msgspec import Meta, Struct

from gpualloc.model.mig import MigRequest
from gpualloc.model.share import ShareRequest
from gpualloc.model.validation import PositiveInt


class QueuedRequest(Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """A waiting job's request, complete enough for any gpualloc process to place it (a later
    job decides whether it may pass this one by asking whether this one could start now)."""

    gpus: PositiveInt
    pattern: str = "ring"
    edges: tuple[tuple[int, int], ...] = ()
    sensitive: bool
    required: tuple[int, ...] = ()
    excluded: tuple[int, ...] = ()
    explicit: tuple[int, ...] | None = None
    policy: str = "mapa"
    score: str = "auto"
    drb_weights: tuple[float, float, float] | None = None
    min_utility: Annotated[float, Meta(ge=0, le=1)] | None = None
    min_bandwidth_gbps: Annotated[float, Meta(ge=0)] | None = None
    mig: MigRequest | None = None
    """A MIG device instead of whole GPUs."""
    share: ShareRequest | None = None
    """A shared place on one GPU instead of whole GPUs."""
