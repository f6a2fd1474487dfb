"""Allocated capacity and arrivals that waited with room: the measures on
hand-made runs, the command that prints them, and the ordering of the share placements on a
fixed window of the real trace (the committed excerpt; the whole trace when ``../shared`` is
beside the repository)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpualloc.placement.sharing.rules import share_policy_names
from gpualloc.simulate.capacity import allocated_share, blocking, capacity_steps
from gpualloc.simulate.engine import JobResult, SimOptions, simulate
from gpualloc.simulate.openb import read_openb
from gpualloc.simulate.summary import summarise
from gpualloc.simulate.trace import SimJob
from gpualloc.simulate.window import scale_to_load, window
from gpualloc.topologies import load_bundled

FIXTURES = Path(__file__).parent / "fixtures" / "traces"
EXCERPT = FIXTURES / "openb_pod_list_excerpt.csv"
FULL = (
    Path(__file__).resolve().parents[2]
    / "shared" / "reference" / "traces" / "alibaba-gpu-2023" / "openb_pod_list_default.csv"
)  # fmt: skip


def _ran(
    name: str,
    arrival: float,
    start: float,
    end: float,
    gpus: tuple[int, ...],
    fraction: float | None = None,
) -> JobResult:
    job = SimJob(name, arrival, len(gpus), end - start, False, gpu_fraction=fraction)
    return JobResult(
        job=job, start_s=start, end_s=end, gpus=gpus, aggregated_gbps=None, effective_gbps=None,
        preserved_gbps=0.0, bottleneck_gbps=None, utility=1.0, ideal_effective_gbps=None,
        pcie_share=None, alone_s=end - start, shared=fraction is not None,
    )  # fmt: skip


# ---- the measures -------------------------------------------------------------------------------


def test_allocated_capacity_counts_parts_and_whole_gpus_over_time() -> None:
    runs = [
        _ran("whole", 0, 0, 10, (0,)),  # 1 of 2 GPUs for 10 s
        _ran("half", 0, 5, 15, (1,), 0.5),  # half of GPU 1 from 5 to 15
    ]
    steps = capacity_steps(runs, 2)
    assert steps == [(0, 0.5), (5, 0.75), (10, 0.25), (15, 0.0)]
    # 0-5: 0.5, 5-10: 0.75, 10-15: 0.25, 15-20: 0 -> (2.5 + 3.75 + 1.25) / 20
    assert allocated_share(steps, 0, 20) == pytest.approx(7.5 / 20)
    assert allocated_share(steps, 5, 10) == pytest.approx(0.75)
    with pytest.raises(ValueError):
        allocated_share(steps, 3, 3)


def test_time_sliced_jobs_on_one_gpu_hold_it_once() -> None:
    runs = [_ran("a", 0, 0, 4, (0,)), _ran("b", 0, 0, 4, (0,))]  # two whole holders, one GPU
    assert capacity_steps(runs, 1) == [(0, 1.0), (4, 0.0)]


def test_waiting_with_room_tells_fragmentation_from_queue_order() -> None:
    runs = [
        _ran("a", 0, 0, 10, (0,), 0.6),
        _ran("b", 0, 0, 10, (1,), 0.6),
        # 0.8 free in all, 0.4 on each GPU: a 0.5 ask fits the sum, no GPU: fragmentation
        _ran("frag", 1, 10, 12, (0,), 0.5),
        # a 0.3 ask had a GPU and still waited: the queue held it
        _ran("held", 2, 10, 12, (1,), 0.3),
        # a whole GPU asked while 0.8 is free: no room at all
        _ran("whole", 3, 10, 12, (0,)),
        _ran("never-waited", 4, 4, 5, (0,), 0.1),
    ]
    counted = blocking(runs, 2)
    assert (counted.arrivals, counted.waited) == (6, 3)
    assert (counted.waited_with_room, counted.no_placement, counted.held_by_queue) == (2, 1, 1)
    assert counted.share(counted.no_placement) == pytest.approx(1 / 6)


def test_the_state_an_arrival_meets_is_after_that_instants_finishes_and_starts() -> None:
    runs = [
        _ran("ends", 0, 0, 5, (0,)),
        _ran("starts", 5, 5, 9, (0,)),  # takes the GPU at 5
        _ran("arrives", 5, 9, 10, (0,)),  # meets a full host at 5: no room
    ]
    assert blocking(runs, 1).waited_with_room == 0


def test_the_summary_splits_whole_gpu_and_shared_jobs() -> None:
    topology = load_bundled("pcie-8gpu-2socket")
    jobs = [
        SimJob("w", 0, 8, 10, False),
        SimJob("p", 1, 1, 10, False, gpu_fraction=0.5),
        SimJob("q", 2, 1, 10, False, gpu_fraction=0.5),
    ]
    summary = summarise(simulate(topology, jobs, SimOptions(runtime="fixed", sharing=4)))
    assert summary["whole_gpu_jobs"]["jobs"] == 1 and summary["gpu_part_jobs"]["jobs"] == 2
    assert summary["gpu_part_jobs"]["mean_wait_s"] == pytest.approx((9 + 8) / 2)
    assert summary["gpu_part_jobs"]["p95_wait_s"] == pytest.approx(9)
    # all 8 GPUs held 0-2 s (the span of arrivals): the whole host
    assert summary["allocated_capacity"] == pytest.approx(1.0)
    assert summary["waited"] == pytest.approx(2 / 3) and summary["waited_with_room"] == 0


# ---- the command --------------------------------------------------------------------------------


def test_simulate_compares_share_placements_and_prints_capacity(cli) -> None:
    args = (
        "-t", "pcie-8gpu-2socket", "simulate", "--trace", str(EXCERPT), "--load", "0.9",
        "--queue", "backfill", "--runtime", "fixed", "--sharing", "32",
        "--share-placement", "fgd,spread",
    )  # fmt: skip
    shown = cli(*args)
    assert shown.exit_code == 0, shown.stderr
    assert "GPU capacity and waiting" in shown.stdout and "mapa/spread" in shown.stdout
    data = json.loads(cli(*args, "--json").stdout)
    assert set(data["policies"]) == {"mapa/fgd", "mapa/spread"}
    fgd = data["policies"]["mapa/fgd"]["summary"]
    spread = data["policies"]["mapa/spread"]["summary"]
    assert fgd["allocated_capacity"] > spread["allocated_capacity"]
    assert {"p95_wait_s", "p95_jct_s"} <= fgd["whole_gpu_jobs"].keys()


def test_several_share_placements_need_sharing(cli) -> None:
    result = cli(
        "-t", "pcie-8gpu-2socket", "simulate", "--trace", str(EXCERPT),
        "--share-placement", "fgd,best-fit",
    )  # fmt: skip
    assert result.exit_code != 0 and "--sharing" in result.stderr


@pytest.mark.slow  # matplotlib's start-up is most of it
@pytest.mark.extra("plot")
def test_plot_draws_allocated_capacity_per_run(cli, tmp_path: Path) -> None:
    result = cli(
        "-t", "pcie-8gpu-2socket", "simulate", "--trace", str(EXCERPT), "--limit", "40",
        "--runtime", "fixed", "--sharing", "32", "--share-placement", "fgd,spread",
        "--plot", str(tmp_path),
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "allocated-capacity.png").read_bytes().startswith(b"\x89PNG")


# ---- the ordering on a fixed window -------------------------------------------------------------


def _allocated(jobs: list[SimJob], load: float) -> dict[str, float]:
    topology = load_bundled("pcie-8gpu-2socket")
    scaled = scale_to_load(jobs, 8, load)
    return {
        placement: summarise(
            simulate(
                topology,
                scaled,
                SimOptions(
                    queue="backfill", runtime="fixed", sharing=32, share_placement=placement
                ),
            )
        )["allocated_capacity"]
        for placement in share_policy_names()
    }


@pytest.mark.parametrize("load", [0.7, 0.9, 1.1])
def test_fgd_is_never_behind_best_fit_and_ahead_of_spread_on_the_excerpt(load: float) -> None:
    jobs = read_openb(EXCERPT.read_text(), source=EXCERPT.name).jobs
    allocated = _allocated(jobs, load)
    assert allocated["fgd"] >= allocated["best-fit"] - 1e-9
    assert allocated["fgd"] >= allocated["first-fit"] - 1e-9
    assert allocated["fgd"] > allocated["spread"]


@pytest.mark.slow
@pytest.mark.skipif(not FULL.exists(), reason="the whole trace lives in ../shared")
@pytest.mark.parametrize(("load", "fgd", "spread"), [(0.9, 0.719, 0.687), (1.1, 0.735, 0.694)])
def test_the_documented_window_of_the_whole_trace(load: float, fgd: float, spread: float) -> None:
    """Window 0 of section 6.1 (docs/evaluation.md): fgd ties best-fit, spread loses."""
    jobs = window(read_openb(FULL.read_text(), source=FULL.name).jobs, start=0, limit=500)
    allocated = _allocated(jobs, load)
    assert allocated["fgd"] == pytest.approx(fgd, abs=5e-4)
    assert allocated["best-fit"] == pytest.approx(allocated["fgd"], abs=1e-9)
    assert allocated["spread"] == pytest.approx(spread, abs=5e-4)


# ---- FGD's own method (docs/evaluation.md 6.2 and 6.3) ------------------------------------------


@pytest.fixture
def fill_method():
    from tests.checkout import benchmark_module

    yield from benchmark_module("fill_method")


def test_the_fill_method_orders_share_placements_on_the_excerpt(fill_method) -> None:
    jobs = read_openb(EXCERPT.read_text(), source=EXCERPT.name).jobs
    table = fill_method.fill_table(jobs, count=30)
    means = {
        p: [sum(r[i] for r in rows) / len(rows) for i in range(5)] for p, rows in table.items()
    }
    assert all(f >= b - 1e-9 for f, b in zip(means["fgd"], means["best-fit"], strict=True))
    assert means["fgd"][-1] > means["spread"][-1]


def test_on_mig_slices_fgd_allocates_more_than_the_lowest_start(fill_method) -> None:
    """6.3: where NVIDIA's placement rules make free slices unlike, FGD gains on one host."""
    jobs = read_openb(EXCERPT.read_text(), source=EXCERPT.name).jobs
    table = fill_method.mig_fill_table(jobs, count=30)
    last = {rule: [r[-1] for r in rows] for rule, rows in table.items()}
    for other in ("best-fit", "first-fit"):
        assert all(f >= o - 1e-9 for f, o in zip(last["fgd"], last[other], strict=True))
        assert sum(last["fgd"]) > sum(last[other])
    assert fill_method.mig_slices_for(0.47) == 4 and fill_method.mig_slices_for(0.05) == 1
