"""CPU and node lists in the kernel's ``cpulist`` syntax (``0-19,40-59``)."""

from __future__ import annotations

import re
from collections.abc import Iterable

_CPULIST = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")


def is_cpulist(text: str) -> bool:
    """True if ``text`` is a non-empty cpulist such as ``3``, ``0-19,40-59`` or ``0,2,4``."""
    return bool(_CPULIST.match(text.strip()))


def parse_cpulist(text: str) -> list[int]:
    """``"0-2,8"`` -> ``[0, 1, 2, 8]``. Raises ``ValueError`` on anything else."""
    text = text.strip()
    if not is_cpulist(text):
        raise ValueError(f"not a CPU list: {text!r}")
    cpus: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        first, last = int(low), int(high or low)
        if last < first:
            raise ValueError(f"the range {part!r} runs backwards (write {last}-{first})")
        cpus.update(range(first, last + 1))
    return sorted(cpus)


def format_cpulist(cpus: Iterable[int]) -> str:
    """``[0, 1, 2, 8]`` -> ``"0-2,8"``; the empty set is ``""``."""
    ordered = sorted(set(cpus))
    runs: list[str] = []
    start = prev = None
    for cpu in ordered:
        if prev is not None and cpu == prev + 1:
            prev = cpu
            continue
        if start is not None:
            runs.append(_run(start, prev))
        start = prev = cpu
    if start is not None:
        runs.append(_run(start, prev))
    return ",".join(runs)


def _run(start: int, end: int | None) -> str:
    return str(start) if start == end else f"{start}-{end}"
