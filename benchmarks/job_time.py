"""Section 1 of docs/evaluation.md: job completion time per policy, on the workloads of the
MAPA and DRB papers and on a mixed workload, with runtimes that depend on the GPUs each job got
(``gpualloc.simulate.runtime``). Used by ``benchmarks/evaluate.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpualloc.simulate.engine import JobResult, SimOptions, simulate
from gpualloc.simulate.generate import generate
from gpualloc.simulate.summary import percentile
from gpualloc.topologies import load_bundled

POLICIES = ("baseline", "besteffort", "slurm", "pack", "drb", "mapa-greedy", "mapa")
DEFAULT_POLICY = "mapa"

MAPA_TABLE_3 = {  # normalised execution-time speed-up over Baseline, real DGX-1 V100 runs
    "drb": ("Topo-aware", (1.002, 1.029, 1.385, 1.014, 1.075, 1.07)),
    "mapa-greedy": ("Greedy", (0.997, 1.059, 1.519, 1.048, 1.319, 1.08)),
    "mapa": ("Preservation", (1.006, 1.057, 1.119, 1.124, 1.352, 1.12)),
}
"""MAPA paper (seed 003) Table 3: MIN, 25th, 50th, 75th percentile, MAX, throughput. Its
Topo-aware is recursive bi-partitioning (reference [7], DRB)."""


@dataclass(frozen=True)
class Workload:
    title: str
    host: str
    spec: str
    queue: str
    runtime: str
    seeds: int
    note: str


@dataclass(frozen=True)
class Outcome:
    """One policy's jobs on one workload, pooled over the seeds."""

    jobs: list[JobResult]
    makespans: list[float]
    mean_jcts: list[float]

    def jct(self) -> list[float]:
        return sorted(job.jct_s for job in self.jobs)

    def run_times(self) -> list[float]:
        return sorted(job.end_s - job.start_s for job in self.jobs)

    def stretch(self) -> list[float]:
        return sorted(job.stretch for job in self.jobs if job.stretch is not None)

    def figures(self) -> dict[str, float]:
        jct, stretch = self.jct(), self.stretch()
        return {
            "makespan": sum(self.makespans) / len(self.makespans),
            "mean": sum(jct) / len(jct),
            "p95": percentile(jct, 0.95),
            "worst": jct[-1],
            "wait": sum(job.wait_s for job in self.jobs) / len(self.jobs),
            "stretch_mean": sum(stretch) / len(stretch),
            "stretch_p95": percentile(stretch, 0.95),
            "stretch_worst": stretch[-1],
        }


COLUMNS = (
    ("makespan s", "makespan"),
    ("mean JCT s", "mean"),
    ("p95 JCT s", "p95"),
    ("worst JCT s", "worst"),
    ("mean wait s", "wait"),
    ("stretch mean", "stretch_mean"),
    ("p95", "stretch_p95"),
    ("worst", "stretch_worst"),
)
LOWER_IS_BETTER = ("mean", "p95", "worst")
"""The figures the verdicts compare (job completion time)."""


def policy_options(workload: Workload) -> dict[str, SimOptions]:
    """Each policy with the workload's queue and runtime model, no postponement."""
    return {
        policy: SimOptions(policy, workload.queue, workload.runtime, postpone=False)
        for policy in POLICIES
    }


def run(
    workload: Workload, options: dict[str, SimOptions] | None = None, jobs: int | None = None
) -> dict[str, Outcome]:
    """Each scheduler's :class:`Outcome` on ``workload`` (``options`` default: every policy;
    ``jobs`` overrides the spec's job count)."""
    topology = load_bundled(workload.host)
    spec = workload.spec if jobs is None else _with_jobs(workload.spec, jobs)
    traces = [generate(spec, seed=seed) for seed in range(workload.seeds)]
    outcomes = {}
    for name, chosen in (options or policy_options(workload)).items():
        results = [simulate(topology, trace, chosen) for trace in traces]
        outcomes[name] = Outcome(
            jobs=[job for result in results for job in result.jobs],
            makespans=[_makespan(result.jobs) for result in results],
            mean_jcts=[sum(j.jct_s for j in r.jobs) / len(r.jobs) for r in results],
        )
    return outcomes


def table(outcomes: dict[str, Outcome], reference: str = "baseline") -> list[str]:
    """The job-time table: one row per scheduler, mean JCT against the reference's."""
    base = outcomes[reference].figures()
    lines = [
        "| scheduler | "
        + " | ".join(name for name, _ in COLUMNS)
        + f" | mean JCT vs {reference} |",
        "|---|" + "---:|" * (len(COLUMNS) + 1),
    ]
    for policy, outcome in outcomes.items():
        f = outcome.figures()
        cells = [_cell(f[key], key) for _, key in COLUMNS]
        change = "" if policy == reference else change_text(f["mean"], base["mean"])
        lines.append(f"| {_name(policy)} | " + " | ".join(cells) + f" | {change} |")
    return lines


def verdicts(
    outcomes: dict[str, Outcome], reference: str = "baseline", ours: str = DEFAULT_POLICY
) -> list[str]:
    """Plain sentences: who is best, how far ``ours`` is behind, who loses to ``reference``."""
    figures = {policy: outcome.figures() for policy, outcome in outcomes.items()}
    out = []
    for key, label in (("mean", "Mean JCT"), ("p95", "p95 JCT"), ("worst", "Worst JCT")):
        lowest = min(f[key] for f in figures.values())
        best = [p for p, f in figures.items() if f[key] <= lowest * 1.005]
        if len(best) == len(figures):
            out.append(f"- {label}: every scheduler within 0.5% ({lowest:.0f} s).")
            continue
        mine = figures[ours][key]
        behind = (
            f"{_name(ours)} is {change_text(mine, lowest)} behind"
            if ours not in best
            else f"{_name(ours)} is among them"
        )
        names = ", ".join(_name(p) for p in best)
        out.append(f"- Best {label[0].lower()}{label[1:]}: {names} ({lowest:.0f} s); {behind}.")
    losers = []
    for policy, f in figures.items():
        worse = [
            f"{key} JCT {change_text(f[key], figures[reference][key])}"
            for key in LOWER_IS_BETTER
            if policy != reference and f[key] > figures[reference][key] * 1.005
        ]
        if worse:
            losers.append(f"{_name(policy)} ({', '.join(worse)})")
    out.append(
        f"- Worse than {_name(reference)} on job completion time: "
        + ("; ".join(losers) if losers else "none")
        + "."
    )
    seeds = len(outcomes[reference].mean_jcts)
    if seeds > 1:
        pairs = zip(outcomes[ours].mean_jcts, outcomes[reference].mean_jcts, strict=True)
        changes = [(mine - theirs) / theirs for mine, theirs in pairs]
        wins = sum(change < -0.005 for change in changes)
        losses = sum(change > 0.005 for change in changes)
        out.append(
            f"- Seed by seed, {_name(ours)} against {_name(reference)} on mean JCT: "
            f"{wins} better, {losses} worse, {seeds - wins - losses} within 0.5%."
        )
    return out


def headline(
    where: str, outcomes: dict[str, Outcome], ours: str = DEFAULT_POLICY, against=("baseline",)
) -> str:
    """One sentence for the summary: ``ours`` against each of ``against`` on JCT."""
    mine = outcomes[ours].figures()
    parts = []
    for other in against:
        theirs = outcomes[other].figures()
        parts.append(
            f"against {_name(other)} mean JCT {change_text(mine['mean'], theirs['mean'])}, "
            f"p95 {change_text(mine['p95'], theirs['p95'])}, worst "
            f"{change_text(mine['worst'], theirs['worst'])}"
        )
    return f"- {where}: {_name(ours)} " + "; ".join(parts) + "."


def mapa_table_3(outcomes: dict[str, Outcome]) -> list[str]:
    """Execution-time speed-up over baseline at MAPA Table 3's points, beside the paper's."""
    base = outcomes["baseline"]
    points = (0.0, 0.25, 0.5, 0.75, 1.0)
    lines = [
        "| policy (MAPA's name) | | min | 25th | 50th | 75th | max | throughput |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for policy, (paper_name, paper) in MAPA_TABLE_3.items():
        ours = outcomes[policy]
        theirs, mine = base.run_times(), ours.run_times()
        speedups = [percentile(theirs, q) / percentile(mine, q) for q in points]
        speedups.append(sum(base.makespans) / sum(ours.makespans))
        lines.append(
            f"| `{policy}` ({paper_name}) | gpualloc | "
            + " | ".join(f"{x:.3f}" for x in speedups)
            + " |"
        )
        lines.append("| | the paper | " + " | ".join(f"{x:.3f}" for x in paper) + " |")
    return lines


def load_sweep(host: str, loads: Sequence[float], seeds: int, jobs: int | None) -> list[str]:
    """Mean JCT per policy as the mixed workload's load rises."""
    header = "| policy | " + " | ".join(f"load {load:g}" for load in loads) + " |"
    rows: dict[str, list[str]] = {policy: [] for policy in POLICIES}
    for load in loads:
        workload = Workload("", host, f"mixed:jobs=300,load={load}", "backfill", "auto", seeds, "")
        outcomes = run(workload, jobs=jobs)
        base = outcomes["baseline"].figures()["mean"]
        for policy, outcome in outcomes.items():
            mean = outcome.figures()["mean"]
            note = "" if policy == "baseline" else f" ({change_text(mean, base)})"
            rows[policy].append(f"{mean:.0f}{note}")
    return [
        header,
        "|---|" + "---:|" * len(loads),
        *(f"| `{policy}` | " + " | ".join(cells) + " |" for policy, cells in rows.items()),
    ]


def change_text(ours: float, theirs: float) -> str:
    """``-12%`` / ``+3%`` / ``a tie`` (lower is better for times)."""
    if theirs == 0:
        return "n/a"
    change = (ours - theirs) / abs(theirs) * 100
    if abs(change) < 0.5:
        return "a tie"
    return f"{'+' if change > 0 else ''}{change:.0f}%"


def _name(scheduler: str) -> str:
    """Policies in code type; the DRB paper's scheduler names as they are."""
    return scheduler if scheduler.isupper() else f"`{scheduler}`"


def _cell(value: float, key: str) -> str:
    return f"{value:.2f}" if key.startswith("stretch") else f"{value:.0f}"


def _makespan(jobs: list[JobResult]) -> float:
    return max(job.end_s for job in jobs) - min(job.job.arrival_s for job in jobs)


def _with_jobs(spec: str, jobs: int) -> str:
    name, _, rest = spec.partition(":")
    settings = [item for item in rest.split(",") if item and not item.startswith("jobs=")]
    return f"{name}:" + ",".join([f"jobs={jobs}", *settings])
