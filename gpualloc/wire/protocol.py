"""The broker's wire format: one JSON object per line over a Unix stream socket.

A request is ``{"v": 1, "op": NAME, "args": {...}}``; the broker answers each with
``{"v": 1, "ok": true, "result": {...}}`` or ``{"v": 1, "ok": false, "error": {"code": EXIT,
"message": ..., "hint": ..., "details": [...]}}``, in order, on the same connection (a client
may send many). A waiting ``alloc`` gets ``{"v": 1, "event": "waiting", "status": {...}}``
lines before its answer.

Who asks is never part of a request: the broker reads the peer's uid, gid and pid from the
kernel (``SO_PEERCRED``). A request of another version is answered with an error naming both
versions and the connection is closed; so is one over :data:`MAX_REQUEST_BYTES`.
"""

from __future__ import annotations

import contextlib
import json
import math
from typing import Any

from gpualloc.errors import BrokerError, ExitCode, GpuallocError
from gpualloc.user_files import shown_repr

VERSION = 1
MAX_REQUEST_BYTES = 64 * 1024
"""A request is a few hundred bytes; anything over this is refused and the connection closed."""
REQUEST_DEADLINE_S = 5.0
"""A request begun must be complete within this, or the connection is closed (a slow client
never holds anything of the broker's: it only loses its connection)."""

KEEPALIVE_S = 5.0
"""How often the broker tells a waiting client that it is still waiting, whether or not its
place changed: the client's silence deadline (``host.broker_timeout``) then only runs out on a
broker that is stopped or stalled."""
CHANGES = ("alloc", "confirm", "adopt", "release", "exited", "evict", "gc", "slurm")
"""The operations that change the ledger: not applied once their client has gone."""
OPERATIONS = ("hello", "alloc", "confirm", "adopt", "release", "exited", "evict", "snapshot",
              "gc", "slurm")  # fmt: skip


def request_line(op: str, args: dict[str, Any]) -> bytes:
    return (
        json.dumps({"v": VERSION, "op": op, "args": args}, separators=(",", ":")).encode() + b"\n"
    )


def result_line(result: Any) -> bytes:
    return _line({"v": VERSION, "ok": True, "result": result})


def event_line(event: str, body: Any) -> bytes:
    return _line({"v": VERSION, "event": event, "status": body})


MAX_ERROR_DETAILS = 32
"""The most supporting lines an error answer carries (who holds the GPUs: one line a
lease); the rest are said to be left out, as the embedded ledger's terminal would fold them."""


def error_line(error: GpuallocError) -> bytes:
    body: dict[str, Any] = {
        "code": int(error.exit_code),
        "message": error.message,
        "hint": error.hint,
    }
    if error.transient is not None:
        body["transient"] = error.transient
    details = error.details
    if details:
        shown = list(details[:MAX_ERROR_DETAILS])
        if len(details) > MAX_ERROR_DETAILS:
            shown.append(f"... and {len(details) - MAX_ERROR_DETAILS} more")
        body["details"] = shown
    return _line({"v": VERSION, "ok": False, "error": body})


def _line(body: dict[str, Any]) -> bytes:
    """One answer or event line, as the broker writes it: msgspec's encoder (a tenth of the
    broker's time went to :mod:`json`'s), whose output :func:`json.loads` reads alike. A text
    holding a lone surrogate, which it cannot encode, goes through :mod:`json` (escaped). Only
    the broker calls this: its clients import no msgspec."""
    import msgspec

    try:
        return msgspec.json.encode(body, enc_hook=str) + b"\n"
    except UnicodeEncodeError:
        return json.dumps(body, separators=(",", ":"), default=str).encode() + b"\n"


def error_from(body: dict[str, Any]) -> GpuallocError:
    """The error an answer carries, as the exception the embedded ledger would have raised
    (the same exit code, message, hint and supporting lines, and whether it is transient)."""
    error = body.get("error") or {}
    code = error.get("code", ExitCode.INTERNAL)
    message = str(error.get("message", "the broker gave no reason"))
    hint = error.get("hint")
    sent = error.get("details")
    details = (
        tuple(str(line) for line in sent[: MAX_ERROR_DETAILS + 1]) if isinstance(sent, list) else ()
    )
    found = _error_of_code(code, message, hint, details)
    transient = error.get("transient")
    if isinstance(transient, str):
        found.transient = transient[:64]
    return found


def _error_of_code(
    code: object, message: str, hint: str | None, details: tuple[str, ...]
) -> GpuallocError:
    from gpualloc import errors

    for kind in vars(errors).values():
        if (
            isinstance(kind, type)
            and issubclass(kind, GpuallocError)
            and kind.__dict__.get("exit_code") == code
        ):
            return kind(message, hint=hint, details=details)
    found = GpuallocError(message, hint=hint, details=details)
    if isinstance(code, int):
        with contextlib.suppress(ValueError):
            found.exit_code = ExitCode(code)
    return found


class _NotJson(ValueError):
    """What Python's :mod:`json` reads but JSON (RFC 8259, section 6) has not: ``NaN``,
    ``Infinity``, and numbers past a double (``1e400``, read as infinity)."""


def _no_constant(name: str) -> float:
    raise _NotJson(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotJson(f"{shown_repr(text)} is past the largest number")
    return value


def parse_request(line: bytes) -> tuple[str, dict[str, Any]]:
    """``(op, args)`` of one request line; :class:`BrokerError` for anything else. Strict
    JSON: a ``NaN`` or an infinity would pass every bound it meets (a wait with a ``NaN``
    timeout never ended), and a document nested past Python's recursion is refused, not a
    RecursionError (tests/test_fuzz_broker.py walks every bound)."""
    try:
        body = json.loads(line, parse_constant=_no_constant, parse_float=_finite)
    except _NotJson as bad:
        raise BrokerError(f"the request is not JSON: {bad}", hint="see RFC 8259") from None
    except RecursionError:
        raise BrokerError(
            "the request is not JSON a broker reads: it is nested too deep",
            hint="see gpualloc.wire.protocol",
        ) from None
    except (ValueError, UnicodeDecodeError):
        raise BrokerError(
            "the request is not JSON", hint="speak the broker's protocol (gpualloc.broker)"
        ) from None
    if not isinstance(body, dict):
        raise BrokerError("the request is not a JSON object", hint="see gpualloc.wire.protocol")
    version = body.get("v")
    if version != VERSION:
        raise VersionMismatch(
            f"this broker speaks protocol {VERSION}, the client {shown_repr(version)}",
            hint="run the same gpualloc version as the host's broker (pip show gpualloc; "
            "'gpualloc doctor' names the broker's)",
        )
    op, args = body.get("op"), body.get("args", {})
    if op not in OPERATIONS:
        raise BrokerError(
            f"unknown request {shown_repr(op)}", hint=f"the broker answers {', '.join(OPERATIONS)}"
        )
    if not isinstance(args, dict):
        raise BrokerError(
            f"the {op} request's arguments are not a JSON object",
            hint="see gpualloc.wire.protocol",
        )
    return op, args


class VersionMismatch(BrokerError):
    """Client and broker speak different protocol versions: the connection is closed."""
