"""What a broker client may send, checked as if hostile (:mod:`.service` acts on it).

Every value from a client is decoded into the ledger's own validated structs or bounded here:
the job as the :class:`~gpualloc.model.job.JobOptions` both clients send, lease ids as 12 hex
digits, commands and names by length, counts as positive integers. A client can name only
what it could have typed.

Text follows the command line's rule (:mod:`gpualloc.host.terms`): JSON may carry a lone
surrogate (``"\\udcff"``), which the ledger could never read back (UTF-8 cannot encode it); a name
or a lease id holding one is refused, a command's words are kept with it escaped.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any

import msgspec

from gpualloc.durations import seconds_given as duration
from gpualloc.errors import RequestError
from gpualloc.host.lease_terms import MAX_WORD_CHARS
from gpualloc.host.queue_policy import QueuePolicy, WaitOptions
from gpualloc.job_options import PATTERN_NAMES
from gpualloc.model.printable import has_surrogates, lease_command, printable
from gpualloc.placement.want import Want
from gpualloc.user_files import shown_repr

if TYPE_CHECKING:
    from gpualloc.config import Config

_ID = re.compile(r"^[0-9a-f]{12}$")


def options_want(raw: Any, config: Config) -> Want:
    """The Want of a client's job: the :class:`~gpualloc.model.job.JobOptions` it was made of
    (as the command line types them, or the Python API's values), its bounds checked when it
    is decoded, with the client's configured policy; a pattern read from a file comes as its
    name and ``edges``, never a path to open."""
    from gpualloc.model.job import JobOptions
    from gpualloc.placement.options import want_of

    fields = dict(raw) if isinstance(raw, dict) else raw
    edges = fields.pop("edges", None) if isinstance(fields, dict) else None
    try:
        options = msgspec.convert(fields, JobOptions)
        if edges is not None:
            edges = msgspec.convert(edges, tuple[tuple[int, int], ...])
    except msgspec.ValidationError as bad:
        raise RequestError(f"bad options: {bad}", hint="see gpualloc.broker") from None
    except UnicodeEncodeError:  # a lone surrogate in a text (the fuzzer found it)
        raise RequestError(
            "bad options: a text is not valid UTF-8", hint="see gpualloc.broker"
        ) from None
    if options.policy is None:
        raise RequestError("bad options: no policy (the client's own)", hint="see gpualloc.broker")
    if has_surrogates(options.pattern):  # a sent pattern's name is kept in the lease
        raise RequestError("bad options: a text is not valid UTF-8", hint="see gpualloc.broker")
    if edges is None and options.pattern not in PATTERN_NAMES:  # root would read it for them
        raise RequestError(
            f"pattern {printable(options.pattern, 60)!r} is not one of "
            f"{', '.join(PATTERN_NAMES)}: the broker opens no file a client names",
            hint="gpualloc reads a pattern file itself and sends its edges",
        )
    return want_of(options, config, edges=edges)


def wait_options(raw: Any, policy: QueuePolicy) -> WaitOptions:
    """A waiting request's options, under the host's queue policy."""
    if not isinstance(raw, dict):
        raise RequestError("wait must be an object", hint="see gpualloc.broker")
    priority = raw.get("priority", "normal")
    if priority not in ("high", "normal", "low"):
        from gpualloc.model.option_values import unknown_choice

        raise unknown_choice("priority", priority, ("high", "normal", "low"))
    bypass = raw.get("max_bypass", policy.min_bypass)
    if not isinstance(bypass, int) or isinstance(bypass, bool) or bypass < 0:
        raise RequestError(f"max_bypass {shown_repr(bypass)} is not a count", hint="0 or more")
    timeout_s = duration(raw.get("timeout_s"), "timeout")
    return WaitOptions(timeout_s=timeout_s, priority=priority, max_bypass=bypass, policy=policy)


def views_asked(raw: Any) -> dict[str, Any] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise RequestError("views must be an object", hint="see gpualloc.broker")
    return raw


def lease_id(raw: Any) -> str:
    if not isinstance(raw, str) or not _ID.match(raw):
        raise RequestError("a lease id is 12 hex digits", hint="let gpualloc choose it")
    return raw


def exit_status(raw: Any) -> int:
    """A job's exit status as ``os.waitstatus_to_exitcode`` gives it: 0 to 255, or minus the
    signal (1 to 64) that ended it."""
    if isinstance(raw, bool) or not isinstance(raw, int) or not -64 <= raw <= 255:
        raise RequestError(
            f"an exit status is 0 to 255, or minus a signal's number, not {shown_repr(raw)}"
        )
    return raw


def words(raw: Any) -> tuple[str, ...]:
    """A command as its lease keeps it (:func:`~gpualloc.model.printable.lease_command`: the
    first words, cut, with bytes that are not UTF-8 escaped), as ``run`` without a broker keeps
    it: a longer command is cut, not refused (the client sends it cut already)."""
    if not isinstance(raw, (list, tuple)):
        raise RequestError("command must be a list of words", hint="see gpualloc.broker")
    return lease_command(str(word) for word in raw)


def text(raw: Any, what: str) -> str | None:
    """A name or a lease selector: short UTF-8 text (a lone surrogate is refused, as
    :func:`~gpualloc.host.lease_terms.lease_name` refuses it)."""
    if raw is None:
        return None
    if not isinstance(raw, str) or len(raw) > MAX_WORD_CHARS:
        raise RequestError(f"{what} must be a short text", hint="see gpualloc.broker")
    if has_surrogates(raw):
        raise RequestError(
            f"{what} '{printable(raw, 60)}' holds bytes that are not UTF-8 text",
            hint=f"give the {what} in UTF-8 text",
        )
    return raw


MAX_SELECTORS = 1024
"""Lease ids or names one ``release`` or ``evict`` may name."""


def selectors(args: dict[str, Any]) -> list[str]:
    """The leases a ``release`` or ``evict`` names (ids, prefixes or names: short texts)."""
    found = args.get("leases") or []
    if not isinstance(found, list) or len(found) > MAX_SELECTORS:
        raise RequestError("leases must be a list of ids", hint="see gpualloc.broker")
    return [text(selector, "lease") or "" for selector in found]


def positive(raw: Any) -> int | None:
    if raw is None:
        return None
    if not isinstance(raw, int) or isinstance(raw, bool) or raw <= 0:
        raise RequestError(
            f"{shown_repr(raw)} is not a positive number", hint="see gpualloc.broker"
        )
    return raw


def lease_signal(raw: Any) -> tuple[int, float, bool] | None:
    """A lease's ``--signal`` as the client sends it: ``[number, seconds before, leader only]``
    (None: none); a RequestError (exit 2) for anything else."""
    if raw is None:
        return None
    import signal

    valid = {s.value for s in signal.valid_signals() if isinstance(s, signal.Signals)}
    if (
        not isinstance(raw, list)
        or len(raw) != 3
        or type(raw[0]) is not int
        or raw[0] not in valid
        or type(raw[2]) is not bool
    ):
        raise RequestError(
            f"signal {shown_repr(raw)} is not [number, seconds, leader only]",
            hint="see gpualloc.broker",
        )
    from gpualloc.time_limits import DEFAULT_SIGNAL_BEFORE_S, MAX_SIGNAL_BEFORE_S

    before = duration(raw[1], "signal's seconds")
    if before is not None and before > MAX_SIGNAL_BEFORE_S:
        raise RequestError(
            f"signal's seconds {shown_repr(raw[1])} is past {MAX_SIGNAL_BEFORE_S:.0f}",
            hint="see gpualloc.broker",
        )
    return raw[0], before if before is not None else DEFAULT_SIGNAL_BEFORE_S, raw[2]


def group_of(pid: int | None) -> int | None:
    try:
        return os.getpgid(pid) if pid is not None else None
    except OSError:
        return None
