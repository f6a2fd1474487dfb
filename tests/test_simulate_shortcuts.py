"""The simulator's shortcuts answer as the long way does: a look skipped
because nothing it reads changed, a job told it waits without building decision contexts, jobs
whose pace cannot change left out of re-timing. Each test takes the shortcut away and compares
whole results."""

from __future__ import annotations

import dataclasses
import random

import pytest

from gpualloc.errors import GpusBusy, NoFeasiblePlacement, TraceError
from gpualloc.ledger.occupancy import Occupancy
from gpualloc.ledger.schema import Lease, LeasedGpu
from gpualloc.model.request import JobRequest
from gpualloc.placement import choose as choose_module
from gpualloc.placement.choose import searched
from gpualloc.placement.mapa.patterns import build_pattern
from gpualloc.placement.want import Want
from gpualloc.simulate import engine
from gpualloc.simulate.engine import SimOptions, simulate
from gpualloc.simulate.generate import generate
from gpualloc.simulate.trace import SimJob
from gpualloc.topologies import load_bundled
from tests.leases import held_lease


def _outcome(result: engine.SimResult) -> list[tuple[object, ...]]:
    return [
        (r.job.id, r.start_s, r.end_s, r.gpus, r.utility, r.effective_gbps, r.preserved_gbps)
        for r in result.jobs
    ]


def _prioritised(jobs: list[SimJob], seed: int) -> list[SimJob]:
    """Some jobs high and some low priority, so that arrivals go ahead of waiting ones."""
    rng = random.Random(seed)
    return [
        dataclasses.replace(job, priority=rng.choice(["high", "normal", "normal", "low"]))
        for job in jobs
    ]


@pytest.mark.parametrize(
    ("host", "policy", "queue", "runtime"),
    [
        ("dgx1-v100", "mapa", "fifo", "auto"),
        ("dgx1-v100", "drb", "backfill", "auto"),
        ("minsky-p100", "pack", "backfill", "profile"),
        ("torus-2d-16", "baseline", "backfill", "bandwidth"),
    ],
)
def test_skipped_looks_and_steady_jobs_change_nothing(
    monkeypatch: pytest.MonkeyPatch, host: str, policy: str, queue: str, runtime: str
) -> None:
    topology = load_bundled(host)
    spec = "drb:jobs=250" if runtime == "profile" else "mixed:jobs=600,host_gpus=8"
    jobs = _prioritised(generate(spec), seed=len(host))
    options = SimOptions(policy=policy, queue=queue, runtime=runtime)
    short = simulate(topology, jobs, options)
    monkeypatch.setattr(engine, "_stop", lambda queue: None)  # every look made
    monkeypatch.setattr(engine._Simulation, "_head_waits", lambda self, head: False)
    unsteady = engine._Running.__init__

    def never_steady(self, *args, **fields):  # type: ignore[no-untyped-def]
        unsteady(self, *args, **{**fields, "steady": False})

    monkeypatch.setattr(engine._Running, "__init__", never_steady)
    long = simulate(topology, jobs, options)
    assert _outcome(short) == _outcome(long)
    assert len(short.decision_ms) <= len(long.decision_ms)
    if queue == "fifo":  # a busy FIFO queue's head blocks it: arrivals behind it are not looked at
        assert len(short.decision_ms) < len(long.decision_ms)


def test_a_job_id_given_twice_is_refused() -> None:
    jobs = [SimJob("a", 0.0, 1, 10.0, True), SimJob("a", 1.0, 1, 10.0, True)]
    with pytest.raises(TraceError, match="appears twice"):
        simulate(load_bundled("dgx1-v100"), jobs, SimOptions())


def _occupancy(topology, busy: list[int], rng: random.Random) -> Occupancy:  # type: ignore[no-untyped-def]
    leases: dict[int, Lease] = {}
    rng.shuffle(busy)
    while busy:
        size = rng.randint(1, len(busy))
        gpus, busy = busy[:size], busy[size:]
        lease = held_lease(gpus[0], gpus=tuple(LeasedGpu(index=g) for g in gpus))
        leases.update(dict.fromkeys(gpus, lease))
    return Occupancy(gpu_count=topology.gpu_count, leases=leases)


@pytest.mark.parametrize("host", ["dgx1-v100", "pcie-8gpu-2socket"])
def test_too_few_free_says_what_the_contexts_say(
    monkeypatch: pytest.MonkeyPatch, host: str
) -> None:
    """A request for more GPUs than are free is told so without decision contexts: the same
    error, the same words, for requests with and without required or excluded GPUs."""
    topology = load_bundled(host)
    n = topology.gpu_count
    rng = random.Random(host)
    cases = []
    for _ in range(300):
        occupancy = _occupancy(topology, rng.sample(range(n), rng.randint(0, n)), rng)
        k = rng.randint(1, n + 1)
        required = frozenset(rng.sample(range(n), 1)) if rng.random() < 0.2 else frozenset()
        excluded = frozenset(rng.sample(range(n), 1)) - required if rng.random() < 0.2 else None
        request = JobRequest(k, build_pattern("ring", k), True, required, excluded or frozenset())
        cases.append((occupancy, Want(request=request)))

    def answers() -> list[tuple[str, str]]:
        said = []
        for occupancy, want in cases:
            try:
                said.append(("placed", repr(searched(topology, occupancy, want).gpus)))
            except (GpusBusy, NoFeasiblePlacement) as why:
                said.append((type(why).__name__, f"{why.message} | {why.hint} | {why.details}"))
        return said

    short = answers()
    monkeypatch.setattr(choose_module, "_too_few_free", lambda *args: None)
    assert short == answers()
    assert sum(kind == "GpusBusy" for kind, _ in short) > 50


def test_the_cyclic_collector_is_paused_for_a_run_and_left_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import gc

    topology = load_bundled("dgx1-v100")
    jobs = generate("mixed:jobs=30")
    seen: list[bool] = []
    run = engine._Simulation.run

    def watching(self: engine._Simulation, jobs: list[SimJob]) -> engine.SimResult:
        seen.append(gc.isenabled())
        return run(self, jobs)

    monkeypatch.setattr(engine._Simulation, "run", watching)
    was = gc.isenabled()
    try:
        gc.enable()
        simulate(topology, jobs, SimOptions())
        assert gc.isenabled()
        gc.disable()
        simulate(topology, jobs, SimOptions())
        assert not gc.isenabled()
    finally:
        if was:
            gc.enable()
    assert seen == [False, False]
