"""Section 4 of docs/evaluation.md: what sharing GPUs (``run --share``) does to
waiting and job time, on the mixed, MAPA and DRB workloads. Used by ``benchmarks/evaluate.py``.

Every 1-GPU job asks as ``run --share`` does and every other job's lease is ``--shareable``
(``simulate --sharing N``); jobs on one GPU slow down once their busy shares (``--gpu-busy U``)
add up past 1 (see :mod:`gpualloc.simulate.engine`).
"""

from __future__ import annotations

from collections.abc import Sequence

import job_time

from gpualloc.simulate.engine import JobResult, SimOptions

POLICY = "mapa"
VARIANTS = (
    ("whole GPUs", 0, 1.0),
    ("1 shared job per GPU, U = 1", 1, 1.0),
    ("4 shared jobs per GPU, U = 1", 4, 1.0),
    ("1 shared job per GPU, U = 0.5", 1, 0.5),
    ("4 shared jobs per GPU, U = 0.5", 4, 0.5),
)
"""(name, shared jobs per GPU, the share of time a job alone keeps its GPU busy)."""
WORKLOADS = (
    job_time.Workload(
        "4.1 The mixed workload of 1.1 (DGX-1 V100)",
        "dgx1-v100",
        "mixed:jobs=300,load=0.8",
        "backfill",
        "auto",
        3,
        "40 % of the jobs use one GPU; backfilling queue.",
    ),
    job_time.Workload(
        "4.2 The DRB paper's workload of 1.6 (Minsky)",
        "minsky-p100",
        "drb:jobs=200,rate_per_min=0.08",
        "fifo",
        "profile",
        3,
        "1 to 3 GPUs per job; FIFO; measured run times, co-location on a socket included.",
    ),
    job_time.Workload(
        "4.3 The MAPA paper's workload of 1.5 (DGX-1 V100)",
        "dgx1-v100",
        "mapa:jobs=300",
        "fifo",
        "bandwidth",
        3,
        "Ring jobs of 2 to 5 GPUs only: no job is small enough to share, so sharing can change "
        "nothing here (the control).",
    ),
)
COLUMNS = (
    "makespan s",
    "mean JCT s",
    "mean wait s",
    "1-GPU jobs: wait s",
    "JCT s",
    "stretch",
    "bigger jobs: wait s",
    "JCT s",
    "stretch",
    "shared",
)


def sharing_section(jobs: int | None) -> list[str]:
    lines = [
        "## 4. Sharing GPUs: what `run --share` does to waiting and job time",
        "",
        "`gpualloc simulate --sharing N --gpu-busy U`: every 1-GPU job asks as `run "
        "--share` does (the live share placement: GPUs in use first, at most N shared jobs per "
        "GPU) and every bigger job's lease is `--shareable`. A job alone keeps its GPU busy a "
        "share U of the time; jobs on one GPU lose nothing until their U add up past 1, then "
        "each goes that many times slower (equal time slices), and a multi-GPU job at the pace "
        "of its most crowded GPU. U is not in any trace: U = 1 (compute-bound jobs) is the "
        "conservative case, where sharing gains no capacity and only trades an earlier start "
        "for a slower run; U = 0.5 stands for the underused GPUs DeepPool (seed 004, section 2, "
        "Fig. 4) reports for strong-scaled jobs at small per-GPU batches. DeepPool's own "
        "collocation (stream priorities, launch pacing) keeps its foreground within 18% while "
        "nearly doubling cluster throughput (section 7.1); plain time slices and MPS have no "
        "such priorities, which U = 1 bounds. Stretch is run time over the job's time alone on "
        f"the best GPUs; policy `{POLICY}` in every row; seeds pooled.",
        "",
    ]
    for workload in WORKLOADS:
        lines += _workload(workload, jobs)
    return lines


def _workload(workload: job_time.Workload, jobs: int | None) -> list[str]:
    options = {
        name: SimOptions(
            POLICY, workload.queue, workload.runtime, postpone=False, sharing=n, gpu_busy=u
        )
        for name, n, u in VARIANTS
    }
    outcomes = job_time.run(workload, options, jobs=jobs)
    rows = {name: _figures(outcome) for name, outcome in outcomes.items()}
    lines = [
        f"### {workload.title}",
        "",
        f"{workload.note} {workload.seeds} seeds.",
        "",
        "| scheduling | " + " | ".join(COLUMNS) + " |",
        "|---|" + "---:|" * len(COLUMNS),
    ]
    for name, figures in rows.items():
        lines.append(f"| {name} | " + " | ".join(figures) + " |")
    lines += ["", *_verdicts(outcomes), ""]
    return lines


def _figures(outcome: job_time.Outcome) -> list[str]:
    makespan = sum(outcome.makespans) / len(outcome.makespans)
    small = [job for job in outcome.jobs if job.job.gpus == 1]
    big = [job for job in outcome.jobs if job.job.gpus > 1]
    shared = sum(1 for job in outcome.jobs if job.shared)
    return [
        f"{makespan:.0f}",
        _mean([j.jct_s for j in outcome.jobs]),
        _mean([j.wait_s for j in outcome.jobs]),
        *_group(small),
        *_group(big),
        f"{shared / len(outcome.jobs):.0%}",
    ]


def _group(jobs: Sequence[JobResult]) -> list[str]:
    stretch = [j.stretch for j in jobs if j.stretch is not None]
    return [
        _mean([j.wait_s for j in jobs]),
        _mean([j.jct_s for j in jobs]),
        _mean(stretch, "{:.2f}"),
    ]


def _verdicts(outcomes: dict[str, job_time.Outcome]) -> list[str]:
    whole = outcomes[VARIANTS[0][0]]
    base_jct = _average([j.jct_s for j in whole.jobs])
    base_wait = _average([j.wait_s for j in whole.jobs])
    lines = []
    for name, outcome in list(outcomes.items())[1:]:
        if not any(job.shared for job in outcome.jobs):
            lines.append(f"- {name}: no job shared a GPU, so nothing changed.")
            continue
        jct = _average([j.jct_s for j in outcome.jobs])
        wait = _average([j.wait_s for j in outcome.jobs])
        lines.append(
            f"- {name}: mean JCT {job_time.change_text(jct, base_jct)}, mean wait "
            f"{job_time.change_text(wait, base_wait)} against whole GPUs."
        )
    return lines


def _average(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _mean(values: Sequence[float], form: str = "{:.0f}") -> str:
    return form.format(_average(values)) if values else "-"
