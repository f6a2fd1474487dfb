"""The simulator: traces, generators, the event loop on the live queue rule, the command."""

from __future__ import annotations

import itertools
import json
import random
from datetime import datetime, timezone
from pathlib import Path

import pytest

from gpualloc.errors import TraceError
from gpualloc.host.queue import Attempt, next_start, take_turn
from gpualloc.ledger.schema import QueuedRequest, Waiter
from gpualloc.model.request import Placement, Scores
from gpualloc.simulate import drb_prototype
from gpualloc.simulate.engine import SimOptions, simulate
from gpualloc.simulate.generate import MAPA_NETWORKS, generate, parse_spec
from gpualloc.simulate.networks import SENSITIVE
from gpualloc.simulate.summary import distribution, percentile, summarise
from gpualloc.simulate.trace import SimJob, parse_trace, write_trace
from gpualloc.topologies import load_bundled

ROOT = Path(__file__).parent.parent


def _job(job_id: str, arrival: float, gpus: int, duration: float, **fields: object) -> SimJob:
    return SimJob(job_id, arrival, gpus, duration, fields.pop("sensitive", True), **fields)  # type: ignore[arg-type]


# ---- traces -----------------------------------------------------------------------------------


def test_csv_and_json_lines_traces_read_alike() -> None:
    csv_text = "id,arrival_s,gpus,duration_s,sensitive,min_utility\nb,5,2,10,yes,0.5\na,0,1,3,0,\n"
    jobs = parse_trace(csv_text)
    assert [(j.id, j.arrival_s, j.gpus, j.sensitive, j.min_utility) for j in jobs] == [
        ("a", 0.0, 1, False, None),
        ("b", 5.0, 2, True, 0.5),
    ]  # sorted by arrival
    assert parse_trace(write_trace(jobs)) == jobs
    assert len(parse_trace((ROOT / "examples" / "trace.csv").read_text())) == 6


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("id,arrival_s,gpus\n", "lacks duration_s, sensitive"),
        ('{"id": "a", "arrival_s": 0, "gpus": 0, "duration_s": 1, "sensitive": true}', "below 1"),
        ('{"id": "a", "arrival_s": 0, "gpus": 1.5, "duration_s": 1, "sensitive": true}', "integer"),
        (
            '{"id": "a", "arrival_s": 0, "gpus": 1, "duration_s": 1, "sensitive": "maybe"}',
            "true or",
        ),
        ('{"id": "a", "arrival_s": 0, "gpus": 1, "duration_s": 1, "sensitive": 1, "x": 2}', "'x'"),
        (
            '{"id": "a", "arrival_s": 0, "gpus": 1, "duration_s": 1, "sensitive": 1,'
            ' "pattern": "mesh"}',
            "pattern",
        ),
        ("{not json", "t.jsonl:1: not valid JSON"),
        ("", "no job"),
    ],
)
def test_bad_traces_are_refused_with_the_line(text: str, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        parse_trace(text, source="t.jsonl")


# ---- generators -------------------------------------------------------------------------------


def test_the_mapa_generator_follows_its_spec_and_is_reproducible() -> None:
    jobs = generate("mapa:jobs=400", seed=3)
    assert jobs == generate("mapa:jobs=400", seed=3) != generate("mapa:jobs=400", seed=4)
    assert len(jobs) == 400 and {j.gpus for j in jobs} == {2, 3, 4, 5}
    assert {j.duration_s for j in jobs} <= set(map(float, range(5, 25)))
    assert all(j.arrival_s == 0 and j.pattern == "ring" for j in jobs)
    assert all(j.sensitive == MAPA_NETWORKS[j.workload] for j in jobs)  # type: ignore[index]
    spread = generate("mapa:jobs=50,arrival=spread", seed=1)
    assert 0 < max(j.arrival_s for j in spread) < 14.5 * 50


def test_the_drb_generator_draws_poisson_arrivals_and_profiled_jobs() -> None:
    jobs = generate("drb:jobs=300", seed=5)
    gaps = [b.arrival_s - a.arrival_s for a, b in itertools.pairwise(jobs)]
    assert 4.5 < sum(gaps) / len(gaps) < 7.5  # 10 per minute: 6 s apart on average
    assert {j.gpus for j in jobs} == {1, 2, 3} and {j.batch for j in jobs} == {1, 4, 64, 128}
    assert all(j.min_utility == (0.3 if j.gpus == 1 else 0.5) for j in jobs)
    assert all(j.sensitive == (j.batch in (1, 4)) for j in jobs)
    alexnet_1 = next(j for j in jobs if j.workload == "bvlc_alexnet" and j.batch == 1)
    assert alexnet_1.duration_s == {1: 69.165, 2: 127.415, 3: 170.36}[alexnet_1.gpus]


def test_the_mixed_generator_offers_the_load_it_is_asked_for() -> None:
    """Arrivals over time at the rate that keeps the host ``load`` busy; sizes by weight; a
    share of insensitive jobs; durations within the bounds."""
    jobs = generate("mixed:jobs=3000,load=0.6,host_gpus=8,insensitive=0.25", seed=7)
    assert jobs == generate("mixed:jobs=3000,load=0.6,host_gpus=8,insensitive=0.25", seed=7)
    offered = sum(j.gpus * j.duration_s for j in jobs) / (8 * jobs[-1].arrival_s)
    assert 0.5 < offered < 0.7
    sizes = [j.gpus for j in jobs]
    assert set(sizes) == {1, 2, 3, 4, 8} and sizes.count(1) > sizes.count(4) > sizes.count(3)
    calm = [j for j in jobs if not j.sensitive]
    assert 0.2 < len(calm) / len(jobs) < 0.3
    assert all(MAPA_NETWORKS[j.workload] == j.sensitive for j in jobs)  # type: ignore[index]
    assert all(300 <= j.duration_s <= 3600 for j in jobs)
    only_pairs = generate("mixed:jobs=50,w1=0,w2=1,w4=0,w8=0,w3=0", seed=1)
    assert {j.gpus for j in only_pairs} == {2}


@pytest.mark.parametrize(
    "spec",
    ["hpc", "mapa:jobs", "mapa:color=3", "mapa:jobs=1.5", "drb:x=1", "mixed:w9=1", "mixed:load=x"],
)
def test_bad_generator_specs(spec: str) -> None:
    with pytest.raises(TraceError):
        parse_spec(spec)


@pytest.mark.parametrize(
    "spec", ["mixed:w1=0,w2=0,w3=0,w4=0,w8=0", "mixed:load=0", "mixed:insensitive=2"]
)
def test_impossible_mixed_workloads_are_refused(spec: str) -> None:
    with pytest.raises(TraceError, match="mixed"):
        generate(spec)


# ---- the queue rule, once more: the simulator's single pass equals the live rule -------------


def test_next_start_is_the_waiter_take_turn_lets_go() -> None:
    placement = Placement("x", (0,), Scores(None, None, 0.0, None, 1.0), "x")
    rng = random.Random(11)
    for _ in range(300):
        queue = [
            Waiter(
                id=f"{i:012x}",
                seq=i,
                uid=0,
                user="u",
                pid=1,
                priority=rng.choice(["high", "normal", "low"]),
                passed_over=rng.randint(0, 2),
                max_bypass=rng.randint(0, 2),
                request=QueuedRequest(gpus=rng.randint(1, 4), sensitive=False),
                created=datetime(2026, 1, 1, tzinfo=timezone.utc),
            )
            for i in range(rng.randint(1, 6))
        ]
        free = rng.randint(0, 4)

        def attempt(w: Waiter, free: int = free) -> Attempt:
            return Attempt(placement if w.request.gpus <= free else None, "no")

        allowed = [w.id for w in queue if take_turn(queue, w.id, attempt).go]
        turn = next_start(queue, attempt)
        assert allowed == ([turn.waiter.id] if turn and turn.waiter else [])


# ---- the engine -------------------------------------------------------------------------------


@pytest.fixture
def dgx1():
    return load_bundled("dgx1-v100")


def test_fifo_keeps_order_and_backfill_fills_the_gaps(dgx1) -> None:
    jobs = [_job("a", 0, 6, 100), _job("big", 1, 4, 50), _job("small", 2, 2, 10)]
    fifo = {r.job.id: r for r in simulate(dgx1, jobs, SimOptions(queue="fifo")).jobs}
    assert fifo["big"].start_s == 100 and fifo["small"].start_s == 100  # behind the big one
    filled = {r.job.id: r for r in simulate(dgx1, jobs, SimOptions(queue="backfill")).jobs}
    assert filled["small"].start_s == 2 and filled["big"].start_s == 100
    assert filled["small"].wait_s == 0 and filled["big"].wait_s == 99


def test_postponement_waits_for_a_good_placement_unless_turned_off() -> None:
    """The DRB paper's prototype scenario in small (section 5.2.2, Minsky: two sockets of two
    NVLinked P100). Three 1-GPU jobs fill three GPUs, the second on the other socket than the
    first (interference); when the first ends, the two free GPUs sit on different sockets.
    TOPO-AWARE (no postponement) starts the 2-GPU job on that poor pair at once; TOPO-AWARE-P,
    with Table 1's threshold for 2-GPU jobs (0.5 on the paper's scale), keeps it waiting until
    a whole socket is free."""
    minsky = load_bundled("minsky-p100")
    fillers = [_job("first", 0, 1, 50), _job("second", 1, 1, 100), _job("third", 2, 1, 80)]
    placed = {r.job.id: r.gpus for r in simulate(minsky, fillers, SimOptions("drb")).jobs}
    assert placed == {"first": (0,), "second": (2,), "third": (1,)}
    pair = _job("pair", 3, 2, 10, min_utility=0.5)
    waited = {r.job.id: r for r in simulate(minsky, [*fillers, pair], SimOptions("drb")).jobs}
    assert waited["pair"].start_s == 82 and waited["pair"].pcie_share == 0.0
    assert waited["pair"].utility >= 0.5
    eager = simulate(minsky, [*fillers, pair], SimOptions("drb", postpone=False)).jobs[3]
    assert eager.start_s == 50 and eager.pcie_share == 1.0  # across the sockets
    assert eager.utility < 0.35  # the last two GPUs, across sockets: Eq. 2 gives about 0.3


def test_the_bandwidth_runtime_stretches_sensitive_jobs_on_poor_links(dgx1) -> None:
    """The lowest indices give a pair one NVLink (0-1): the sensitive job runs longer there
    than on the host's best pair, the insensitive one barely. (Under mapa six GPUs held left
    such a pair; since the 2-5 edge range of Table 2, the ring of six stays on NVLink and
    leaves an NV2 pair.)"""
    jobs = [_job("pair", 1, 2, 10), _job("calm", 20, 2, 10, sensitive=False)]
    options = SimOptions(runtime="bandwidth", policy="baseline")
    result = {r.job.id: r for r in simulate(dgx1, jobs, options).jobs}
    pair, calm = result["pair"], result["calm"]
    assert dgx1.link(*pair.gpus).bandwidth_gbps == 25.0  # one NVLink, the best pair has two
    v = SENSITIVE.intensity_gb
    assert pair.stretch == pytest.approx((1 + v / 25.0) / (1 + v / 50.0))
    assert calm.stretch is not None and 1.0 < calm.stretch < 1.01
    held = simulate(dgx1, [_job("hold", 0, 6, 100)], SimOptions(runtime="bandwidth")).jobs[0]
    assert held.stretch == pytest.approx(1.0)  # six GPUs: the best ring of six


def test_the_profile_runtime_uses_measured_times() -> None:
    minsky = load_bundled("minsky-p100")
    jobs = [
        _job("solo", 0, 2, 1, workload="bvlc_alexnet", batch=1),
        _job("later", 500, 1, 1, workload="bvlc_googlenet", batch=4),
    ]
    result = {r.job.id: r for r in simulate(minsky, jobs, SimOptions(runtime="profile")).jobs}
    assert result["solo"].end_s == pytest.approx(127.415)  # intra-socket, measured
    with pytest.raises(TraceError, match="needs workload and batch"):
        simulate(minsky, [_job("x", 0, 1, 1)], SimOptions(runtime="profile"))


def test_a_job_bigger_than_the_host_is_refused(dgx1) -> None:
    with pytest.raises(TraceError, match="asks for 9 GPUs"):
        simulate(dgx1, [_job("x", 0, 9, 1)], SimOptions())


def test_simulation_is_deterministic_and_gpus_are_never_shared(dgx1) -> None:
    jobs = generate("mapa:jobs=120,arrival=spread", seed=2)
    first = simulate(dgx1, jobs, SimOptions(policy="mapa", queue="backfill"))
    again = simulate(dgx1, jobs, SimOptions(policy="mapa", queue="backfill"))
    assert [r.as_dict() for r in first.jobs] == [r.as_dict() for r in again.jobs]
    events = sorted(
        [(r.start_s, 1, g) for r in first.jobs for g in r.gpus]
        + [(r.end_s, 0, g) for r in first.jobs for g in r.gpus]
    )
    busy: set[int] = set()
    for _, starting, gpu in events:  # ends before starts at equal times
        if starting:
            assert gpu not in busy
            busy.add(gpu)
        else:
            busy.discard(gpu)


# ---- summary and command ----------------------------------------------------------------------


def test_percentiles_are_nearest_rank() -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    assert [percentile(values, q) for q in (0.25, 0.5, 0.75, 1.0)] == [1.0, 2.0, 3.0, 4.0]
    assert distribution([]) == {"min": None, "p25": None, "p50": None, "p75": None, "mean": None}


def test_simulate_command_prints_the_json_contract(cli) -> None:
    result = cli(
        "--topology", "dgx1-v100", "simulate", "--generate", "mapa:jobs=60",
        "--policy", "baseline,mapa", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    for name in ("baseline", "mapa"):
        summary = data["policies"][name]["summary"]
        for key in (
            "makespan_s",
            "mean_jct_s",
            "p95_jct_s",
            "mean_wait_s",
            "throughput_jobs_per_h",
        ):
            assert isinstance(summary[key], float)
        for group in ("sensitive_effective_gbps", "insensitive_effective_gbps"):
            assert set(summary[group]) == {"min", "p25", "p50", "p75", "mean"}
        job = data["policies"][name]["jobs"][0]
        assert {"id", "start_s", "end_s", "gpus", "effective_gbps", "aggregated_gbps"} <= set(job)
    mapa = data["policies"]["mapa"]["summary"]["sensitive_effective_gbps"]
    baseline = data["policies"]["baseline"]["summary"]["sensitive_effective_gbps"]
    assert mapa["p25"] > baseline["p25"]  # MAPA's claim: a better lower tail


def test_simulate_command_errors(cli, tmp_path: Path) -> None:
    assert cli("--topology", "dgx1-v100", "simulate", "--policy", "mapa").exit_code == 2
    bad = tmp_path / "bad.csv"
    bad.write_text("id,arrival_s\n")
    result = cli("--topology", "dgx1-v100", "simulate", "--trace", str(bad))
    assert result.exit_code == 14 and "lacks" in result.stderr
    table = cli("--topology", "dgx1-v100", "simulate", "--trace", str(ROOT / "examples/trace.csv"))
    assert table.exit_code == 0 and "6 jobs on dgx1-v100" in table.stdout


def test_remembered_placements_change_no_answer(dgx1, monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulator reuses a placement when a request meets the same host state again; the
    same run without that memory gives the same jobs the same GPUs at the same times."""
    from gpualloc.simulate import engine

    jobs = generate("mapa:jobs=150,min_gpus=1,max_gpus=6,arrival=spread", seed=9)
    options = SimOptions(policy="drb", queue="backfill", runtime="bandwidth")
    remembered = simulate(dgx1, jobs, options)
    forgetful = engine.attempts
    monkeypatch.setattr(engine, "attempts", lambda t, o, memo=None: forgetful(t, o))
    fresh = simulate(dgx1, jobs, options)
    assert [r.as_dict() for r in remembered.jobs] == [r.as_dict() for r in fresh.jobs]


@pytest.mark.slow  # matplotlib's start-up is most of it
@pytest.mark.extra("plot")
def test_plot_writes_the_three_kinds_of_figure(cli, tmp_path: Path) -> None:
    out = tmp_path / "figures"
    result = cli(
        "--topology", "dgx1-v100", "simulate", "--generate", "mapa:jobs=40",
        "--policy", "baseline,mapa", "--plot", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "completion-cdf.png", "effective-bandwidth.png", "occupancy-baseline.png",
        "occupancy-mapa.png",
    ]  # fmt: skip
    assert all((out / name).read_bytes().startswith(b"\x89PNG") for name in names)


def test_plot_without_matplotlib_says_how_to_get_it(cli, tmp_path, monkeypatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    result = cli(
        "--topology", "dgx1-v100", "simulate", "--generate", "mapa:jobs=5",
        "--plot", str(tmp_path / "f"),
    )  # fmt: skip
    assert result.exit_code == 2
    assert "pip install matplotlib" in result.stderr


@pytest.mark.slow
def test_the_evaluation_script_regenerates_its_document(tmp_path: Path) -> None:
    """benchmarks/evaluate.py end to end on a small workload (the full one is not CI's job)."""
    import subprocess
    import sys

    script = ROOT / "benchmarks" / "evaluate.py"
    result = subprocess.run(
        [sys.executable, str(script), "--jobs", "12", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    text = (tmp_path / "evaluation.md").read_text()
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings == [
        "## 1. Job completion time per policy",
        "## 2. The DRB paper's prototype scenario (Table 1, IBM Minsky)",
        "## 3. Predicted bandwidth: which policy gives jobs the better GPUs",
        "## 4. Sharing GPUs: what `run --share` does to waiting and job time",
        "## 5. Predicted against measured bandwidth",
        "## 6. A real production trace: shared GPUs and fragmentation (Alibaba 2023)",
    ]
    first_table = next(line for line in text.splitlines() if line.startswith("| "))
    assert first_table.startswith("| scheduler | makespan s | mean JCT s | p95 JCT s | worst JCT")
    for needle in ("In short", "the paper | 1.006", "speed-up over FCFS", "`mapa` vs `besteffort`"):
        assert needle in text
    assert "### 1.2 The same jobs on a PCIe-only server" in text and "load 0.9" in text
    assert "### 1.8 A recorded host: 8 x A40" in text
    sharing = text.split("\n## 4. ")[1]
    assert "| whole GPUs |" in sharing and "U = 0.5: mean JCT" in sharing
    assert "no job shared a GPU, so nothing changed" in sharing  # the MAPA control
    assert "Median |error| over the 28 counted GPU sets" in text.split("\n## 5. ")[1]
    trace = text.split("\n## 6. ")[1]
    assert "_Not regenerated: the trace is not at" in trace or (
        "1 window of 500 tasks" in trace and "| `spread` |" in trace.split("### 6.2")[1]
    )


def test_report_and_timeline(cli, tmp_path: Path) -> None:
    report = tmp_path / "out" / "report.md"
    report.parent.mkdir()  # gpualloc makes no directory (tests/test_bad_input_files.py)
    result = cli(
        "--topology", "dgx1-v100", "simulate", "--trace", str(ROOT / "examples/trace.csv"),
        "--policy", "baseline,mapa", "--report", str(report), "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    text = report.read_text()
    assert text.startswith("# 6 jobs on dgx1-v100 (fifo queue, auto runtimes)")
    assert "| `mapa` |" in text and "examples/trace.csv" in text
    timeline = json.loads(result.stdout)["policies"]["mapa"]["timeline"]
    assert timeline[0] == {"time_s": 0.0, "free_gpus": 4, "waiting_jobs": 0}
    assert all(0 <= point["free_gpus"] <= 8 for point in timeline)


def test_the_drb_prototype_scenario_keeps_the_papers_order() -> None:
    """Table 1 on the paper's Minsky with its measured profile (seed 000, section 5.2.2): with
    DRB's utility on the paper's scale, Table 1's threshold postpones Job3 until an NVLinked
    pair is free; FCFS finishes last, TOPO-AWARE-P no later than TOPO-AWARE and with the lower
    mean completion time."""
    topology = load_bundled(drb_prototype.TOPOLOGY)
    jobs = drb_prototype.table_1_jobs()
    results = {
        name: simulate(topology, jobs, options)
        for name, options in drb_prototype.SCHEDULERS.items()
    }
    summary = {name: summarise(result) for name, result in results.items()}
    makespan = {name: s["makespan_s"] for name, s in summary.items()}
    assert makespan["FCFS"] > makespan["TOPO-AWARE"] >= makespan["TOPO-AWARE-P"]
    assert summary["TOPO-AWARE-P"]["mean_jct_s"] < summary["TOPO-AWARE"]["mean_jct_s"]
    eager, picky = results["TOPO-AWARE"].jobs[3], results["TOPO-AWARE-P"].jobs[3]
    assert eager.pcie_share == 1.0 and eager.utility < 0.5  # across the sockets, at once
    assert picky.pcie_share == 0.0 and picky.utility >= 0.5 and picky.start_s > eager.start_s
    assert picky.end_s < eager.end_s
    first = {r.job.id: r.gpus for r in results["TOPO-AWARE-P"].jobs}
    assert first["Job0"] == (0,) and first["Job1"][0] in (2, 3)  # away from Job0's socket


def test_the_host_state_the_simulator_keeps_is_the_one_its_occupancy_makes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The simulator hands each occupancy the host state it keeps as jobs start and end
    (``Occupancy.known_state``); it must be what the occupancy would make of its leases: the
    same free GPUs and the same running jobs in the same order (the order is part of the key by
    which placements are remembered)."""
    from gpualloc.ledger.occupancy import Occupancy
    from gpualloc.simulate.engine import _Simulation

    made_by = _Simulation._occupancy_now
    checked = [0]

    def checking(self: _Simulation) -> Occupancy:
        occupancy = made_by(self)
        assert occupancy.known_state is not None
        made = Occupancy(gpu_count=occupancy.gpu_count, leases=occupancy.leases).host_state()
        assert occupancy.host_state() == made
        assert occupancy.free == made.free
        checked[0] += 1
        return occupancy

    monkeypatch.setattr(_Simulation, "_occupancy_now", checking)
    topology = load_bundled("dgx1-v100")
    jobs = generate("mixed:jobs=400,insensitive=0.5")
    simulate(topology, jobs, SimOptions(policy="drb", queue="backfill"))
    assert checked[0] > 400
