"""Values as people type them on a command line: GPU lists, memory sizes, durations, MIG
devices. Pure; each error names the option it came from and shows an example."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from gpualloc.errors import GpuallocError, RequestError
from gpualloc.user_files import shown_text, shown_value

if TYPE_CHECKING:
    from gpualloc.model.mig import MigRequest


def parse_duration(text: str, option: str = "--timeout") -> float:
    """``90``, ``30s``, ``5m``, ``2h``, ``1h30m``, ``1.5h`` -> seconds."""
    from gpualloc.durations import DurationTooLong, parse_duration_text

    try:
        return parse_duration_text(text)
    except DurationTooLong as exc:
        raise RequestError(f"{option} {exc}") from None  # it says the most: no hint to add
    except ValueError:
        raise RequestError(
            f"{option} {shown_value(text)} is not a duration", hint=DURATION_HINT
        ) from None


DURATION_HINT = "a number of seconds, or numbers with units s, m, h and d, as in 1h30m or 1.5d"
"""What a duration is, for its error: the units, which the options' help shows only by example
(a hint of examples repeated the help)."""


def unknown_choice(
    what: str,
    value: object,
    choices: Iterable[str],
    *,
    error: type[GpuallocError] = RequestError,
    details: tuple[str, ...] = (),
) -> GpuallocError:
    """``unknown WHAT 'value': not one of a, b, c``: the choices in the error itself, and as
    the hint only what the option's help cannot say, the choice closest to what was typed
    (a hint that listed them repeated the help: tests/test_bad_input_options.py)."""
    import difflib

    names = list(choices)
    close = difflib.get_close_matches(str(value), names, n=1) if isinstance(value, str) else []
    text = str(value)  # far longer than any choice, it is no near miss: its start will do
    quoted = shown_value(text) if len(text) <= 40 else repr(f"{text[:37]}...")
    return error(
        f"unknown {what} {quoted}: not one of {', '.join(names)}",
        hint=f"did you mean {close[0]}?" if close else None,
        details=details,
    )


def gpu_list(text: str | None, option: str) -> frozenset[int]:
    """A ``0,2,4-7`` list of GPU indices, or a usage error naming ``option``."""
    return frozenset(gpu_sequence(text, option))


def gpu_sequence(text: str | None, option: str) -> tuple[int, ...]:
    """Like :func:`gpu_list`, keeping the order given (``3,1`` is not ``1,3``).

    Bounded before it is expanded: an index at or above
    :data:`~gpualloc.job_options.MAX_GPUS`, or a list naming more than that many GPUs, is a
    usage error computed from the ranges' ends; the host's own count is checked where the
    topology is known."""
    from gpualloc.job_options import MAX_GPUS
    from gpualloc.model.cpuset import cpulist_ranges, is_cpulist

    if text is None or text.strip() == "":
        return ()
    parts = [part.strip() for part in text.split(",")]
    if not all(is_cpulist(part) for part in parts):
        raise RequestError(
            f"{option} {_short(text)} is not a GPU list",
            hint=f"write indices and ranges, e.g. {option} 0,2,4-7",
        )
    try:
        ranges = [cpulist_ranges(part, bound=MAX_GPUS, what="GPU index")[0] for part in parts]
    except ValueError as exc:
        raise RequestError(
            f"{option} {_short(text)}: {exc}", hint=f"e.g. {option} 0,2,4-7"
        ) from None
    named = sum(last - first + 1 for first, last in ranges)
    if named > MAX_GPUS:
        raise RequestError(
            f"{option} {_short(text)} names {named} GPUs, more than a host has "
            f"(at most {MAX_GPUS})",
            hint=f"e.g. {option} 0,2,4-7",
        )
    return tuple(g for first, last in ranges for g in range(first, last + 1))


def _short(text: str) -> str:
    """``text`` quoted, cut to a length an error line can show."""
    return repr(text) if len(text) <= 60 else repr(text[:60]) + f"... ({len(text)} characters)"


MAX_SIZE_BYTES = 2**50
"""A PiB: more than any GPU's memory for a long while."""
_SIZE_UNITS = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def parse_size(text: str, option: str) -> int:
    """``10G``, ``4.5GiB``, ``512M``, ``20GB``, ``4096B`` -> bytes (K/M/G/T are binary, as
    nvidia-smi's MiB). A bare number is refused: ``--mem 8`` would mean 8 bytes, surely never what
    was asked (tests/test_bad_input_options.py::test_mem_without_a_unit_is_refused)."""
    if re.fullmatch(r"\s*\d+(?:\.\d+)?\s*", text):
        number = shown_text(text.strip())
        raise RequestError(
            f"{option} {shown_value(text.strip())} has no unit",
            hint=f"give one: {option} {number}G (GiB), {number}M (MiB) or {number}B (bytes)",
        )
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*", text.upper())
    value = float(match[1]) * _SIZE_UNITS[match[2]] if match else 0.0
    if value < 1:
        raise RequestError(
            f"{option} {shown_value(text)} is not a memory size",
            hint="a number and a unit, K, M, G or T (powers of 1024), with or without B or iB",
        )
    if value > MAX_SIZE_BYTES:  # 400 digits were infinity, and int() of it an internal error
        raise RequestError(f"{option} {shown_value(text)} is more memory than any GPU has")
    return int(value)


def mig_request(mig: str | None, memory_bytes: int | None) -> MigRequest:
    """``--mig PROFILE|GPU0/MIG3|MIG-uuid`` and ``--mem``'s bytes -> the MIG request."""
    from gpualloc.model.mig import MigRequest, parse_mig_label, parse_mig_profile

    if mig is None:
        return MigRequest(memory_bytes=memory_bytes)
    text = mig.strip()
    if text.upper().startswith("MIG-"):
        return MigRequest(uuid=text, memory_bytes=memory_bytes)
    if (device := parse_mig_label(text)) is not None:
        return MigRequest(device=device, memory_bytes=memory_bytes)
    try:
        return MigRequest(profile=parse_mig_profile(text).name, memory_bytes=memory_bytes)
    except ValueError:
        raise RequestError(
            f"--mig {shown_value(mig)} is neither a MIG profile nor a MIG device",
            hint="a profile is named <compute slices>g.<memory>gb, as nvidia-smi -L names it",
        ) from None
