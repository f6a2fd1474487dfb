"""Job traces for ``gpualloc simulate``: JSON Lines or CSV with a header, one job per line.

Columns: ``id``, ``arrival_s``, ``gpus``, ``duration_s`` (the job's time alone on the best GPUs
of its size), ``sensitive`` (required), and optionally ``pattern`` (ring, all, tree, star;
default ring), ``workload`` (a network name: the runtime models look up its measured
sensitivity and, with ``batch``, its DRB profile), ``batch``, ``min_utility`` (postponement,
DRB section 4.4), ``min_bandwidth`` (GB/s: the job waits for a placement predicted at least
this fast, ``--min-bandwidth``) and ``priority`` (high, normal, low). Jobs are simulated in
arrival order; equal arrival times keep the file's order.

Numbers are finite (a JSON ``NaN`` or ``Infinity``, a CSV ``inf``, is refused), times at most
:data:`MAX_SECONDS`; a UTF-8 byte order mark before the first line is skipped.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpualloc.errors import TraceError
from gpualloc.model.printable import printable

REQUIRED = ("id", "arrival_s", "gpus", "duration_s", "sensitive")
OPTIONAL = (
    "pattern", "workload", "batch", "min_utility", "min_bandwidth", "priority", "gpu_fraction",
)  # fmt: skip
PATTERNS = ("ring", "all", "tree", "star")
PRIORITIES = ("high", "normal", "low")
_TRUE = {"true", "1", "yes", "y", "t"}
_FALSE = {"false", "0", "no", "n", "f", ""}
MAX_SECONDS = 1e12
"""The largest arrival time or duration a trace may give (some 30,000 years): sums of them stay
finite."""
SHOWN = 60
"""At most this many characters of a value a user gave are echoed in an error."""
MAX_GPUS = 1_000_000
"""The most GPUs a job of a trace may ask (the host simulated refuses more than it has)."""
BOM = "\ufeff"


def shown(value: object) -> str:
    """``value`` quoted for an error line: control characters escaped, cut to :data:`SHOWN`."""
    return f"'{printable(str(value), SHOWN)}'"


@dataclass(frozen=True)
class SimJob:
    """One job of a trace."""

    id: str
    arrival_s: float
    gpus: int
    duration_s: float
    sensitive: bool
    pattern: str = "ring"
    workload: str | None = None
    batch: int | None = None
    min_utility: float | None = None
    min_bandwidth: float | None = None
    priority: str = "normal"
    gpu_fraction: float | None = None
    """A 1-GPU job asking part of a GPU (0 < f < 1; the Alibaba trace's ``gpu_milli``): with
    ``--sharing`` it is a shared job; without, it holds a whole GPU."""
    order: int = field(default=0, compare=False)
    """Position in the trace (ties in arrival time go in this order)."""

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("order")
        return {k: v for k, v in data.items() if v is not None}


def load_trace(path: Path) -> list[SimJob]:
    """The jobs of a trace file (``.jsonl``/``.json`` or ``.csv``; else sniffed)."""
    from gpualloc.user_files import read_user_text

    return parse_trace(read_user_text(path, "trace", error=TraceError), source=str(path))


def parse_trace(text: str, *, source: str = "<trace>") -> list[SimJob]:
    text = text.removeprefix(BOM)
    stripped = text.lstrip()
    if not stripped:
        raise TraceError(f"{source} holds no job", hint="one job per line; see examples/")
    rows = _json_lines(text, source) if _is_json(stripped) else _csv_rows(text, source)
    jobs = [_job(row, number, source, order) for order, (number, row) in enumerate(rows)]
    if not jobs:
        raise TraceError(f"{source} holds no job", hint="one job per line; see examples/")
    seen: set[str] = set()
    for job in jobs:
        if job.id in seen:
            raise TraceError(f"{source}: job id {shown(job.id)} appears twice")
        seen.add(job.id)
    return sorted(jobs, key=lambda job: (job.arrival_s, job.order))


def write_trace(jobs: list[SimJob]) -> str:
    """JSON Lines, one job per line (what ``--generate`` produces with ``--save-trace``)."""
    return "".join(json.dumps(job.as_dict(), sort_keys=True) + "\n" for job in jobs)


def _is_json(stripped: str) -> bool:
    """Whether a trace is JSON Lines: its first line is an object, or any JSON value (``null``,
    a list: a line no CSV header can be, said wrong as JSON rather than as a CSV header)."""
    if stripped.startswith(("{", "[")):
        return True
    try:
        json.loads(stripped.split("\n", 1)[0], parse_constant=float)
    except (ValueError, RecursionError):
        return False
    return True


def _json_lines(text: str, source: str) -> list[tuple[int, dict[str, Any]]]:
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        try:
            row = json.loads(line, parse_constant=_not_finite)
        except _NotFinite as exc:
            raise TraceError(
                f"{where}: {exc} is not a finite number", hint="a trace's numbers are finite"
            ) from None
        except json.JSONDecodeError as exc:
            raise TraceError(f"{where}: not valid JSON ({exc.msg})") from None
        except ValueError:  # an integer of more digits than Python converts
            raise TraceError(f"{where}: not valid JSON (a number too long)") from None
        except RecursionError:  # a line of 100,000 brackets
            raise TraceError(f"{where}: not valid JSON (nested too deep)") from None
        if not isinstance(row, dict):
            raise TraceError(
                f"{where}: a job is a JSON object, not {_json_kind(row)}",
                hint=f"one object a line, with {', '.join(REQUIRED)}",
            )
        rows.append((number, row))
    return rows


class _NotFinite(Exception):
    """A JSON ``NaN``, ``Infinity`` or ``-Infinity``, which Python's reader would take."""


def _not_finite(name: str) -> float:
    raise _NotFinite(name)


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    kinds: dict[type, str] = {list: "a list", str: "a string"}
    return kinds.get(type(value), "a number")


def _csv_rows(text: str, source: str) -> list[tuple[int, dict[str, Any]]]:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        header = [name.strip() for name in reader.fieldnames or []]
        missing = [name for name in REQUIRED if name not in header]
        if missing:
            raise TraceError(
                f"{source}: the CSV header lacks {', '.join(missing)}",
                hint=f"the first line names the columns: {','.join(REQUIRED)}[,...]",
            )
        reader.fieldnames = header
        return [
            (number, {k: v.strip() for k, v in row.items() if k is not None and v is not None})
            for number, row in enumerate(reader, start=2)
        ]
    except csv.Error as exc:  # a stray carriage return, a NUL byte (found by the fuzzing harness)
        raise TraceError(f"{source}: not CSV ({exc})") from None


def _job(row: dict[str, Any], number: int, source: str, order: int) -> SimJob:
    where = f"{source}:{number}"
    unknown = sorted(set(row) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        raise TraceError(
            f"{where}: unknown column {shown(unknown[0])}",
            hint=f"columns: {', '.join(REQUIRED + OPTIONAL)}",
        )
    for name in REQUIRED:
        if row.get(name) in (None, ""):
            raise TraceError(f"{where}: {name} is missing")
    job = SimJob(
        id=str(row["id"]),
        arrival_s=_number(row["arrival_s"], "arrival_s", where, minimum=0.0, maximum=MAX_SECONDS),
        gpus=int(_number(row["gpus"], "gpus", where, minimum=1, maximum=MAX_GPUS, integer=True)),
        duration_s=_number(
            row["duration_s"], "duration_s", where, minimum=0.0, maximum=MAX_SECONDS
        ),
        sensitive=_bool(row["sensitive"], where),
        pattern=str(row.get("pattern") or "ring"),
        workload=str(row["workload"]) if row.get("workload") not in (None, "") else None,
        batch=(
            int(_number(row["batch"], "batch", where, minimum=1, integer=True))
            if row.get("batch") not in (None, "")
            else None
        ),
        min_utility=(
            _number(row["min_utility"], "min_utility", where, minimum=0.0, maximum=1.0)
            if row.get("min_utility") not in (None, "")
            else None
        ),
        min_bandwidth=(
            _number(row["min_bandwidth"], "min_bandwidth", where, minimum=0.0)
            if row.get("min_bandwidth") not in (None, "")
            else None
        ),
        priority=str(row.get("priority") or "normal"),
        gpu_fraction=(
            _number(row["gpu_fraction"], "gpu_fraction", where, minimum=0.001, maximum=1.0)
            if row.get("gpu_fraction") not in (None, "")
            else None
        ),
        order=order,
    )
    if job.pattern not in PATTERNS:
        raise TraceError(f"{where}: unknown pattern {shown(job.pattern)}", hint=", ".join(PATTERNS))
    if job.gpu_fraction is not None and job.gpus != 1:
        raise TraceError(f"{where}: gpu_fraction is for a 1-GPU job", hint="set gpus to 1")
    if job.priority not in PRIORITIES:
        raise TraceError(
            f"{where}: unknown priority {shown(job.priority)}", hint=", ".join(PRIORITIES)
        )
    return job


def _number(
    value: Any,
    name: str,
    where: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    integer: bool = False,
) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TraceError(f"{where}: {name} {shown(value)} is not a number") from None
    except OverflowError:  # a JSON integer of 400 digits
        number = math.inf
    if not math.isfinite(number):
        raise TraceError(
            f"{where}: {name} {shown(value)} is not a finite number",
            hint="give a number of seconds" if name.endswith("_s") else None,
        )
    if isinstance(value, bool) or (integer and not number.is_integer()):
        raise TraceError(
            f"{where}: {name} {shown(value)} is not {'an integer' if integer else 'a number'}"
        )
    if minimum is not None and number < minimum:
        raise TraceError(f"{where}: {name} {shown(value)} is below {minimum:g}")
    if maximum is not None and number > maximum:
        raise TraceError(f"{where}: {name} {shown(value)} is above {maximum:g}")
    return number


def _bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise TraceError(f"{where}: sensitive {shown(value)} is not true or false")
