"""Durations as people write them: ``90``, ``30s``, ``5m``, ``2h``, ``1h30m``, ``1.5h``."""

from __future__ import annotations

import re

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration_text(text: str) -> float:
    """Seconds; ValueError naming the examples when ``text`` is not a duration."""
    cleaned = text.strip().lower()
    parts = re.findall(r"(\d+(?:\.\d+)?)([smhd]?)", cleaned)
    if not parts or "".join(n + u for n, u in parts) != cleaned:
        raise ValueError(f"{text!r} is not a duration (e.g. 90, 30s, 5m, 1h30m)")
    return sum(float(number) * _UNITS[unit] for number, unit in parts)
