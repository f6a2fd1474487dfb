"""How much of a host's GPU capacity a simulation allocated, and which arrivals waited with room
left (the measures of Weng et al., "Beware of Fragmentation", USENIX ATC'23,
section 5.1).

A job holds each of its GPUs whole, or, when it ran shared, the part of one GPU it asked for
(``gpu_fraction``, the Alibaba trace's ``gpu_milli``). Shared jobs that name no part
(time-sliced, ``--sharing`` on a trace of whole GPUs) count as holding their GPU whole, and on a
GPU what its jobs hold is capped at 1: the measures are made for traces that name parts.

- *Allocated capacity* at a moment is the held share of all GPUs; :func:`allocated_share`
  averages it over a span of time (FGD's headline is this share; they read it as the cluster
  fills, here it is read over the time jobs arrive).
- An arrival *waited with room* when, left waiting, the free capacity summed over the GPUs
  would have held it (the issue's "fragmentation-blocked"). Two causes: *no placement* (no one
  GPU had its part free, or fewer wholly free GPUs than it asks: fragmentation proper), or
  *held by the queue* (a placement existed but the queue's order kept the job back, behind one
  that cannot start).

The state an arrival meets is the one after that instant's finishes and starts (the engine
handles an instant's finishes, then arrivals, then starts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpualloc.simulate.engine import JobResult

_EPS = 1e-9


def _part(result: JobResult) -> float | None:
    """The part of one GPU the job held as a shared job, None when it held whole GPUs."""
    return result.job.gpu_fraction if result.shared else None


def held_part(result: JobResult) -> float:
    """What the job holds of each of its GPUs."""
    part = _part(result)
    return 1.0 if part is None else part


def asked(result: JobResult) -> float:
    """The GPU capacity the job asks for: its GPUs, or its part of one."""
    part = _part(result)
    return float(result.job.gpus) if part is None else part


def _events(results: Sequence[JobResult]) -> list[tuple[float, int, int]]:
    """(time, 0 end / 1 start, job index), in the order they apply; jobs of no length never
    hold anything."""
    events = []
    for index, result in enumerate(results):
        if result.end_s > result.start_s:
            events.append((result.start_s, 1, index))
            events.append((result.end_s, 0, index))
    events.sort()
    return events


def capacity_steps(results: Sequence[JobResult], gpu_count: int) -> list[tuple[float, float]]:
    """(time, allocated share of the host's capacity from then on), one step per event time."""
    held = [0.0] * gpu_count
    steps: list[tuple[float, float]] = []
    events = _events(results)
    last = len(events) - 1
    for position, (time, kind, index) in enumerate(events):
        result = results[index]
        change = (1.0 if kind else -1.0) * held_part(result)
        for gpu in result.gpus:
            held[gpu] += change
        if position < last and events[position + 1][0] == time:
            continue  # the step at this time is what its last event leaves
        steps.append((time, sum(min(1.0, max(0.0, part)) for part in held) / gpu_count))
    return steps


def allocated_share(steps: Sequence[tuple[float, float]], start: float, end: float) -> float:
    """The time-mean of the allocated share over ``[start, end]`` (0 before the first step)."""
    if end <= start:
        raise ValueError("an empty span has no mean")
    total = 0.0
    share, since = 0.0, start
    for time, next_share in steps:
        if time > start:
            total += share * (min(time, end) - since)
            since = min(time, end)
        if time >= end:
            break
        share = next_share
    total += share * (end - since)
    return total / (end - start)


@dataclass(frozen=True)
class Blocking:
    """How many arrivals waited, and why."""

    arrivals: int
    waited: int
    waited_with_room: int
    """Waited though the free capacity summed over GPUs would have held them."""
    no_placement: int
    """Of those, the ones no GPU (or set of wholly free GPUs) could take: fragmentation."""

    @property
    def held_by_queue(self) -> int:
        return self.waited_with_room - self.no_placement

    def share(self, count: int) -> float | None:
        return count / self.arrivals if self.arrivals else None


def blocking(results: Sequence[JobResult], gpu_count: int) -> Blocking:
    """Count the arrivals that waited with room (see the module), in one sweep over time."""
    held = [0.0] * gpu_count
    events = _events(results)
    queries = sorted(
        (result.job.arrival_s, index)
        for index, result in enumerate(results)
        if result.start_s > result.job.arrival_s + _EPS
    )
    waited_with_room = no_placement = 0
    position = 0
    free: list[float] = []
    room = 0.0
    for time, index in queries:
        moved = False
        while position < len(events) and events[position][0] <= time:
            _, kind, other = events[position]
            change = (1.0 if kind else -1.0) * held_part(results[other])
            for gpu in results[other].gpus:
                held[gpu] += change
            position += 1
            moved = True
        if moved or not free:  # else the GPUs are as the last arrival met them
            free = [max(0.0, 1.0 - part) for part in held]
            room = sum(free)
        result = results[index]
        if room + _EPS < asked(result):
            continue
        waited_with_room += 1
        if not _placeable(result, free):
            no_placement += 1
    return Blocking(
        arrivals=len(results),
        waited=len(queries),
        waited_with_room=waited_with_room,
        no_placement=no_placement,
    )


def _placeable(result: JobResult, free: list[float]) -> bool:
    fraction = _part(result)
    if fraction is not None:
        return any(part + _EPS >= fraction for part in free)
    return sum(1 for part in free if part >= 1 - _EPS) >= result.job.gpus
