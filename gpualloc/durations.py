"""Durations as people write them: ``90``, ``30s``, ``5m``, ``2h``, ``1h30m``, ``1.5h``; read
(:func:`parse_duration_text`) and written (:func:`format_duration`, :func:`human_duration`)."""

from __future__ import annotations

import math
import re

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


MAX_DURATION_S = 366 * 86400.0
"""The longest duration gpualloc takes (a year): a timeout, a grace or an idle time beyond it
is a slip of the keyboard, and past some 290 years every timer of the operating system
overflows (tests/test_fuzz_findings.py::test_a_broker_timeout_past_any_timer_is_a_config_error)."""


def parse_duration_text(text: str) -> float:
    """Seconds; ValueError naming the examples when ``text`` is not a duration."""
    from gpualloc.user_files import shown_value

    cleaned = text.strip().lower()
    parts = re.findall(r"(\d+(?:\.\d+)?)([smhd]?)", cleaned)
    if not parts or "".join(n + u for n, u in parts) != cleaned:
        raise ValueError(f"{shown_value(text)} is not a duration (e.g. 90, 30s, 5m, 1h30m)")
    return checked_duration(sum(float(number) * _UNITS[unit] for number, unit in parts), text)


class DurationTooLong(ValueError):
    """A duration past :data:`MAX_DURATION_S` (or not a number of seconds at all: NaN)."""


def checked_duration(seconds: float, given: object) -> float:
    """``seconds``, refused (:class:`DurationTooLong`) when it is not finite or longer than
    :data:`MAX_DURATION_S`; ``given`` is what the user wrote."""
    if math.isfinite(seconds) and seconds <= MAX_DURATION_S:
        return seconds
    from gpualloc.user_files import shown_value

    if isinstance(given, float) and not math.isfinite(given):  # TOML's nan and inf
        raise DurationTooLong(f"{shown_value(given)} is not a finite duration")
    raise DurationTooLong(f"{shown_value(given)} is longer than a year (366d), the most it may be")


def seconds_given(raw: object, what: str) -> float | None:
    """A duration a program gave in seconds (a broker request's wait timeout or eviction
    grace, :func:`gpualloc.api.hold`'s ``timeout_s``): None, or a number from 0 to
    :data:`MAX_DURATION_S`, as the command line takes one; a RequestError (exit 2) for
    anything else. A broker's wait with a timeout of ``10**400`` was an internal error that
    left its waiter queued, one that was not a number no timeout at all
    (tests/test_fuzz_broker.py)."""
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 0 <= raw <= MAX_DURATION_S:
        from gpualloc.errors import RequestError
        from gpualloc.user_files import shown_value

        raise RequestError(
            f"{what} {shown_value(raw)} is not a duration",
            hint=f"seconds, from 0 to {MAX_DURATION_S:.0f} (366 days)",
        )
    return float(raw)


def format_duration(seconds: float) -> str:
    """``seconds`` as a config file or an option would write it: ``15m``, ``1h30m``, ``30s``,
    ``0.015s`` (:func:`parse_duration_text` reads it back)."""
    whole = math.floor(seconds)
    fraction = round(seconds - whole, 6)
    parts = []
    rest = whole
    for unit in ("d", "h", "m"):
        count, rest = divmod(rest, int(_UNITS[unit]))
        if count:
            parts.append(f"{count}{unit}")
    if rest + fraction or not parts:
        parts.append(f"{rest + fraction:.6f}".rstrip("0").rstrip(".") + "s")
    return "".join(parts)


def human_duration(seconds: float) -> str:
    """``seconds`` for people, in its two largest units: ``45.2s``, ``24m 43s``, ``2h 05m``,
    ``122d 14h``, never ``10591816.6``; the smaller unit has two
    digits, so that a column of them lines up. ``--json`` keeps seconds."""
    if not math.isfinite(seconds):
        return "n/a"
    if round(seconds, 1) < 60:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    minutes = round(seconds / 60)
    if minutes < 24 * 60:
        return f"{minutes // 60}h {minutes % 60:02d}m"
    hours = round(seconds / 3600)
    return f"{hours // 24}d {hours % 24:02d}h"
