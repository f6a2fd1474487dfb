"""What a request to a :class:`~gpualloc.host.protocol.Host` gets back: an allocation, a
release's and a garbage collection's results, a waiting job's status. The same types whichever
host answers, the embedded ledger or the broker (the lease's terms, which a request carries, are
:mod:`.lease_terms`).
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from msgspec import Struct, field

from gpualloc.errors import NoSuchLease, NotPermitted, RequestError
from gpualloc.ledger.occupancy import format_age
from gpualloc.ledger.schema import Lease, Waiter
from gpualloc.model.request import Placement

if TYPE_CHECKING:
    from gpualloc.ledger.idle import Expiry


class Allocation(Struct):
    lease: Lease
    placement: Placement
    lock_fd: int | None = None
    notes: list[str] = field(default_factory=list)


class ReleaseResult(Struct):
    released: list[Lease] = field(default_factory=list)
    problems: list[RequestError | NoSuchLease | NotPermitted] = field(default_factory=list)
    kept: list[Lease] = field(default_factory=list)
    """The caller's leases ``release --mine`` left: their jobs still run."""


class GarbageReport(Struct):
    reaped: list[Lease]
    dropped_waiters: list[Waiter]
    """Queue entries of waiting gpualloc processes that are gone."""
    removed_lock_files: list[str]
    notes: list[str]
    expiries: list[Expiry] = field(default_factory=list)
    """Idle ``--hold`` leases given notice, or released (``idle.expire_holds``)."""
    removed_temporary_files: list[str] = field(default_factory=list)
    """Temporary files of atomic writes that a killed writer left in the state directory."""


class WaitStatus(Struct, frozen=True):
    """What a waiting job shows its user."""

    position: int
    queue_length: int
    reason: str
    holders: str
    waited_s: float

    def line(self) -> str:
        text = (
            f"waiting {format_age(timedelta(seconds=self.waited_s))}, #{self.position} of "
            f"{self.queue_length} in the queue: {self.reason}"
        )
        return f"{text}; {self.holders}" if self.holders else text
