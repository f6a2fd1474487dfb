"""A submitted job's options, as its record keeps them, turned into what ``run --wait`` asks a
host for: the lease's terms and the wait (the same helpers as ``run``'s, so a
job behaves alike whether run or submitted)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpualloc.batch.record import JobRecord
    from gpualloc.host.lease_terms import LeaseTerms
    from gpualloc.host.queue_policy import WaitOptions

OWN_OPTIONS = ("numa", "name", "time", "signal", "uuid", "ignore_foreign", "allow_unhealthy",
               "priority", "max_bypass")  # fmt: skip
"""The options a record keeps beside the job's fields (:data:`gpualloc.model.job_fields.
FIELDS`)."""


def lease_terms(record: JobRecord, *, pid: int) -> LeaseTerms:
    """The lease of the job ``record`` describes, held by its supervisor ``pid`` (the job it
    forks inherits the lease lock), under the job's id."""
    from gpualloc.cli.jobs import asked_signal, asked_time_limit
    from gpualloc.host.lease_terms import LeaseTerms
    from gpualloc.model.job_fields import declared_memory_bytes, pick_fields

    job, own = pick_fields(record.options)
    return LeaseTerms(
        source="submit",
        pid=pid,
        lock=True,
        command=record.command,
        name=record.name,
        shareable=bool(job.get("shareable")),
        memory_bytes=declared_memory_bytes(job),
        time_limit_s=asked_time_limit(own.get("time")),
        signal=asked_signal(own.get("signal")),
        lease_id=record.id,
    )


def wait_of(own: Mapping[str, Any]) -> WaitOptions:
    """The queue options of a submitted job: it always waits, with no timeout."""
    from gpualloc.cli.open_ledger import wait_options

    waiting = wait_options(
        wait=True, timeout=None, priority=own.get("priority"), max_bypass=own.get("max_bypass")
    )
    assert waiting is not None
    return waiting
