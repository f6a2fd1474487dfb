"""A window of a trace, and its arrivals rescaled to an offered load (``simulate --start
--limit --load``).

A cluster trace (the Alibaba one: 1,523 nodes) offers far more work than one host can take; a
host sees a slice of it, at the pace its owner chooses:

- :func:`window`: ``limit`` jobs from position ``start`` in arrival order, arrivals shifted so
  the first is at 0;
- :func:`scale_to_load`: arrival times multiplied by one factor so that the jobs offer the host
  ``load`` of its GPU time: offered load = the jobs' GPU-seconds (GPUs x run time; a shared job
  its fraction of one GPU) over (host GPUs x the span from first to last arrival). Run times and
  the order of arrivals are kept; only the gaps between arrivals stretch or shrink. ``load`` is
  within :data:`MIN_LOAD` .. :data:`MAX_LOAD`.
"""

from __future__ import annotations

import dataclasses
import math

from gpualloc.errors import RequestError
from gpualloc.simulate.trace import SimJob

MIN_LOAD = 0.001
"""The least offered load ``--load`` takes: arrivals a thousand times further apart than the
host could serve."""
MAX_LOAD = 1000.0
"""The most: a thousand times more work than the host could do over the arrivals' span."""


def check_load(load: float) -> None:
    """Refuse a ``--load`` that is not a finite number within MIN_LOAD..MAX_LOAD (``nan``
    would make every arrival time NaN, a time the simulation never reaches)."""
    if not (math.isfinite(load) and MIN_LOAD <= load <= MAX_LOAD):
        raise RequestError(f"--load {load:g} is not within {MIN_LOAD:g}..{MAX_LOAD:g}")


def window(jobs: list[SimJob], *, start: int = 0, limit: int | None = None) -> list[SimJob]:
    chosen = jobs[start : None if limit is None else start + limit]
    if not chosen:
        raise RequestError(
            f"the window holds no job (--start {start}, the trace has {len(jobs)})",
            hint="a smaller --start",
        )
    first = chosen[0].arrival_s
    return [dataclasses.replace(job, arrival_s=job.arrival_s - first) for job in chosen]


def gpu_seconds(job: SimJob) -> float:
    return job.duration_s * (job.gpu_fraction if job.gpu_fraction is not None else job.gpus)


def offered_load(jobs: list[SimJob], host_gpus: int) -> float | None:
    """The share of ``host_gpus`` GPUs' time the jobs ask over their arrival span (None when
    they all arrive at once)."""
    span = max(job.arrival_s for job in jobs) - min(job.arrival_s for job in jobs)
    if span <= 0:
        return None
    return sum(gpu_seconds(job) for job in jobs) / (host_gpus * span)


def scale_to_load(jobs: list[SimJob], host_gpus: int, load: float) -> list[SimJob]:
    """``jobs`` with arrivals stretched (or squeezed) to offer ``load`` (see the module)."""
    check_load(load)
    now = offered_load(jobs, host_gpus)
    if now is None:
        raise RequestError(
            "--load needs arrivals spread over time; these jobs all arrive at once",
            hint="leave out --load",
        )
    factor = now / load
    first = min(job.arrival_s for job in jobs)
    return [
        dataclasses.replace(job, arrival_s=round(first + (job.arrival_s - first) * factor, 6))
        for job in jobs
    ]
