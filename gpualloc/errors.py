"""The error hierarchy and the one exit-code table of gpualloc.

The library raises :class:`GpuallocError` subclasses named after domain facts; only the CLI's
``main`` turns them into ``error: ...`` / ``hint: ...`` lines on stderr and an exit code (house
style habit 1, after sqlite-utils and pipx). Every exit code gpualloc can return is listed in
:class:`ExitCode`; the man page is generated from this table and the README's is checked against it.
"""

from __future__ import annotations

from enum import IntEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable


class ExitCode(IntEnum):
    """Process exit codes. Stable: scripts and Slurm prologs depend on them."""

    OK = 0
    INTERNAL = 1
    """An unexpected failure inside gpualloc (a bug); rerun with ``--debug`` for the traceback."""
    USAGE = 2
    """The command line is wrong (unknown option, bad value); click's own convention."""
    TOPOLOGY_NOT_FOUND = 3
    """``--topology`` names neither a bundled topology nor an existing file (one that exists
    but cannot be read is ``IO``)."""
    TOPOLOGY_PARSE = 4
    """Recorded ``nvidia-smi`` / ``numactl`` text or a topology file could not be understood."""
    TOPOLOGY_INVALID = 5
    """A topology file parsed but is inconsistent, or was written by a newer gpualloc."""
    NO_GPU = 6
    """No NVIDIA GPU was found on this host and no topology was given."""
    DISCOVERY = 7
    """NVML or nvidia-smi is present but failed in a way gpualloc cannot work around."""
    IO = 8
    """A file gpualloc had to read or write could not be accessed: missing, not permitted, not a
    regular file, too large. One code whichever option or setting named it; a file read that
    cannot be understood is its kind's own code (a trace 14, a configuration file 15)."""
    NO_PLACEMENT = 9
    """No set of GPUs satisfies the request now (too few free GPUs, a required GPU busy)."""
    BUSY = 10
    """The GPUs the request needs are held by other leases or used by foreign processes."""
    LEDGER = 11
    """The shared ledger cannot be used: an unsafe state directory, a file from a newer
    gpualloc, or a corrupt file with no good copy to recover from."""
    NOT_PERMITTED = 12
    """The lease belongs to another user (only root may release it), or the host's system
    configuration does not let this user ask for that (``--priority high``, a lower
    ``--max-bypass``, more waiting jobs)."""
    NO_LEASE = 13
    """No lease or submitted job has the given id or name (a lease may have been released or
    reaped already), or the name or prefix given fits several (the message lists them)."""
    TRACE = 14
    """A simulation trace or generator spec could not be understood."""
    CONFIG = 15
    """A configuration file or ``GPUALLOC_*`` setting could not be understood."""
    LOCKED = 16
    """Another process held the shared ledger's lock for longer than gpualloc waits (the
    message names it); nothing was changed."""
    CHECK_FAILED = 17
    """``gpualloc doctor`` found a problem (a link down or slow, peer-to-peer off, a job off its
    GPUs, an unhealthy GPU); the output says what."""
    BROKER = 18
    """The host's broker (``gpualloc serve``) is configured but does not answer, speaks another
    protocol version, or refused the request as too large, too fast or too many; nothing was
    changed."""
    TIMEOUT = 124
    """``--wait --timeout`` ran out before the GPUs came free, as timeout(1) reports it."""
    NOT_EXECUTABLE = 126
    """The command exists but could not be executed, as a shell reports it."""
    COMMAND_NOT_FOUND = 127
    """The command was not found, as a shell reports it."""
    INTERRUPTED = 130
    """Interrupted by SIGINT (128 + 2), as shells report it."""
    BROKEN_PIPE = 141
    """stdout was closed by its reader (128 + SIGPIPE), e.g. ``gpualloc topo show | head``."""


EXIT_CODE_DESCRIPTIONS: dict[ExitCode, str] = {
    ExitCode.OK: "success",
    ExitCode.INTERNAL: "internal error (a bug); rerun with --debug and report it",
    ExitCode.USAGE: "bad command line",
    ExitCode.TOPOLOGY_NOT_FOUND: "--topology names no bundled topology and no existing file",
    ExitCode.TOPOLOGY_PARSE: "recorded nvidia-smi/numactl text or topology file not understood",
    ExitCode.TOPOLOGY_INVALID: "topology file inconsistent or written by a newer gpualloc",
    ExitCode.NO_GPU: "no NVIDIA GPU found and no topology given",
    ExitCode.DISCOVERY: "NVML or nvidia-smi failed",
    ExitCode.IO: "a file could not be read or written (whichever option named it)",
    ExitCode.NO_PLACEMENT: "no set of free GPUs satisfies the request",
    ExitCode.BUSY: "the GPUs needed are held by others now",
    ExitCode.LEDGER: "the shared ledger cannot be used (unsafe directory, newer or corrupt file)",
    ExitCode.NOT_PERMITTED: "the lease is another user's, or the host's configuration forbids it",
    ExitCode.NO_LEASE: "no lease or job with that id or name, or one that names several",
    ExitCode.TRACE: "a simulation trace or --generate spec is not understood",
    ExitCode.CONFIG: "a config.toml file or a GPUALLOC_* setting is not understood",
    ExitCode.LOCKED: "another process held the ledger's lock too long (named in the message)",
    ExitCode.CHECK_FAILED: "gpualloc doctor found a problem (listed in its output)",
    ExitCode.BROKER: "the host's broker (gpualloc serve) does not answer or refused the call",
    ExitCode.TIMEOUT: "waited for GPUs until --timeout and gave up",
    ExitCode.NOT_EXECUTABLE: "the command could not be executed",
    ExitCode.COMMAND_NOT_FOUND: "the command was not found",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C)",
    ExitCode.BROKEN_PIPE: "the reader of stdout went away (as with head); nothing is wrong",
}


class GpuallocError(Exception):
    """Base of every error gpualloc reports to a user.

    ``message`` is one line saying what went wrong; ``hint`` is one line saying what to do.
    """

    exit_code: ExitCode = ExitCode.INTERNAL
    transient: str | None = None
    """Set for a refusal the same request may well not meet a little later (a broker over
    its user's request budget, a queue holding the user's most waiting jobs): why the
    request waits, as squeue names it. A batch job's supervisor waits and asks again; a
    command the user typed says it and exits."""

    def __init__(
        self,
        message: str,
        *,
        hint: str | None = None,
        details: tuple[str, ...] | Callable[[], tuple[str, ...]] = (),
    ) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self._details = details

    @property
    def details(self) -> tuple[str, ...]:
        """Supporting lines shown between the error and the hint (who holds the GPUs). Given
        as a function, they are written when first read: a simulation or a queue that only
        asks whether a job fits never pays for describing every holder."""
        if callable(self._details):
            self._details = tuple(self._details())
        return self._details

    @details.setter
    def details(self, value: tuple[str, ...]) -> None:
        self._details = value

    def __str__(self) -> str:
        return self.message


class TopologyError(GpuallocError):
    """Something is wrong with a topology: where it comes from or what it says."""

    exit_code = ExitCode.TOPOLOGY_INVALID


class TopologyNotFound(TopologyError):
    """``--topology`` names neither a bundled topology nor an existing file."""

    exit_code = ExitCode.TOPOLOGY_NOT_FOUND


class TopologyParseError(TopologyError):
    """Recorded text could not be parsed; names the line and the offending token."""

    exit_code = ExitCode.TOPOLOGY_PARSE

    def __init__(
        self,
        message: str,
        *,
        line_number: int | None = None,
        line: str | None = None,
        token: str | None = None,
        source: str | None = None,
        hint: str | None = None,
    ) -> None:
        where = []
        if source:
            where.append(source)
        if line_number is not None:
            where.append(f"line {line_number}")
        prefix = ":".join(where)
        text = f"{prefix}: {message}" if prefix else message
        if token is not None:
            text += f" (token {token!r})"
        super().__init__(text, hint=hint)
        self.line_number = line_number
        self.line = line
        self.token = token


class SchemaVersionError(TopologyError):
    """A file was written by a newer gpualloc whose schema this version does not know."""


class NoGpuFound(GpuallocError):
    """Neither NVML nor nvidia-smi found a GPU, and no topology was given."""

    exit_code = ExitCode.NO_GPU


class DiscoveryError(GpuallocError):
    """A discovery source is present but failed."""

    exit_code = ExitCode.DISCOVERY


class DiscoveryUnavailable(DiscoveryError):
    """A discovery source is absent (no libnvidia-ml, no nvidia-smi); the next one is tried."""


class FileAccessError(GpuallocError):
    """A file could not be read or written."""

    exit_code = ExitCode.IO


class RequestError(GpuallocError):
    """A job request is malformed: a bad pattern, a GPU index that does not exist, a conflict."""

    exit_code = ExitCode.USAGE


class NoFeasiblePlacement(GpuallocError):
    """No set of GPUs satisfies the request on the GPUs that are free now."""

    exit_code = ExitCode.NO_PLACEMENT


class LedgerError(GpuallocError):
    """The shared ledger cannot be used safely."""

    exit_code = ExitCode.LEDGER


class LedgerLocked(LedgerError):
    """Another process held the ledger's lock for longer than gpualloc waits."""

    exit_code = ExitCode.LOCKED


class GpusBusy(GpuallocError):
    """The request could be placed on an idle host, but the GPUs it needs are held now."""

    exit_code = ExitCode.BUSY


class NotPermitted(GpuallocError):
    """A user tried to release another user's lease, or to use a queue privilege the system
    configuration does not grant them."""

    exit_code = ExitCode.NOT_PERMITTED


class QueueFull(NotPermitted):
    """The user has ``queue.max_waiting`` jobs waiting already."""

    transient = "QOSMaxJobsPerUserLimit"


class NoSuchLease(GpuallocError):
    """No lease has the given id."""

    exit_code = ExitCode.NO_LEASE


class NoSuchJob(GpuallocError):
    """No submitted job of the caller's has the given id (or the prefix fits several)."""

    exit_code = ExitCode.NO_LEASE


class CommandNotFound(GpuallocError):
    """The job's command is not on PATH (or the path given does not exist)."""

    exit_code = ExitCode.COMMAND_NOT_FOUND


class CommandNotExecutable(GpuallocError):
    """The job's command exists but cannot be executed (no x bit, a directory, bad format)."""

    exit_code = ExitCode.NOT_EXECUTABLE


class WaitTimedOut(GpuallocError):
    """``--wait`` gave up at ``--timeout``."""

    exit_code = ExitCode.TIMEOUT


class Interrupted(GpuallocError):
    """Ctrl-C while gpualloc waited; the message says for what and what it left."""

    exit_code = ExitCode.INTERRUPTED


class TraceError(GpuallocError):
    """A simulation trace or generator spec is malformed; names the line and the field."""

    exit_code = ExitCode.TRACE


class ConfigError(GpuallocError):
    """A configuration file or setting is wrong; the message names the file (or variable) and
    the key."""

    exit_code = ExitCode.CONFIG


class BrokerError(GpuallocError):
    """The host's broker is configured but cannot serve this call (see ``ExitCode.BROKER``)."""

    exit_code = ExitCode.BROKER


class BrokerBusy(BrokerError):
    """The user is over the broker's budget of connections or requests for now."""

    transient = "BrokerBusy"
