"""The discrete-event simulator: arrivals and finishes on simulated time, placed and queued by
the live code.

Placement is :func:`gpualloc.placement.choose.choose` (the policy objects of ``run``, with
``--min-utility`` postponement); the queue is :mod:`gpualloc.host.queue` (the rule
``run --wait`` applies; :func:`~gpualloc.host.queue.next_start` finds the one job that rule
lets start). ``--queue fifo`` lets no job pass another (``max_bypass`` 0); ``backfill`` lets a
job pass one that cannot start, each at most ``DEFAULT_MAX_BYPASS`` times, as on a live host.

Events at the same time are handled finishes first, then arrivals in trace order, then as many
starts as the queue allows, so a run is deterministic.

How long each job runs is the runtime model's (``--runtime``, :mod:`gpualloc.simulate.runtime`):
its time alone on the GPUs it got, stretched by the jobs beside it. When a job starts or ends,
the models with interference re-time the running jobs: the work a job has left goes at the new
pace from then on.

Sharing (``--sharing N``): every 1-GPU job asks as ``run --share`` does (the live
share placement, at most N shared jobs per GPU) and every other job's lease is
``--shareable``. A job alone keeps its GPU busy a share U of the time (``--gpu-busy``, the
same for every job; a trace does not record it). Jobs on one GPU fill each other's idle time
until their demand, the sum of their U, passes 1; past it the driver's equal time slices make
each go that many times slower (processor sharing). A multi-GPU job goes at the pace of its
most crowded GPU (data-parallel ranks wait for each other). U = 1 (the default, compute-bound
jobs) is the conservative case: k jobs on a GPU each go k times slower and sharing gains no
capacity, only earlier starts. DeepPool (seed 004, sections 2 and 7.1) is the case for
sharing: strong-scaled foreground jobs leave their GPUs underused (its Fig. 4), and collocated
background jobs nearly double the cluster's throughput while the foreground loses less than
18%, with multiplexing mechanisms of its own (stream priorities, launch pacing) that
time slices do not have.

A job that asks for part of a GPU (``gpu_fraction``, the Alibaba trace's ``gpu_milli``) asks
as ``run --share --sm-share`` does: a GPU takes such jobs while the parts they hold sum to at
most 1 (and at most N of them), and its demand is its part, not U, so jobs that fit never slow
each other.
"""

from __future__ import annotations

import gc
import math
import time
from bisect import insort
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timezone

from msgspec import structs

from gpualloc.errors import TraceError
from gpualloc.host.queue import AttemptMemo, attempts, next_start, turn_key
from gpualloc.host.queue_policy import DEFAULT_MAX_BYPASS
from gpualloc.ledger.occupancy import Occupancy
from gpualloc.ledger.schema import Lease, LeasedGpu, Ledger, QueuedRequest, Waiter
from gpualloc.model.option_values import unknown_choice
from gpualloc.model.request import (
    CommunicationPattern,
    HostState,
    JobRequest,
    Placement,
    RunningJob,
)
from gpualloc.model.share import ShareRequest
from gpualloc.model.topology import Topology
from gpualloc.placement.mapa.patterns import build_pattern
from gpualloc.simulate.results import JobResult, SimOptions, SimResult
from gpualloc.simulate.runtime import RUNTIMES, Neighbour, runtime_model
from gpualloc.simulate.trace import SimJob, shown

QUEUES = ("fifo", "backfill")
_EPOCH = datetime(2026, 1, 1, tzinfo=timezone.utc)


@dataclass
class _Running:
    """A running job's progress: ``done`` of its work at ``since``, at ``slowdown`` now."""

    result: JobResult
    done: float
    since: float
    slowdown: float
    steady: bool = False
    """Its pace never changes: nothing shares its GPUs and its runtime model reads no
    neighbour of it, so re-timing leaves it be
    (tests/test_simulate_shortcuts.py::test_skipped_looks_and_steady_jobs_change_nothing)."""

    @property
    def pace_s(self) -> float:
        """Seconds the whole job takes at today's pace."""
        return self.result.alone_s * self.slowdown

    def advance(self, now: float) -> None:
        if self.pace_s > 0:
            self.done = min(1.0, self.done + (now - self.since) / self.pace_s)
        self.since = now

    def set_slowdown(self, slowdown: float) -> None:
        """Go on at a new pace; the end moves only when the pace changes."""
        if slowdown != self.slowdown:
            self.slowdown = slowdown
            self.result.end_s = self.since + (1.0 - self.done) * self.pace_s


def simulate(topology: Topology, jobs: list[SimJob], options: SimOptions) -> SimResult:
    """Run ``jobs`` (arrival order) on ``topology`` under ``options``."""
    _check(topology, jobs, options)
    sim = _Simulation(topology, options)
    with _cycles_collected_after():
        return sim.run(jobs)


@contextmanager
def _cycles_collected_after() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while the block runs (as it was before, after).

    A run makes objects by the hundred thousand and next to no reference cycles (its memos
    keep what they make), and the collector, set off by the count of objects made, walks the
    whole growing heap again and again, for nothing to collect
    (tests/test_simulate_shortcuts.py::test_the_cyclic_collector_is_paused_for_a_run_and_left_as_it_was).
    Memory is freed by reference counts as before; a cycle made meanwhile waits for the next
    collection after the run."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _check(topology: Topology, jobs: list[SimJob], options: SimOptions) -> None:
    if options.queue not in QUEUES:
        raise unknown_choice("--queue", options.queue, QUEUES, error=TraceError)
    if options.runtime not in RUNTIMES:
        raise unknown_choice("--runtime", options.runtime, RUNTIMES, error=TraceError)
    if not 0 < options.gpu_busy <= 1:
        raise TraceError(
            f"--gpu-busy {options.gpu_busy:g} is not a share of time", hint="give 0 < U <= 1"
        )
    if options.gpu_busy != 1 and not options.sharing:
        raise TraceError("--gpu-busy applies to --sharing", hint="add --sharing N")
    endless = [j for j in jobs if not math.isfinite(j.arrival_s) or not math.isfinite(j.duration_s)]
    if endless:  # a NaN arrival never comes: the event loop would wait for it forever
        raise TraceError(
            f"job {shown(endless[0].id)} arrives or runs at a time that is not a finite number",
            hint="give arrival_s and duration_s in seconds",
        )
    seen: set[str] = set()
    for job in jobs:  # the simulator keeps a running job's lease by its id
        if job.id in seen:
            raise TraceError(
                f"job id {shown(job.id)} appears twice", hint="give each job its own id"
            )
        seen.add(job.id)
    too_big = [job for job in jobs if job.gpus > topology.gpu_count]
    if too_big:
        raise TraceError(
            f"job {shown(too_big[0].id)} asks for {too_big[0].gpus} GPUs; "
            f"{topology.name or 'the topology'} has {topology.gpu_count}",
            hint="drop it from the trace or simulate a bigger host",
        )
    if options.runtime == "profile":
        missing = [job for job in jobs if job.workload is None or job.batch is None]
        if missing:
            raise TraceError(
                f"--runtime profile needs workload and batch; job {shown(missing[0].id)} "
                "lacks them",
                hint="use --generate drb, or --runtime fixed",
            )


class _Simulation:
    def __init__(self, topology: Topology, options: SimOptions) -> None:
        self.topology = topology
        self.options = options
        self.max_bypass = 0 if options.queue == "fifo" else DEFAULT_MAX_BYPASS
        self.runtime = runtime_model(options.runtime, topology, options.profile)
        self.running: list[_Running] = []
        self.leases: dict[str, Lease] = {}
        self.occupied: Occupancy | None = None
        """The occupancy of :attr:`leases`, until a job starts or ends (an arrival changes
        nothing the placements read)."""
        self.held: dict[int, Lease] = {}
        """GPU -> the lease holding it, kept as jobs start and end (without sharing)."""
        self.listed: dict[str, RunningJob] = {}
        """Job id -> the job as the host state lists it, in the order of :attr:`leases` (the
        order is part of the host state, and the utility sums its jobs' slowdowns in it)."""
        self.all_gpus = frozenset(range(topology.gpu_count))
        self.blocked_at: tuple[int, int] | None = None
        """The turn key of the waiter where the last look stopped, finding no start, while nothing
        has started or ended since: every waiter before it could not start and it could neither
        start nor be passed, so a look finds no start again until a job starts or ends or a waiter
        arrives ahead of it (every arrival behind a waiting head would look again in vain;
        tests/test_simulate_shortcuts.py::test_skipped_looks_and_steady_jobs_change_nothing)."""
        self.pcie_shares: dict[tuple[str, int, tuple[int, ...]], float | None] = {}
        self.queue: list[Waiter] = []
        self.by_waiter: dict[str, SimJob] = {}
        self.results: list[JobResult] = []
        self.ideal: dict[tuple[int, str], float | None] = {}
        self.patterns: dict[tuple[str, int], CommunicationPattern] = {}
        """Patterns by name and size, built once (every job of a size talks alike)."""
        self.fractional = False
        """The jobs name parts of GPUs (a trace's ``gpu_fraction``)."""
        self.mix: dict[tuple[int, float], float] | None = None
        """The jobs' task types and their shares: what FGD weighs fragmentation by."""
        self.placements = AttemptMemo()
        """Placements by request and host state, and by the free GPUs where the policy reads
        no more: a state recurs often, the answer never changes (see :class:`AttemptMemo`)."""
        self.result = SimResult(options.policy, self.results, topology.gpu_count)

    # ---- the event loop ----------------------------------------------------------------------

    def run(self, jobs: list[SimJob]) -> SimResult:
        pending = [
            job if job.order == index else replace(job, order=index)
            for index, job in enumerate(jobs)
        ]
        self.fractional = any(job.gpu_fraction is not None for job in jobs)
        if self.options.sharing:
            from gpualloc.placement.sharing.fragmentation import task_mix

            part = 1 / self.options.sharing
            self.mix = task_mix(
                (j.gpus, j.gpu_fraction or (part if j.gpus == 1 and not self.fractional else 1.0))
                for j in jobs
            )
        index, count, n = 0, len(pending), self.topology.gpu_count
        while index < count or self.running or self.queue:
            next_arrival = pending[index].arrival_s if index < count else None
            next_finish = min((r.result.end_s for r in self.running), default=None)
            if next_finish is None and next_arrival is None:
                stuck = ", ".join(w.id for w in self.queue[:3])
                raise TraceError(
                    f"jobs can never start (waiters {stuck}): their minimum utility is out of "
                    "reach on this host",
                    hint="lower min_utility, or use --no-postpone",
                )
            now = min(t for t in (next_arrival, next_finish) if t is not None)
            ending = (
                sorted(
                    (r for r in self.running if r.result.end_s <= now),
                    key=lambda r: (r.result.end_s, r.result.job.order),
                )
                if next_finish is not None and next_finish <= now
                else ()
            )
            for running in ending:
                self._finish(running)
            while index < count and pending[index].arrival_s <= now:
                self._arrive(pending[index])
                index += 1
            started = self._start_what_may(now)
            if (self.runtime.dynamic or self.options.sharing) and (ending or started):
                self._retime(now)
            if self.options.sharing:
                free = n - len({gpu for r in self.running for gpu in r.result.gpus})
            else:  # each running job holds its GPUs alone
                free = n - len(self.held)
            self.result.timeline.append((now, free, len(self.queue)))
        self.results.sort(key=lambda result: result.job.order)
        return self.result

    def _arrive(self, job: SimJob) -> None:
        waiter_id = f"{job.order:012x}"
        pattern = self._pattern(job)
        request = QueuedRequest(
            gpus=job.gpus,
            pattern=pattern.name,
            edges=pattern.edges,
            sensitive=job.sensitive,
            policy=self.options.policy,
            min_utility=job.min_utility if self.options.postpone else None,
            min_bandwidth_gbps=job.min_bandwidth if self.options.postpone else None,
            share=_share_request(job) if self._shares(job) else None,
        )
        waiter = Waiter(
            id=waiter_id,
            seq=job.order,
            uid=0,
            user="sim",
            pid=1,
            priority=job.priority,  # type: ignore[arg-type]
            max_bypass=self.max_bypass,
            request=request,
            created=_EPOCH,
        )
        insort(self.queue, waiter, key=turn_key)
        self.by_waiter[waiter_id] = job
        if self.blocked_at is not None and turn_key(waiter) < self.blocked_at:
            self.blocked_at = None

    def _finish(self, running: _Running) -> None:
        self.running.remove(running)
        job_id = running.result.job.id
        lease = self.leases.pop(job_id, None)
        if lease is not None and not self.options.sharing:
            self.listed.pop(job_id, None)
            for gpu in lease.gpus:
                self.held.pop(gpu.index, None)
        self.occupied = None
        self.blocked_at = None

    def _retime(self, now: float) -> None:
        """Each running job goes on at the pace its neighbours allow now, and, with sharing,
        at the pace its most crowded GPU allows."""
        if all(r.steady for r in self.running):
            return
        for running in self.running:
            if not running.steady:
                running.advance(now)
        jobs = [Neighbour(r.result.job, r.result.gpus) for r in self.running]
        demand: dict[int, float] = {}
        for neighbour in jobs:
            busy = neighbour.job.gpu_fraction or self.options.gpu_busy
            for gpu in neighbour.gpus:
                demand[gpu] = demand.get(gpu, 0.0) + busy
        looks = self.runtime.looks_at_neighbours  # a dynamic model, for the jobs it covers
        for running, (job, gpus) in zip(self.running, jobs, strict=True):
            if running.steady:
                continue
            beside = (
                [x for x in jobs if x.job is not job and not _same_gpus(x, gpus)]
                if looks(job)
                else []
            )
            slices = max(1.0, *(demand[gpu] for gpu in gpus))
            running.set_slowdown(self.runtime.slowdown(job, gpus, beside) * slices)

    def _start_what_may(self, now: float) -> int:
        """Start the jobs the queue lets start now; how many.

        The queue is kept in turn order (:func:`~gpualloc.host.queue.turn_key`, as waiters
        arrive), so a decision reads it as it is, and a start changes only the waiters it
        passed, all of them ahead of it: the cost of a start is its place in the queue, not
        the queue (re-sorting and rebuilding the queue for every decision would make a
        simulation quadratic in its jobs)."""
        started = 0
        queue = self.queue
        while queue and self.blocked_at is None:
            if self._head_waits(queue[0]):
                self.blocked_at = turn_key(queue[0])
                return started
            occupancy = self._occupancy()
            began = time.perf_counter()
            turn = next_start(
                queue, attempts(self.topology, occupancy, self.placements), order_of=_as_is
            )
            self.result.decision_ms.append((time.perf_counter() - began) * 1000)
            if turn is None or turn.waiter is None or turn.placement is None:
                self.blocked_at = _stop(queue)
                return started
            index = turn.position - 1
            passed = set(turn.passed)
            for ahead in range(index):
                waiter = queue[ahead]
                if waiter.id in passed:
                    queue[ahead] = structs.replace(waiter, passed_over=waiter.passed_over + 1)
            del queue[index]
            self._start(self.by_waiter.pop(turn.waiter.id), turn.placement, now)
            started += 1
        return started

    def _head_waits(self, head: Waiter) -> bool:
        """Whether the queue's first waiter asks for more whole GPUs than are free and may not
        be passed: then a look stops at it, finding no start, and need not be made (else a
        FIFO queue's head waiting for GPUs is looked at after every finish:
        tests/test_simulate_shortcuts.py::test_skipped_looks_and_steady_jobs_change_nothing)."""
        request = head.request
        return (
            not self.options.sharing
            and head.passed_over >= head.max_bypass
            and request.share is None
            and request.mig is None
            and request.gpus > self.topology.gpu_count - len(self.held)
        )

    def _shares(self, job: SimJob) -> bool:
        """Whether the job asks for a shared place: every 1-GPU job with ``--sharing``, but in a
        trace that names parts of GPUs only those that do (the others asked for whole GPUs)."""
        if not self.options.sharing or job.gpus != 1:
            return False
        return job.gpu_fraction is not None or not self.fractional

    def _occupancy(self) -> Occupancy:
        if self.occupied is None:
            self.occupied = self._occupancy_now()
        return self.occupied

    def _occupancy_now(self) -> Occupancy:
        if self.options.sharing:
            ledger = Ledger(host="sim", leases=list(self.leases.values()))
            return Occupancy.build(
                self.topology,
                ledger,
                max_shared_jobs=self.options.sharing,
                share_placement=self.options.share_placement,
                share_mix=self.mix,
            )
        state = HostState(
            free=self.all_gpus.difference(self.held), running=tuple(self.listed.values())
        )
        return Occupancy(
            gpu_count=self.topology.gpu_count, leases=dict(self.held), known_state=state
        )

    # ---- starting a job ------------------------------------------------------------------------

    def _start(self, job: SimJob, placement: Placement, now: float) -> None:
        s = placement.scores
        alone = self.runtime.solo_s(job, placement.gpus)
        result = JobResult(
            job=job,
            start_s=now,
            end_s=now + alone,
            gpus=placement.gpus,
            aggregated_gbps=s.aggregated_gbps,
            effective_gbps=s.effective_gbps,
            preserved_gbps=s.preserved_gbps,
            bottleneck_gbps=s.bottleneck_gbps,
            utility=s.utility,
            ideal_effective_gbps=self._ideal(job),
            pcie_share=self._pcie_share(job, placement),
            alone_s=alone,
            shared=placement.shared,
        )
        self.results.append(result)
        self.occupied = None
        self.blocked_at = None
        self.leases[job.id] = lease = Lease(
            id=f"{job.order:012x}",
            gpus=tuple(LeasedGpu(index=g) for g in placement.gpus),
            uid=0,
            user="sim",
            sensitive=job.sensitive,
            hold=True,
            command=(job.workload or job.id,),
            name=job.id,
            created=_EPOCH,
            source="run",
            # A trace that names parts of GPUs names whole ones too: those are not shared.
            shareable=bool(self.options.sharing) and not placement.shared and not self.fractional,
            share=(
                _share_request(job).leased(None, self.options.sharing, "time-sliced")
                if placement.shared
                else None
            ),
        )
        gpus = placement.gpus
        if not self.options.sharing:
            for gpu in lease.gpus:
                self.held[gpu.index] = lease
            n = self.topology.gpu_count
            listed = RunningJob(gpus=frozenset(g for g in gpus if g < n), sensitive=job.sensitive)
            self.listed[job.id] = listed
        # Alone on its GPUs, a job whose model reads no neighbour of it goes at one pace.
        steady = (
            not self.options.sharing
            and (job.gpu_fraction or 1.0) <= 1.0
            and not self.runtime.looks_at_neighbours(job)
            and self.runtime.slowdown(job, gpus, []) == 1.0
        )
        self.running.append(_Running(result, done=0.0, since=now, slowdown=1.0, steady=steady))

    def _ideal(self, job: SimJob) -> float | None:
        """The best effective bandwidth a job of this size and pattern gets on the empty host
        (MAPA's ``sensitive`` objective)."""
        key = (job.gpus, job.pattern)
        if key not in self.ideal:
            from gpualloc.placement.decide import plan

            request = JobRequest(job.gpus, self._pattern(job), True)
            best = plan(self.topology, request, HostState.all_free(self.topology.gpu_count))
            self.ideal[key] = best.scores.effective_gbps
        return self.ideal[key]

    def _pattern(self, job: SimJob) -> CommunicationPattern:
        key = (job.pattern, job.gpus)
        if key not in self.patterns:
            self.patterns[key] = build_pattern(job.pattern, job.gpus)
        return self.patterns[key]

    def _pcie_share(self, job: SimJob, placement: Placement) -> float | None:
        """Of the pattern's edges, the share that runs over no NVLink (by pattern and order:
        the same orders recur)."""
        key = (job.pattern, job.gpus, placement.gpus)
        if key in self.pcie_shares:
            return self.pcie_shares[key]
        pattern = self._pattern(job)
        share = None
        if pattern.edges:
            order = placement.gpus
            pcie = sum(
                1 for u, v in pattern.edges if not self.topology.link(order[u], order[v]).nvlinks
            )
            share = pcie / len(pattern.edges)
        self.pcie_shares[key] = share
        return share


def _stop(queue: list[Waiter]) -> tuple[int, int] | None:
    """Where a look that found no start stopped: at the first waiter that may not be passed
    again (each before it could not start, nor could it), or nowhere (it walked the queue)."""
    for waiter in queue:
        if waiter.passed_over >= waiter.max_bypass:
            return turn_key(waiter)
    return None


def _as_is(queue: Sequence[Waiter]) -> Sequence[Waiter]:
    """The simulator's queue, already in turn order."""
    return queue


def _share_request(job: SimJob) -> ShareRequest:
    """A 1-GPU job's shared ask: the part of a GPU it names (the trace's ``gpu_fraction``, as
    ``--sm-share`` in percent), else none (time slices among at most ``--sharing`` jobs)."""
    if job.gpu_fraction is None:
        return ShareRequest()
    return ShareRequest(sm_percent=max(1, min(100, round(job.gpu_fraction * 100))))


def _same_gpus(neighbour: Neighbour, gpus: tuple[int, ...]) -> bool:
    """A neighbour time-sliced with the job on its GPUs counts as slices, not interference."""
    return bool(set(neighbour.gpus) & set(gpus))
