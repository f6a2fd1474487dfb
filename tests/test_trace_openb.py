"""The Alibaba GPU trace of 2023 (openb pod list) replayed by ``gpualloc simulate``: read as
documented, windowed, and rescaled to an offered load. The unit tests use the committed excerpt
(``fixtures/traces``, with its source); one test reads the whole trace from ``../shared`` where it
is."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from gpualloc.errors import ExitCode, TraceError
from gpualloc.simulate.openb import looks_like_openb, read_openb
from gpualloc.simulate.window import offered_load, scale_to_load, window

EXCERPT = Path(__file__).parent / "fixtures" / "traces" / "openb_pod_list_excerpt.csv"
FULL = (
    Path(__file__).resolve().parents[2]
    / "shared" / "reference" / "traces" / "alibaba-gpu-2023" / "openb_pod_list_default.csv"
)  # fmt: skip


def excerpt():
    return read_openb(EXCERPT.read_text(), source=EXCERPT.name, host_model="NVIDIA L40S")


def test_the_trace_is_read_as_documented() -> None:
    trace = excerpt()
    assert trace.skipped == Counter({"never scheduled": 15, "no GPU": 6})
    jobs = {job.id: job for job in trace.jobs}
    first = jobs["openb-pod-0000"]  # 1 GPU, 1000 milli, LS, created 0, deleted 12537496
    assert (first.gpus, first.gpu_fraction, first.priority) == (1, None, "high")
    assert (first.arrival_s, first.duration_s, first.sensitive) == (0.0, 12537496.0, False)
    half = jobs["openb-pod-0001"]  # 460 milli: part of a GPU
    assert half.gpu_fraction == 0.46 and half.duration_s == 12902960 - 427061
    assert sum(job.gpu_fraction is not None for job in trace.jobs) == 40  # 44, 4 never ran
    assert Counter(job.priority for job in trace.jobs)["low"] > 0  # BE
    eight = [job for job in trace.jobs if job.gpus == 8]
    assert eight and all(job.sensitive for job in eight)
    assert [job.arrival_s for job in trace.jobs] == sorted(job.arrival_s for job in trace.jobs)


def test_the_header_is_what_recognises_it() -> None:
    assert looks_like_openb(EXCERPT.read_text())
    assert not looks_like_openb("id,arrival_s,gpus,duration_s,sensitive\na,0,1,1,true\n")


def test_bad_rows_are_one_line_errors() -> None:
    header = EXCERPT.read_text().splitlines()[2]
    with pytest.raises(TraceError, match=r":2: num_gpu 'x' is not a whole number"):
        read_openb(f"{header}\np,1,1,x,1000,,LS,Running,0,5,0\n", source="t.csv")
    with pytest.raises(TraceError, match="times out of order"):
        read_openb(f"{header}\np,1,1,1,1000,,LS,Running,9,5,9\n", source="t.csv")


def test_a_window_starts_at_zero_and_keeps_its_jobs() -> None:
    jobs = excerpt().jobs
    chosen = window(jobs, start=10, limit=20)
    assert [j.id for j in chosen] == [j.id for j in jobs[10:30]]
    assert chosen[0].arrival_s == 0.0
    assert chosen[5].arrival_s == jobs[15].arrival_s - jobs[10].arrival_s


def test_arrivals_are_rescaled_to_the_offered_load() -> None:
    jobs = window(excerpt().jobs, start=0, limit=60)
    for load in (0.7, 0.9, 1.1):
        scaled = scale_to_load(jobs, 8, load)
        assert offered_load(scaled, 8) == pytest.approx(load, rel=1e-6)
        assert [j.duration_s for j in scaled] == [j.duration_s for j in jobs]
        assert [j.id for j in scaled] == [j.id for j in jobs]


def test_simulate_replays_it_from_the_command_line(cli) -> None:
    result = cli(
        "-t", "pcie-8gpu-2socket", "simulate", "--trace", str(EXCERPT), "--load", "0.9",
        "--runtime", "fixed", "--sharing", "4", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert "15 tasks skipped: never scheduled" in data["trace_notes"]
    jobs = data["policies"]["mapa"]["jobs"]
    assert len(jobs) == 136 - 21
    assert any(job["gpu_fraction"] == 0.46 for job in jobs)


def test_a_window_past_the_end_is_a_usage_error(cli) -> None:
    result = cli("-t", "pcie-8gpu-2socket", "simulate", "--trace", str(EXCERPT), "--start", "999")
    assert result.exit_code == ExitCode.USAGE and "the window holds no job" in result.stderr


@pytest.mark.skipif(not FULL.exists(), reason="the whole trace lives in ../shared")
def test_the_whole_trace_reads_with_the_readme_counts() -> None:
    trace = read_openb(FULL.read_text(), source=FULL.name)
    # The trace's README: num_gpu 0: 1088 tasks, 1: 6989 (3078 of them part of a GPU).
    assert trace.skipped == Counter({"no GPU": 1088, "never scheduled": 861})
    assert len(trace.jobs) + 861 == 8152 - 1088
    # 2-, 4- and 8-GPU tasks as the README counts them (16, 15, 44), less one never scheduled.
    assert Counter(j.gpus for j in trace.jobs) == Counter({1: 6129, 8: 44, 2: 15, 4: 15})
    assert sum(j.gpu_fraction is not None for j in trace.jobs) == 2573  # of 3078 asked
    assert Counter(j.priority for j in trace.jobs) == Counter(high=3596, low=2510, normal=97)


@pytest.mark.skipif(not FULL.exists(), reason="the whole trace lives in ../shared")
def test_the_default_fgd_mix_is_the_traces() -> None:
    from gpualloc.placement.sharing.fragmentation import DEFAULT_MIX
    from gpualloc.simulate.openb import coarse_mix

    mix = coarse_mix(read_openb(FULL.read_text(), source=FULL.name).jobs)
    assert mix.keys() == DEFAULT_MIX.keys()
    assert all(mix[kind] == pytest.approx(DEFAULT_MIX[kind], abs=0.0005) for kind in mix)
