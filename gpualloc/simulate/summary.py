"""Per-policy figures of a simulation run, in the ``simulate --json`` contract.

Percentiles are nearest-rank on the sorted values (no interpolation), so each reported figure is
the bandwidth some job actually got. Effective-bandwidth statistics cover jobs of two or more
GPUs (a 1-GPU job has no link to score), split by sensitivity. A job's run-time stretch is its
run time (start to end) over the trace's duration: what its GPUs and its neighbours cost it.
Allocated capacity is the time-mean over the arrival span (first to last arrival) of the share
of the GPUs' capacity that jobs hold; ``waited_*`` are shares of all arrivals
(:mod:`gpualloc.simulate.capacity`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from gpualloc.simulate.capacity import allocated_share, blocking, capacity_steps
from gpualloc.simulate.engine import SimResult


def percentile(sorted_values: Sequence[float], share: float) -> float:
    """Nearest-rank percentile of already sorted values (``share`` in [0, 1])."""
    rank = max(1, math.ceil(share * len(sorted_values)))
    return sorted_values[rank - 1]


def distribution(values: Sequence[float]) -> dict[str, float | None]:
    """``min``, ``p25``, ``p50``, ``p75``, ``mean`` (all None when there is no value)."""
    ordered = sorted(values)
    if not ordered:
        return {"min": None, "p25": None, "p50": None, "p75": None, "mean": None}
    return {
        "min": round(ordered[0], 6),
        "p25": round(percentile(ordered, 0.25), 6),
        "p50": round(percentile(ordered, 0.50), 6),
        "p75": round(percentile(ordered, 0.75), 6),
        "mean": round(sum(ordered) / len(ordered), 6),
    }


def summarise(result: SimResult) -> dict[str, Any]:
    jobs = result.jobs
    first = min(job.job.arrival_s for job in jobs)
    makespan = max(job.end_s for job in jobs) - first
    each = [_Each(job.wait_s, job.jct_s, job.stretch) for job in jobs]  # read once
    jct = sorted(e.jct_s for e in each)
    stretch = sorted(e.stretch for e in each if e.stretch is not None)
    waiting_free = [free for _, free, waiting in result.timeline if waiting]
    groups = {
        "one_gpu_jobs": lambda job: job.job.gpus == 1,
        "multi_gpu_jobs": lambda job: job.job.gpus > 1,
        "whole_gpu_jobs": lambda job: job.job.gpu_fraction is None,
        "gpu_part_jobs": lambda job: job.job.gpu_fraction is not None,
    }
    return {
        "jobs": len(jobs),
        "makespan_s": round(makespan, 6),
        "mean_jct_s": round(sum(jct) / len(jct), 6),
        "p95_jct_s": round(percentile(jct, 0.95), 6),
        "max_jct_s": round(jct[-1], 6),
        "mean_wait_s": round(sum(e.wait_s for e in each) / len(jobs), 6),
        "throughput_jobs_per_h": round(len(jobs) / makespan * 3600, 6) if makespan > 0 else None,
        "run_time_stretch": {
            "mean": _mean(stretch),
            "p95": round(percentile(stretch, 0.95), 6) if stretch else None,
            "max": round(stretch[-1], 6) if stretch else None,
        },
        "sensitive_effective_gbps": distribution(
            [j.effective_gbps for j in jobs if j.job.sensitive and j.effective_gbps is not None]
        ),
        "insensitive_effective_gbps": distribution(
            [j.effective_gbps for j in jobs if not j.job.sensitive and j.effective_gbps is not None]
        ),
        "sensitive_relative_score": distribution(
            [j.relative_score for j in jobs if j.job.sensitive and j.relative_score is not None]
        ),
        "mean_pcie_share": _mean([j.pcie_share for j in jobs if j.pcie_share is not None]),
        "mean_free_gpus_while_jobs_wait": _mean(waiting_free),
        "shared_jobs": sum(1 for job in jobs if job.shared),
        **{
            name: _group([e for job, e in zip(jobs, each, strict=True) if kind(job)])
            for name, kind in groups.items()
        },
        **_capacity(result),
        "decision_ms": {
            "mean": _mean(result.decision_ms),
            "max": round(max(result.decision_ms), 6) if result.decision_ms else None,
        },
    }


class _Each(NamedTuple):
    """What the summary reads of each job, read once."""

    wait_s: float
    jct_s: float
    stretch: float | None


def _group(jobs: Sequence[_Each]) -> dict[str, Any]:
    """Waiting, completion and stretch of one kind of job (what sharing trades)."""
    stretch = [job.stretch for job in jobs if job.stretch is not None]
    waits = sorted(job.wait_s for job in jobs)
    jcts = sorted(job.jct_s for job in jobs)
    return {
        "jobs": len(jobs),
        "mean_wait_s": _mean(waits),
        "p95_wait_s": round(percentile(waits, 0.95), 6) if waits else None,
        "mean_jct_s": _mean(jcts),
        "p95_jct_s": round(percentile(jcts, 0.95), 6) if jcts else None,
        "mean_stretch": _mean(stretch),
    }


def _capacity(result: SimResult) -> dict[str, Any]:
    """Allocated capacity over the arrival span, and the arrivals that waited with room
    (:mod:`gpualloc.simulate.capacity`)."""
    jobs = result.jobs
    first = min(job.job.arrival_s for job in jobs)
    last = max(job.job.arrival_s for job in jobs)
    steps = capacity_steps(jobs, result.gpu_count)
    blocked = blocking(jobs, result.gpu_count)
    return {
        "allocated_capacity": (
            round(allocated_share(steps, first, last), 6) if last > first else None
        ),
        "waited": _share(blocked.share(blocked.waited)),
        "waited_with_room": _share(blocked.share(blocked.waited_with_room)),
        "waited_no_placement": _share(blocked.share(blocked.no_placement)),
        "waited_held_by_queue": _share(blocked.share(blocked.held_by_queue)),
    }


def _share(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def _mean(values: Sequence[float]) -> float | None:
    return round(sum(values) / len(values), 6) if values else None
