"""Fragmentation Gradient Descent for shared GPUs (Weng et al., "Beware of Fragmentation:
Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC'23,
sections 4.1-4.3), on one host.

A host's GPUs have free capacities ``free[g]`` in [0, 1] (1: a free GPU; a GPU whose shared
jobs hold parts of it: one minus their sum). For a task type ``m`` (a number of GPUs, or a part
of one GPU) the *fragmentation* ``F(m)`` is the free capacity that ``m`` cannot use (section
4.1, Eq. 1-2):

- a task asking part ``f`` of one GPU cannot use a GPU with less than ``f`` free: those GPUs'
  free capacity is fragment;
- a task asking ``k`` whole GPUs cannot use a partly taken GPU: its free capacity is fragment;
  and when fewer than ``k`` GPUs are wholly free the task fits nowhere, so every free capacity
  is fragment for it.

The *expected* fragmentation weighs each task type by its share of the workload
(``F = sum p_m F(m)``, section 4.2). FGD places a task where that expectation grows least
(section 4.3: the "gradient"); among equals, the best fit (least free capacity left), then the
lowest index. The workload's mix is the trace's in simulation; on a live host, the mix of its
recent requests, which the ledger keeps (:meth:`gpualloc.ledger.stats.LedgerStats.recent_mix`),
and until there are enough of those, :data:`DEFAULT_MIX`, the Alibaba trace's own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

TaskType = tuple[int, float]
"""(GPUs, part of one GPU): (1, 0.46) is a 1-GPU task asking 46 %; (k, 1.0) asks k whole GPUs."""

DEFAULT_MIX: dict[TaskType, float] = {
    (1, 0.1): 0.015,
    (1, 0.25): 0.081,
    (1, 0.5): 0.318,
    (1, 1.0): 0.573,
    (2, 1.0): 0.002,
    (4, 1.0): 0.002,
    (8, 1.0): 0.007,
}
"""The Alibaba GPU trace of 2023 (openb pod list: the tasks that ran on GPUs, weighted by count)
with the parts of a GPU rounded to the nearest of 10, 25 and 50 %
(:func:`gpualloc.simulate.openb.coarse_mix`; a test recomputes it from the trace)."""


def task_mix(types: Iterable[TaskType]) -> dict[TaskType, float]:
    """Each task type's share of ``types`` (one entry per task)."""
    counts = Counter((gpus, round(part, 2)) for gpus, part in types)
    total = sum(counts.values())
    return {kind: count / total for kind, count in sorted(counts.items())}


def fragmentation(free: Sequence[float], kind: TaskType) -> float:
    """``F(m)``: the free capacity a task of ``kind`` cannot use (module docstring)."""
    gpus, part = kind
    if gpus == 1 and part < 1:
        return sum(f for f in free if 0 < f < part - 1e-9)
    whole = sum(1 for f in free if f >= 1 - 1e-9)
    if whole < gpus:
        return sum(free)
    return sum(f for f in free if 1e-9 < f < 1 - 1e-9)


def expected_fragmentation(free: Sequence[float], mix: Mapping[TaskType, float]) -> float:
    return sum(weight * fragmentation(free, kind) for kind, weight in mix.items())


def growth(
    free: Sequence[float],
    gpu: int,
    part: float,
    mix: Mapping[TaskType, float],
    before: float | None = None,
) -> float:
    """How much the expected fragmentation grows if a task takes ``part`` of ``gpu``
    (``before``: the expectation now, when the caller weighs several GPUs)."""
    after = list(free)
    after[gpu] = max(0.0, after[gpu] - part)
    if before is None:
        before = expected_fragmentation(free, mix)
    return expected_fragmentation(after, mix) - before
