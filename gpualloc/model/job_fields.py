"""A job's options as the command line parsed them and the broker's socket carries them: a
typed dict of :class:`~gpualloc.model.job.JobOptions`' fields, which costs no import.

The command line builds one (:func:`pick_fields`) and hands it to
:meth:`gpualloc.host.protocol.Host.start`; the host that places the job makes the
``JobOptions`` of it there, its bounds checked at that door (the embedded ledger in this
process, the broker when it decodes the request). ``run`` through a broker thus never loads
msgspec (``tests/test_startup_imports.py``); ``tests/test_job_options.py`` holds the fields equal to
``JobOptions``' own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gpualloc.job_options import job_fields

GpuList = str | tuple[int, ...] | None
"""A GPU list as a job keeps it: as typed, or the indices (the Python API makes a tuple of any
iterable); a type the broker decodes (msgspec takes no abstract iterable)."""


if TYPE_CHECKING:
    from typing import TypedDict

    class JobFields(TypedDict, total=False):
        """:class:`~gpualloc.model.job.JobOptions`' fields, by name; a field left out takes its
        default."""

        count: int | None
        pattern: str
        sensitive: bool | None
        exclude: GpuList
        require: GpuList
        policy: str | None
        score: str
        drb_weights: str | tuple[float, float, float] | None
        gpus: GpuList
        min_utility: float | None
        min_bandwidth: float | None
        mig: str | None
        mem: str | int | None
        share: bool
        shareable: bool
        background: bool
        sm_share: int | None

else:
    JobFields = dict  # the checker's type; at run time a plain dict: no TypedDict is made

FIELDS = frozenset(row.dest for row in job_fields())
"""The fields' names: the ``job`` rows of :data:`gpualloc.job_options.JOB_OPTIONS`."""


def pick_fields(values: Mapping[str, Any]) -> tuple[JobFields, dict[str, Any]]:
    """The job's fields out of a command's option values, and the rest (the command's own:
    ``--numa``, ``--wait``, ...)."""
    job: JobFields = {key: value for key, value in values.items() if key in FIELDS}  # type: ignore[assignment]
    return job, {key: value for key, value in values.items() if key not in FIELDS}


def memory_bytes(mem: str | int | None) -> int | None:
    """``--mem`` in bytes (a size as typed, or the API's and the wire's bytes), or None."""
    if mem is None:
        return None
    if isinstance(mem, bool) or (isinstance(mem, int) and mem < 1):
        from gpualloc.errors import RequestError

        # The API's and the wire's bytes: none is no memory (the ledger keeps >= 1).
        raise RequestError(f"--mem {mem!r} is not a size", hint="give at least 1 byte")
    if isinstance(mem, int):
        return mem
    from gpualloc.model.option_values import parse_size

    return parse_size(mem, "--mem")


def declared_memory_bytes(job: JobFields) -> int | None:
    """The memory a ``--shareable`` job declares it uses (``--mem``), else None."""
    return memory_bytes(job.get("mem")) if job.get("shareable") else None
