"""Leases made by hand, as the ledger stores them, and wants made as a command makes them: for
the tests that fill a ledger or a host without the command line."""

from __future__ import annotations

import os
from datetime import datetime, timezone
from typing import Any

from gpualloc.ledger.schema import Lease, LeasedGpu
from gpualloc.ledger.store import new_lease_id
from gpualloc.placement.want import Want

HOST = "testhost"
"""The host name of the ledgers the tests make by hand."""
NOW = datetime(2026, 11, 25, tzinfo=timezone.utc)
"""When :func:`lease_on`'s leases were made: one fixed time, so that two ledgers compare."""


def held_lease(*gpus: int, **fields: Any) -> Lease:
    """A held lease of the test's user on ``gpus``, made now with a new id (``fields``: any
    other of the lease's, its ``gpus`` included)."""
    values: dict[str, Any] = {
        "id": new_lease_id(),
        "gpus": tuple(LeasedGpu(index=g) for g in gpus),
        "uid": os.geteuid(),
        "user": "tester",
        "hold": True,
        "created": datetime.now(timezone.utc),
        "source": "alloc",
    }
    values.update(fields)
    return Lease(**values)


def lease_on(gpu: int, tag: str = "0", **terms: Any) -> Lease:
    """A held lease of root's on ``gpu`` (``terms``: shareable, memory_bytes, share, ...)."""
    return Lease(
        id=f"{tag * 4}{gpu:08x}",
        gpus=(LeasedGpu(index=gpu),),
        uid=0,
        user="root",
        hold=True,
        created=NOW,
        source="alloc",
        **terms,
    )


def want_of_options(**options: Any) -> Want:
    """The want a command makes of these job options (``mig``, ``mem``, ...)."""
    from gpualloc.config import Config
    from gpualloc.model.job import JobOptions
    from gpualloc.placement.options import want_of

    return want_of(JobOptions(**options), Config.load())
