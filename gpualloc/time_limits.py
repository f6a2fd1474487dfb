"""A job's time limit as Slurm and gpualloc users write it, read (:func:`parse_time_limit`)
and written (:func:`format_time_limit`).

Slurm's forms (sbatch(1), ``--time``): ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``,
``D-HH:MM``, ``D-HH:MM:SS``; a bare number is minutes, as there, so that a job script moves
to ``sbatch`` unchanged. gpualloc's: a duration with units (``90s``, ``30m``, ``2h``,
``1h30m``, ``1.5d``; :mod:`gpualloc.durations`). ``0``, ``none``, ``UNLIMITED`` and
``INFINITE`` ask for no limit (None). A limit is at most a year
(:data:`gpualloc.durations.MAX_DURATION_S`).

A leaf module: the command line reads limits on its way to ``exec``.
"""

from __future__ import annotations

import re

from gpualloc.durations import DurationTooLong, checked_duration, parse_duration_text

NO_LIMIT = ("0", "none", "unlimited", "infinite")
"""What asks for no time limit (Slurm's ``0``, ``UNLIMITED`` and ``INFINITE``)."""
EXAMPLES = "e.g. 30 (minutes), 1:30:00, 2-12, 2h, 90m, or 0 for none"
_SLURM = re.compile(
    r"(?:(?P<days>\d+)-(?P<d_hours>\d+)(?::(?P<d_minutes>\d+)(?::(?P<d_seconds>\d+))?)?)"
    r"|(?:(?P<hours>\d+):(?P<h_minutes>\d+):(?P<h_seconds>\d+))"
    r"|(?:(?P<minutes>\d+)(?::(?P<m_seconds>\d+))?)"
)


def parse_time_limit(text: str) -> float | None:
    """Seconds (None: no limit); ValueError with the forms when ``text`` is none of them."""
    cleaned = text.strip().lower()
    if cleaned in NO_LIMIT:
        return None
    if re.fullmatch(r"\d*\.\d*", cleaned):  # a bare number is minutes, and whole, in Slurm
        from gpualloc.user_files import shown_value

        raise ValueError(
            f"{shown_value(text)} is not a time limit: a number alone is whole minutes "
            "(Slurm's MM); give a unit for a fraction (90s, 1.5m)"
        )
    found = _SLURM.fullmatch(cleaned)
    if found is None:
        try:
            seconds = parse_duration_text(cleaned)
        except DurationTooLong:
            raise
        except ValueError:
            from gpualloc.user_files import shown_value

            raise ValueError(f"{shown_value(text)} is not a time limit ({EXAMPLES})") from None
    else:
        parts = {key: int(value) for key, value in found.groupdict().items() if value}
        seconds = float(
            (parts.get("days", 0) * 24 + parts.get("d_hours", 0) + parts.get("hours", 0)) * 3600
            + (parts.get("d_minutes", 0) + parts.get("h_minutes", 0) + parts.get("minutes", 0)) * 60
            + parts.get("d_seconds", 0)
            + parts.get("h_seconds", 0)
            + parts.get("m_seconds", 0)
        )
        seconds = checked_duration(seconds, text)
    if seconds == 0:
        return None
    return seconds


def format_time_limit(seconds: float | None) -> str:
    """``seconds`` as Slurm's ``squeue`` shows a limit: ``MM:SS``, ``H:MM:SS``,
    ``D-HH:MM:SS``; ``UNLIMITED`` for None. :func:`parse_time_limit` reads it back (to the
    second)."""
    if seconds is None:
        return "UNLIMITED"
    whole = round(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    if hours:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{minutes}:{secs:02d}"


DEFAULT_SIGNAL_BEFORE_S = 60.0
"""How long before the time limit ``--signal SIG`` is sent when no ``@SECONDS`` is given
(Slurm's default)."""
MAX_SIGNAL_BEFORE_S = 65535.0
"""The most seconds ``@SECONDS`` may say (Slurm's bound)."""
SIGNAL_FORMS = "e.g. USR1, SIGUSR1@120, 10@30, B:USR1@60"


def parse_signal(text: str) -> tuple[int, float, bool]:
    """``--signal [{R|B}:]SIG[@SECONDS]`` as Slurm's sbatch(1) reads it: the signal's number,
    how long before the limit it is sent, and whether only the job's own process gets it
    (``B:``, Slurm's batch shell alone; else its whole process group). ValueError otherwise."""
    import signal

    from gpualloc.user_files import shown_value

    where, _, spec = text.strip().rpartition(":")
    if where.upper() not in ("", "R", "B"):
        raise ValueError(
            f"{shown_value(text)}: {shown_value(where)} is not R or B ({SIGNAL_FORMS})"
        )
    name, at, seconds = spec.partition("@")
    before = DEFAULT_SIGNAL_BEFORE_S
    if at:
        if not seconds.isdigit() or not 0 <= int(seconds) <= MAX_SIGNAL_BEFORE_S:
            raise ValueError(
                f"{shown_value(text)}: @{shown_value(seconds)} is not a number of seconds from "
                f"0 to {MAX_SIGNAL_BEFORE_S:.0f}"
            )
        before = float(seconds)
    upper = name.upper()
    if upper.isdigit():
        number = int(upper)
    else:
        member = signal.Signals.__members__.get(upper if upper.startswith("SIG") else "SIG" + upper)
        number = member.value if member is not None else 0
    if number not in {s.value for s in signal.valid_signals() if isinstance(s, signal.Signals)}:
        said = (
            shown_value(text)
            if name == text.strip()
            else f"{shown_value(text)}: {shown_value(name)}"
        )
        raise ValueError(f"{said} is not a signal ({SIGNAL_FORMS})")
    return number, before, where.upper() == "B"
