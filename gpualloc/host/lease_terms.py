"""Who a new lease belongs to and how long it lives: what a request to a
:class:`~gpualloc.host.protocol.Host` carries besides the job, checked once, as the request
is made.

It imports no ledger and no topology: the broker's client builds these terms on the way to
``exec`` (``tests/test_startup_imports.py`` holds what that route may load).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpualloc.errors import RequestError
from gpualloc.model.printable import has_surrogates, lease_command, printable

if TYPE_CHECKING:
    from gpualloc.ledger.schema import LeaseSource
    from gpualloc.model.share import ShareMode

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


class LeaseTerms:
    """Who a new lease belongs to and how long it lives (see ``gpualloc.ledger.schema.Lease``),
    checked as they are made: the name (:func:`lease_name`) and the command, cut to what a
    lease keeps (:func:`~gpualloc.model.printable.lease_command`).

    - ``lock``: take the lease lock now and keep its descriptor open for the job to inherit.
    - ``process_group``: the job's own process group, when it leads one.
    - ``announce``: the lease is unconfirmed until ``Host.confirm`` (after its id was printed).
    - ``shareable``: shared jobs may join the lease's GPUs (``--shareable``); ``memory_bytes``:
      the GPU memory the job declares it uses (``--shareable --mem``); ``share_mode``: how a
      shared job shares its GPU (CUDA MPS when its daemon runs).
    - ``uid``: whose lease it is (the broker names its peer; None: this process's user);
      ``pid_start_time``: ``pid``'s start time when the caller read it already (the broker);
      ``creator``: the process announcing the lease (pid, start time; None: this process).
    - ``lease_id``: the id the new lease gets (None: a new random one; the broker's clients
      choose theirs, so that a request sent again after a lost connection finds its lease).
    - ``time_limit_s``: how long the lease may live, as asked (None: not given, 0: no limit)
      until the host grants it (:meth:`.time_rules.TimeRules.grant`, ``time_granted``), then
      as granted (None: no limit); ``signal``: ``--signal`` (number, seconds before the
      limit, the job's own process alone), which needs a limit.

    A plain class, not a struct: ``run`` through a broker builds one on its way to ``exec``,
    and loads no msgspec for it.
    """

    __slots__ = (
        "announce",
        "command",
        "creator",
        "hold",
        "lease_id",
        "lock",
        "memory_bytes",
        "name",
        "pid",
        "pid_start_time",
        "process_group",
        "share_mode",
        "shareable",
        "signal",
        "source",
        "time_granted",
        "time_limit_s",
        "uid",
    )  # fmt: skip

    def __init__(
        self,
        source: LeaseSource,
        pid: int | None = None,
        hold: bool = False,
        lock: bool = False,
        command: tuple[str, ...] = (),
        name: str | None = None,
        process_group: int | None = None,
        announce: bool = False,
        shareable: bool = False,
        memory_bytes: int | None = None,
        share_mode: ShareMode = "time-sliced",
        uid: int | None = None,
        pid_start_time: float | None = None,
        creator: tuple[int, float | None] | None = None,
        lease_id: str | None = None,
        time_limit_s: float | None = None,
        signal: tuple[int, float, bool] | None = None,
    ) -> None:
        self.source: LeaseSource = source
        self.pid = pid
        self.hold = hold
        self.lock = lock
        self.command: tuple[str, ...] = lease_command(command)
        self.name = lease_name(name)
        self.process_group = process_group
        self.announce = announce
        self.shareable = shareable
        self.memory_bytes = memory_bytes
        self.share_mode: ShareMode = share_mode
        self.uid = uid
        self.pid_start_time = pid_start_time
        self.creator = creator
        self.lease_id = lease_id
        self.time_limit_s = time_limit_s
        self.time_granted = False
        self.signal = signal

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"LeaseTerms({shown})"
