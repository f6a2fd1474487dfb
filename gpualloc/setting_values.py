"""What a configuration value may be: each parser takes what TOML or a variable gave and
returns the value (a ValueError saying what it must be otherwise). :mod:`gpualloc.config`'s
settings name one each. A leaf, as the configuration is."""

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpualloc.durations import checked_duration, parse_duration_text


def choice(*allowed: str) -> Callable[[Any], Any]:
    def parse(value: Any) -> str:
        if value not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)}")
        return value

    return parse


def boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError("must be true or false")


MAX_COUNT = 10**9
"""The largest count a setting takes: more connections, jobs or bypasses than a host ever sees,
and small enough for every C interface a count reaches."""


def count_value(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("must be a whole number >= 0")
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: inf in TOML
        raise ValueError("must be a whole number >= 0") from None
    if number < 0 or (isinstance(value, float) and value != number):
        raise ValueError("must be a whole number >= 0")
    if number > MAX_COUNT:
        raise ValueError(f"must be at most {MAX_COUNT}")
    return number


class Refused(ValueError):
    """A bad value, with the hint that says what to give instead."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.hint = hint


def path_value(value: Any) -> Path:
    if not isinstance(value, (str, Path)) or not str(value).strip():
        raise ValueError("must be a path")
    from gpualloc.user_files import expand_user

    return expand_user(str(value))


def absolute_path(value: Any) -> Path:
    """A path every process reads alike: a relative one would be taken from each process's
    working directory, so two shells would keep two ledgers and hand out one GPU twice."""
    path = path_value(value)
    if not path.is_absolute():
        raise Refused(
            "must be an absolute path (a relative one names another directory in each working "
            "directory)",
            hint="give an absolute path (one that starts with /)",
        )
    return path


def absolute_path_or_none(value: Any) -> Path | None:
    return None if value in (None, "") else absolute_path(value)


def names_value(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ValueError('must be a list of user names and @groups, e.g. ["alice", "@gpuadmin"]')
    return tuple(v.strip() for v in value)


def duration_or_none(value: Any) -> float | None:
    if isinstance(value, str) and value.strip().lower() in ("", "none", "off"):
        return None
    if isinstance(value, bool):
        raise ValueError('must be a duration such as "2h", "90m" or 3600 (seconds), or "none"')
    if isinstance(value, (int, float)):
        try:
            seconds = checked_duration(float(value), value)  # TOML's nan and inf too
        except OverflowError:  # an integer past any float
            seconds = checked_duration(math.inf, value)
    else:
        seconds = parse_duration_text(str(value))
    if seconds <= 0:
        raise ValueError('must be a positive duration, or "none"')
    return seconds


def duration_or_off(value: Any) -> float:
    """A duration, where 0, "off" or "none" turn the thing it times off (0.0)."""
    if value in (0, "0") or (isinstance(value, str) and value.strip().lower() in ("off", "none")):
        return 0.0
    return duration(value)


def duration(value: Any) -> float:
    seconds = duration_or_none(value)
    if seconds is None:
        raise ValueError('must be a duration such as "30s" or 30')
    return seconds


def percent(value: Any) -> int:
    number = count_value(value)
    if number > 100:
        raise ValueError("must be a percentage, 0 to 100")
    return number


def command_or_none(value: Any) -> str | None:
    if not isinstance(value, str):
        raise ValueError("must be a shell command (a string)")
    return value.strip() or None


def name_value(value: Any) -> str:
    """A policy's name; which names exist, the placement registry checks where it is used."""
    if not isinstance(value, str) or not re.fullmatch(r"[a-z][a-z0-9-]*", value.strip()):
        raise ValueError("must be a policy name such as mapa, drb or pack")
    return value.strip()


def path_or_table(value: Any) -> Path | dict[str, Any]:
    return value if isinstance(value, dict) else path_value(value)


def time_limit_or_none(value: Any) -> float | None:
    """A job's time limit as ``--time`` reads it (:func:`gpualloc.time_limits.parse_time_limit`:
    ``"30"`` is 30 minutes, as in Slurm), or none (``"none"``, ``"0"``). A bare TOML number is
    refused: seconds elsewhere in the file, minutes in Slurm's ``--time``, it would mean one
    thing to one reader and the other to the next."""
    from gpualloc.time_limits import parse_time_limit

    if not isinstance(value, str):
        raise ValueError('must be a time limit in quotes, such as "2h", "1-00" or "none"')
    return parse_time_limit(value)


TIME_LIMIT_KEYS = ("default_time", "max_time", "max_hold")
"""What a ``[limits.users.NAME]`` or ``[limits.groups.NAME]`` table may set."""


def limit_tables(value: Any) -> dict[str, dict[str, float | None]]:
    """``[limits.users.NAME]`` / ``[limits.groups.NAME]`` tables: per name, the time limits
    of :data:`TIME_LIMIT_KEYS` it sets (each as :func:`time_limit_or_none` reads it)."""
    if not isinstance(value, dict):
        raise ValueError("must be tables of names, such as [limits.users.alice]")
    tables: dict[str, dict[str, float | None]] = {}
    for name, table in value.items():
        if not isinstance(table, dict):
            raise ValueError(f"{name}: must be a table, such as [limits.users.{name}]")
        unknown = sorted(set(table) - set(TIME_LIMIT_KEYS))
        if unknown:
            raise ValueError(f"{name}: {unknown[0]} is not one of {', '.join(TIME_LIMIT_KEYS)}")
        try:
            tables[name] = {key: time_limit_or_none(raw) for key, raw in table.items()}
        except ValueError as bad:
            raise ValueError(f"{name}: {bad}") from None
    return tables
