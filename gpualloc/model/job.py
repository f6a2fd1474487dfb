"""What describes a job, as one typed struct: what ``plan``, ``run``, ``alloc`` and the
Python API take and the broker's client sends (every field), its bounds checked when it is made
(house style: the job request and its bounds are pure data, in ``model/``).

The command line fills it with the option values as typed (``exclude="0,2-3"``,
``mem="10G"``); the Python API with the same names and Python values (``exclude=(0, 2, 3)``,
``mem=10 * 2**30``). :func:`gpualloc.placement.options.want_of` turns it into the placement
engine's request.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from typing import Any

from msgspec import Struct

from gpualloc.errors import RequestError
from gpualloc.job_options import MAX_GPUS, JobOption, job_fields
from gpualloc.model.job_fields import GpuList, declared_memory_bytes, memory_bytes


class JobOptions(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What describes a job (see the module docstring): one field per ``job`` row of
    :data:`gpualloc.job_options.JOB_OPTIONS`, in the table's order, named as on the command
    line, with the row's default (``tests/test_job_options.py`` holds the two equal; the rows
    stay the one description of the options' spellings, help and bounds). Bounds (``-n`` at
    least 1, ``--min-utility`` within 0..1, ...) are checked when it is made, whoever makes it:
    the command line, the Python API or the broker (which decodes a client's options into it,
    unknown fields refused)."""

    count: int | None = None
    pattern: str = "ring"
    sensitive: bool | None = None
    exclude: GpuList = None
    require: GpuList = None
    policy: str | None = None
    score: str = "auto"
    drb_weights: str | tuple[float, float, float] | None = None
    gpus: GpuList = None
    min_utility: float | None = None
    min_bandwidth: float | None = None
    mig: str | None = None
    mem: str | int | None = None
    share: bool = False
    shareable: bool = False
    background: bool = False
    sm_share: int | None = None

    def __post_init__(self) -> None:
        check_bounds(self, _ROWS)

    @classmethod
    def pick(cls, values: Mapping[str, Any]) -> tuple[JobOptions, dict[str, Any]]:
        """The job's options out of a command's option values, and the rest (the command's
        own: ``--numa``, ``--wait``, ...)."""
        fields = set(cls.__struct_fields__)
        job = cls(**{key: value for key, value in values.items() if key in fields})
        return job, {key: value for key, value in values.items() if key not in fields}

    def memory_bytes(self) -> int | None:
        """``mem`` in bytes, or None."""
        return memory_bytes(self.mem)

    def declared_memory_bytes(self) -> int | None:
        """The memory a ``--shareable`` job declares it uses (``--mem``), else None."""
        return declared_memory_bytes({"mem": self.mem, "shareable": self.shareable})


_ROWS = job_fields()


def check_bounds(values: object, rows: tuple[JobOption, ...]) -> None:
    """Refuse a number outside its row's bounds, a bool where a number belongs, or a number
    that is not finite (the API and the wire reach here without the command line's checks)."""
    for row in rows:
        value = getattr(values, row.dest)
        if value is None or row.kind not in ("int", "float"):
            continue
        option = row.spellings[0]
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or (row.kind == "int" and not isinstance(value, int)):
            raise RequestError(f"{option} {value!r} is not {_a(row.kind)}", hint=row.help)
        if isinstance(value, float) and not math.isfinite(value):  # said without 'inf' or 'nan':
            what = "is not a number" if math.isnan(value) else "is too large (not finite)"
            raise RequestError(f"{option} {what}", hint=row.help)  # 1e309 was said back 'inf'

        low, high = row.minimum, row.maximum
        if (low is not None and value < low) or (high is not None and value > high):
            span = f"at least {low:g}" if high is None else f"{low:g} to {high:g}"
            raise RequestError(
                f"{option} {_shown(value)} is out of range ({span})", hint=f"give {span}"
            )


def _shown(value: float) -> str:
    """``value`` for an error line: a 5,000-digit int is neither printable (CPython refuses
    ``str`` past 4,300 digits) nor worth printing."""
    if isinstance(value, int) and abs(value) >= 10**40:
        return f"({'-' if value < 0 else ''}a {value.bit_length()}-bit number)"
    return repr(value)


def _a(kind: str) -> str:
    return "a whole number" if kind == "int" else "a number"


def gpu_indices(values: Iterable[int], option: str) -> tuple[int, ...]:
    """The API's indices (any iterable, even ``range(10**17)`` or an endless generator), read
    no further than :data:`~gpualloc.job_options.MAX_GPUS` of them, as a typed list is
    bounded (``tests/test_hostile_numbers.py``)."""
    taken = tuple(int(g) for g in itertools.islice(values, MAX_GPUS + 1))
    if len(taken) > MAX_GPUS:
        raise RequestError(
            f"{option} names more GPUs than a host has (at most {MAX_GPUS})",
            hint="name each GPU once, e.g. gpus=[0, 1]",
        )
    return taken
