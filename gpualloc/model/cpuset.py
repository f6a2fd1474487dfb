"""CPU and node lists in the kernel's ``cpulist`` syntax (``0-19,40-59``).

A list is checked arithmetically before it is expanded: ``0-99999999999``
is refused from its two numbers, never by building a set of 10**11 ids, so the work of a list is
bounded by its text plus :data:`CPU_ID_BOUND`, whoever wrote it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from gpualloc.user_files import shown_value

_CPULIST = r"^\d+(-\d+)?(,\d+(-\d+)?)*$"
"""Compiled by :mod:`re` when first used: only binding to a host's NUMA nodes reads a cpulist."""

CPU_ID_BOUND = 65536
"""CPU and NUMA node ids in a cpulist are below this. Linux's largest ``CONFIG_NR_CPUS`` is 8192
(``NR_CPUS_RANGE_END`` of x86_64 with ``CPUMASK_OFFSTACK``; arm64 allows 4096), so ids from a
real host fit with 8x room, and no list expands to more than 65,536 ids."""


def is_cpulist(text: str) -> bool:
    """True if ``text`` is a non-empty cpulist such as ``3``, ``0-19,40-59`` or ``0,2,4``."""
    return bool(re.match(_CPULIST, text.strip()))


def cpulist_ranges(
    text: str, *, bound: int = CPU_ID_BOUND, what: str = "CPU id"
) -> list[tuple[int, int]]:
    """``"0-2,8"`` -> ``[(0, 2), (8, 8)]``, each range checked before anything is expanded.

    Raises ``ValueError`` on a malformed list, a range that runs backwards, or a number at or
    above ``bound`` (``what`` names the numbers in that message: ``CPU id``, ``GPU index``).
    """
    text = text.strip()
    if not is_cpulist(text):
        raise ValueError(f"not a CPU list: {shown_value(text)}")
    ranges: list[tuple[int, int]] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        first, last = (
            bounded_id(low, bound=bound, what=what),
            bounded_id(high or low, bound=bound, what=what),
        )
        if last < first:
            raise ValueError(f"the range {shown_value(part)} runs backwards (write {last}-{first})")
        ranges.append((first, last))
    return ranges


def bounded_id(digits: str, *, bound: int = CPU_ID_BOUND, what: str = "CPU id") -> int:
    """The number ``digits`` spells; ``ValueError`` (naming ``what``) unless below ``bound``."""
    # Compare lengths first: int() of a 100,000-digit string is slow, and CPython refuses it.
    significant = digits.lstrip("0") or "0"
    if len(significant) > len(str(bound)) or int(significant) >= bound:
        raise ValueError(f"{what} {_short(digits)} is too large (at most {bound - 1})")
    return int(significant)


def _short(digits: str) -> str:
    return digits if len(digits) <= 20 else f"{digits[:20]}... ({len(digits)} digits)"


def parse_cpulist(text: str, *, bound: int = CPU_ID_BOUND, what: str = "CPU id") -> list[int]:
    """``"0-2,8"`` -> ``[0, 1, 2, 8]``. Raises ``ValueError`` on anything else, and on an id
    at or above ``bound`` (see :func:`cpulist_ranges`) before expanding any range."""
    ids: set[int] = set()
    for first, last in _merged(cpulist_ranges(text, bound=bound, what=what)):
        ids.update(range(first, last + 1))
    return sorted(ids)


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Overlapping and adjacent ranges joined, so ``0-9999,0-9999,...`` expands once."""
    merged: list[tuple[int, int]] = []
    for first, last in sorted(ranges):
        if merged and first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return merged


def format_cpulist(cpus: Iterable[int]) -> str:
    """``[0, 1, 2, 8]`` -> ``"0-2,8"``; the empty set is ``""``."""
    return format_ranks(sorted(set(cpus)))


def format_ranks(ids: Iterable[int]) -> str:
    """A job's GPUs in rank order: ``[3, 1]`` -> ``"3,1"``, ``[4, 5, 6, 7, 0, 1]`` ->
    ``"4-7,0-1"`` (a range only where the order rises by one). ``run --gpus 3,1`` must not say
    ``GPU 1,3`` while rank 0 runs on GPU 3
    (tests/test_terminal_output.py::test_run_announces_its_gpus_in_rank_order)."""
    runs: list[str] = []
    start = prev = None
    for index in ids:
        if prev is not None and index == prev + 1:
            prev = index
            continue
        if start is not None:
            runs.append(_run(start, prev))
        start = prev = index
    if start is not None:
        runs.append(_run(start, prev))
    return ",".join(runs)


def _run(start: int, end: int | None) -> str:
    return str(start) if start == end else f"{start}-{end}"
