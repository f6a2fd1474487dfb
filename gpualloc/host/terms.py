"""What a request to a :class:`~gpualloc.host.protocol.Host` carries besides the job, and what it
gets back: the lease's terms (whose it is, how long it lives), an allocation, a release's and a
garbage collection's results. The same types whichever host answers, the embedded ledger or the
broker.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from msgspec import Struct, field
from msgspec.structs import force_setattr

from gpualloc.errors import NoSuchLease, NotPermitted, RequestError
from gpualloc.ledger.occupancy import format_age
from gpualloc.ledger.schema import Lease, LeaseSource, Waiter
from gpualloc.model.printable import has_surrogates, lease_command, printable
from gpualloc.model.request import Placement
from gpualloc.model.share import ShareMode

if TYPE_CHECKING:
    from gpualloc.ledger.idle import Expiry

MAX_NAME_CHARS = 128
"""A lease's name is a label in everyone's ``status``, not a document."""
MAX_WORD_CHARS = 4096
"""The longest lease selector or other short text a request may carry (a command is cut
instead: :func:`~gpualloc.model.printable.lease_command`)."""


def lease_name(name: str | None) -> str | None:
    """``name`` if it may name a lease: at most :data:`MAX_NAME_CHARS` characters of text.

    A name with bytes that are not UTF-8 (``--name $'\\xff'``, lone surrogates in Python) is
    refused, not escaped: it is a label its owner chose for everyone to read, and storing something
    other than what was typed would show a name its owner never gave; a UTF-8 name always does
    (tests/test_hostile_bytes.py::test_lease_terms_keep_the_command_escaped_and_refuse_the_name)."""
    if name is None:
        return None
    if len(name) > MAX_NAME_CHARS:
        raise RequestError(
            f"--name is {len(name)} characters long; a lease name has at most {MAX_NAME_CHARS}",
            hint="give a shorter name (status shows the command beside it)",
        )
    if has_surrogates(name):
        raise RequestError(
            f"--name '{printable(name, 60)}' holds bytes that are not UTF-8 text",
            hint="give a name in UTF-8 text (every user's status shows it)",
        )
    return name


def no_such_process(pid: int) -> RequestError:
    """A lease's ``--pid`` names no running process: the same words from either ledger
    (``tests/test_host_contract.py``)."""
    return RequestError(
        f"no process with pid {pid}: the lease would end at once",
        hint="give --pid of a process that runs while the GPUs are used, or --hold",
    )


class LeaseTerms(Struct, frozen=True):
    """Who a new lease belongs to and how long it lives (see :class:`Lease`)."""

    source: LeaseSource
    pid: int | None = None
    hold: bool = False
    lock: bool = False
    """Take the lease lock now and keep its descriptor open for the job to inherit."""
    command: tuple[str, ...] = ()
    name: str | None = None
    process_group: int | None = None
    """The job's own process group, when it leads one (see ``Lease.process_group``)."""
    announce: bool = False
    """The lease is unconfirmed until :meth:`Host.confirm` (after its id was printed)."""
    shareable: bool = False
    """Shared jobs may join the lease's GPUs (``--shareable``)."""
    memory_bytes: int | None = None
    """GPU memory the job declares it uses (``--shareable --mem``)."""
    share_mode: ShareMode = "time-sliced"
    """How a shared job shares its GPU (CUDA MPS when its daemon runs)."""
    uid: int | None = None
    """Whose lease it is: the broker names its peer; None: this process's user."""
    pid_start_time: float | None = None
    """``pid``'s start time when the caller read it already (the broker, checking the pid)."""
    creator: tuple[int, float | None] | None = None
    """The process announcing the lease (pid, start time); None: this process."""
    lease_id: str | None = None
    """The id the new lease gets; None: a new random one (the broker's clients choose theirs,
    so that a request sent again after a lost connection finds the lease it made)."""

    def __post_init__(self) -> None:
        lease_name(self.name)
        command = lease_command(self.command)
        if command != self.command:
            force_setattr(self, "command", command)


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
