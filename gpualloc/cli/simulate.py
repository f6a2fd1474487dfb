"""``gpualloc simulate``: compare policies on a job trace, the way the MAPA and DRB papers did."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from gpualloc.cli.declare import Command, flag, json_flag, value
from gpualloc.cli.state import STATE
from gpualloc.errors import RequestError, TraceError
from gpualloc.model.printable import count_of


def simulate_command(
    trace: Path | None,
    generate: str | None,
    policy: str,
    queue: str,
    runtime: str,
    profile: Path | None,
    no_postpone: bool,
    sharing: int,
    share_placement: str | None,
    gpu_busy: float,
    start: int,
    limit: int | None,
    load: float | None,
    seed: int,
    save_trace: Path | None,
    plot: Path | None,
    report: Path | None,
    as_json: bool,
) -> None:
    """Simulate a stream of jobs on a topology under each policy and compare them: makespan,
    completion and waiting times, and the effective bandwidth jobs got.

    Placement and queueing are the live code of 'run --wait'. The DRB paper's schedulers:
    FCFS = --policy baseline --queue fifo; BF = --policy pack --queue backfill; TOPO-AWARE =
    --policy drb --no-postpone; TOPO-AWARE-P = --policy drb.

    Example: `gpualloc -t dgx1-v100 simulate --generate mapa --policy baseline,besteffort,mapa`
    """
    from gpualloc.placement.policies.registry import get_policy
    from gpualloc.placement.sharing.rules import get_share_policy
    from gpualloc.simulate.engine import SimOptions, simulate
    from gpualloc.simulate.generate import generate as generate_jobs
    from gpualloc.simulate.networks import check_workloads
    from gpualloc.simulate.profile import DrbProfile
    from gpualloc.simulate.summary import summarise
    from gpualloc.simulate.trace import write_trace
    from gpualloc.simulate.trace_files import read_trace_file
    from gpualloc.simulate.window import check_load, scale_to_load, window
    from gpualloc.user_files import refuse_overwriting_inputs

    # Every check of the command line before any file is read, and all before any is written.
    if trace is not None and generate is not None:
        raise RequestError(
            "--trace and --generate exclude each other", hint="give one of them, not both"
        )
    if trace is None and generate is None:
        raise RequestError(
            "give --trace FILE or --generate SPEC", hint="e.g. --generate mapa:jobs=300"
        )
    if load is not None:
        check_load(load)
    placement_given = share_placement is not None
    share_placement = share_placement or DEFAULT_SHARE_PLACEMENT
    placements = [name.strip() for name in share_placement.split(",") if name.strip()]
    for name in placements or [share_placement]:
        get_share_policy(name, what="--share-placement")
    if not sharing and placement_given:
        raise RequestError(
            "--share-placement applies to --sharing (1-GPU jobs sharing GPUs)",
            hint="add --sharing N (e.g. --sharing 32 for a trace that names parts of GPUs)",
        )
    policies = [name.strip() for name in policy.split(",") if name.strip()]
    if not policies:
        from gpualloc.placement.policies.registry import policy_names

        raise RequestError(
            "--policy names no policy", hint=f"the policies: {', '.join(policy_names())}"
        )
    for name in policies:
        get_policy(name)
    if profile is not None and runtime not in ("profile", "auto"):
        raise TraceError(
            "--profile applies to --runtime profile or auto", hint="add --runtime profile"
        )
    from gpualloc.atomic import check_output_directory, write_output

    read = [trace, profile, *STATE.input_files()]
    for output, option in ((save_trace, "--save-trace"), (report, "--report")):
        refuse_overwriting_inputs(output, read, option)
    for output, option in ((save_trace, "--save-trace"), (report, "--report"), (plot, "--plot")):
        if output is not None:  # not after minutes of simulating
            check_output_directory(output, option)
    topology = STATE.load_topology()
    trace_notes: list[str] = []
    if trace is not None:
        jobs, trace_notes = read_trace_file(trace, host_model=topology.gpus[0].name)
    else:
        jobs = generate_jobs(generate or "", seed)
    if start or limit is not None:
        jobs = window(jobs, start=start, limit=limit)
    parts = sum(job.gpu_fraction is not None for job in jobs)
    if parts and not sharing:  # they would run on whole GPUs, and nothing would say so
        trace_notes.append(
            f"{count_of(parts, 'job')} {'asks' if parts == 1 else 'ask'} for part of a GPU; "
            "without --sharing each holds a whole GPU "
            "(--sharing N lets up to N share one, e.g. --sharing 32)"
        )
    if load is not None:
        jobs = scale_to_load(jobs, topology.gpu_count, load)
    loaded_profile = DrbProfile.load(profile) if profile is not None else None
    check_workloads(jobs, loaded_profile or DrbProfile.bundled(), str(trace or "--generate"))
    results = {
        name if len(placements) == 1 else f"{name}/{rule}": simulate(
            topology,
            jobs,
            SimOptions(
                policy=name,
                queue=queue,
                runtime=runtime,
                postpone=not no_postpone,
                profile=loaded_profile,
                sharing=sharing,
                gpu_busy=gpu_busy,
                share_placement=rule,
            ),
        )
        for name in policies
        for rule in placements
    }
    summaries = {name: summarise(result) for name, result in results.items()}
    if save_trace is not None:  # only now: a refusal above leaves no file behind
        write_output(save_trace, write_trace(jobs), "--save-trace")
    shared = f", sharing {sharing} per GPU at U={gpu_busy:g}" if sharing else ""
    title = (
        f"{count_of(len(jobs), 'job')} on {topology.name or 'topology'} ({queue} queue, {runtime} "
        "runtimes"
        f"{shared})"
    )
    figures: list[Path] = []
    if plot is not None:
        from gpualloc.cli.open_ledger import say
        from gpualloc.simulate.plots import write_figures

        figures = write_figures(results, plot, title)
        for path in figures:
            say(f"wrote {path}")
    if report is not None:
        from gpualloc.simulate.report import markdown_report

        source = str(trace) if trace is not None else f"--generate {generate} --seed {seed}"
        text = markdown_report(title, source, summaries, figures, report.parent)
        write_output(report, text, "--report")
    if as_json:
        from gpualloc.cli.output import print_json

        print_json(
            _finite(
                {
                    "topology": topology.name,
                    "trace_notes": trace_notes,
                    "queue": queue,
                    "runtime": runtime,
                    "postpone": not no_postpone,
                    "sharing": sharing,
                    "gpu_busy": gpu_busy,
                    "policies": {
                        name: {
                            "summary": summaries[name],
                            "jobs": [job.as_dict() for job in results[name].jobs],
                            "timeline": [
                                {"time_s": t, "free_gpus": free, "waiting_jobs": waiting}
                                for t, free, waiting in results[name].timeline
                            ],
                        }
                        for name in results
                    },
                }
            )
        )
        return
    if trace_notes:
        from gpualloc.cli.output import say as note_line

        for note in trace_notes:
            note_line(f"{trace}: {note}")
    _show(topology.name or "topology", len(jobs), f"{queue} queue{shared}", runtime, summaries)
    if sharing:
        _show_capacity(summaries)


def _finite(value: Any) -> Any:
    """``value`` with each float that is not a finite number as None: JSON has no NaN or
    Infinity (Python would write them, and most readers refuse the file)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def _show(name: str, count: int, queue: str, runtime: str, summaries: dict[str, Any]) -> None:
    from gpualloc.cli.output import Table, print_tables

    def fmt(value: float | None, digits: int = 1) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    rows = []
    for policy, s in summaries.items():
        sensitive = s["sensitive_effective_gbps"]
        rows.append(
            [
                policy,
                _time(s["makespan_s"]),
                _time(s["mean_jct_s"]),
                _time(s["p95_jct_s"]),
                _time(s["max_jct_s"]),
                _time(s["mean_wait_s"]),
                fmt(s["run_time_stretch"]["p95"], 2),
                fmt(sensitive["min"]),
                fmt(sensitive["p25"]),
                fmt(sensitive["p50"]),
                fmt(s["insensitive_effective_gbps"]["p50"]),
                fmt(s["mean_pcie_share"], 2),
                fmt(s["decision_ms"]["mean"], 2),
            ]
        )
    print_tables(
        [
            Table(
                f"{count_of(count, 'job')} on {name}, {queue}, {runtime} runtimes (bandwidths in "
                "GB/s)",
                [
                    "Policy",
                    "Makespan",
                    "Mean JCT",
                    "p95 JCT",
                    "Worst JCT",
                    "Mean wait",
                    "Stretch p95",
                    "Sens min",
                    "Sens p25",
                    "Sens p50",
                    "Insens p50",
                    "PCIe share",
                    "Decision ms",
                ],
                rows,
                right_align_from=1,
            )
        ],
        footer=[
            "Stretch: a job's run time over its trace duration (its time alone on the best "
            "GPUs). Sens/Insens: effective bandwidth of bandwidth-sensitive / insensitive jobs "
            "of 2+ GPUs; PCIe share: of the pattern's links that carry no NVLink."
        ],
    )


def _show_capacity(summaries: dict[str, Any]) -> None:
    """What sharing trades: allocated capacity, the arrivals that waited with room, and the
    waits of whole-GPU jobs beside those asking for part of a GPU."""
    from gpualloc.cli.output import Table, print_tables

    def fmt(value: float | None, digits: int = 1, scale: float = 1.0) -> str:
        return "-" if value is None else f"{value * scale:.{digits}f}"

    rows = [
        [
            run,
            fmt(s["allocated_capacity"], 1, 100),
            fmt(s["waited"], 1, 100),
            fmt(s["waited_with_room"], 1, 100),
            fmt(s["waited_no_placement"], 1, 100),
            _time(s["whole_gpu_jobs"]["mean_wait_s"]),
            _time(s["whole_gpu_jobs"]["p95_wait_s"]),
            _time(s["gpu_part_jobs"]["mean_wait_s"]),
            _time(s["gpu_part_jobs"]["p95_wait_s"]),
        ]
        for run, s in summaries.items()
    ]
    print_tables(
        [
            Table(
                "GPU capacity and waiting (shares in %)",
                [
                    "Run",
                    "Allocated",
                    "Waited",
                    "With room",
                    "No placement",
                    "Whole: mean wait",
                    "Whole: p95 wait",
                    "Part: mean wait",
                    "Part: p95 wait",
                ],
                rows,
                right_align_from=1,
            )
        ],
        footer=[
            "Allocated: time-mean share of the GPUs' capacity held, first to last arrival. "
            "Waited with room: arrivals left waiting though the free capacity summed over GPUs "
            "would hold them; No placement: of those, the ones no GPU could take "
            "(fragmentation), the rest were held by the queue's order. Whole: jobs holding "
            "whole GPUs; Part: jobs asking part of one GPU."
        ],
    )


def _time(seconds: float | None) -> str:
    """A time in the tables, in human units (a cluster trace's run into months of seconds);
    ``--json`` keeps seconds."""
    from gpualloc.durations import human_duration

    return "-" if seconds is None else human_duration(seconds)


DEFAULT_SHARE_PLACEMENT = "fgd"

SIMULATE = Command(
    "simulate",
    simulate_command,
    options=(
        value(
            "--trace",
            kind="path",
            metavar="FILE",
            help="Jobs, JSON Lines or CSV with a header: id, arrival_s, gpus, duration_s, "
            "sensitive[, pattern, workload, batch, min_utility, min_bandwidth, priority, "
            "gpu_fraction]; or the Alibaba GPU trace's pod list (openb_pod_list_*.csv), "
            "recognised by its header.",
        ),
        value(
            "--generate",
            metavar="SPEC",
            completion="generators",
            help="Generate the jobs instead: mapa[:jobs=300,min_gpus=2,max_gpus=5,...] (the "
            "MAPA paper's workload), drb[:jobs=100,rate_per_min=10] (the DRB paper's) or "
            "mixed[:jobs=300,load=0.9,host_gpus=8,insensitive=0.3,...] (a shared lab server: "
            "arrivals over time, mostly small jobs).",
        ),
        value(
            "--policy",
            metavar="LIST",
            default="mapa",
            completion="policies",
            help="Policies to compare, comma-separated (e.g. baseline,besteffort,mapa).",
        ),
        value(
            "--queue",
            metavar="RULE",
            default="fifo",
            completion="queue_rules",
            help="fifo: no job passes another; backfill: a job may pass one that cannot start, "
            "a bounded number of times (as 'run --wait' does).",
        ),
        value(
            "--runtime",
            metavar="MODEL",
            default="auto",
            completion="runtime_models",
            help="How long a job runs on the GPUs it got. auto: the DRB paper's measured times "
            "for the jobs its profile covers, else bandwidth; bandwidth: compute plus ring "
            "all-reduce at the speed of the GPUs' best ring (published per-network figures); "
            "profile: the measured times only; fixed: the trace's durations (MAPA's simulator).",
        ),
        value(
            "--profile",
            kind="path",
            metavar="FILE",
            help="Job profile for --runtime profile or auto (default: DRB's).",
        ),
        flag("--no-postpone", help="Ignore the jobs' min_utility (DRB's TOPO-AWARE, not -P)."),
        value(
            "--sharing",
            kind="int",
            minimum=0,
            metavar="N",
            default=0,
            help="Let 1-GPU jobs share GPUs as 'run --share' does, at most N per GPU, beside "
            "--shareable multi-GPU jobs; k jobs on a GPU each run k times slower (equal time "
            "slices). 0: no sharing.",
        ),
        value(
            "--share-placement",
            metavar="RULE",
            completion="share_placements",
            help="With --sharing: how a shared job's GPU is chosen: fgd (where the workload's "
            "expected fragmentation grows least, its mix taken from the jobs), best-fit, "
            "first-fit or spread; several, comma-separated, compare them (runs named "
            f"POLICY/RULE). Default: {DEFAULT_SHARE_PLACEMENT}.",
        ),
        value(
            "--gpu-busy",
            kind="float",
            metavar="U",
            default=1.0,
            help="With --sharing: the share of time a job alone keeps its GPU busy (0 < U <= "
            "1). Jobs on one GPU lose nothing until their U add up past 1; then they slow by "
            "that sum. 1: compute-bound jobs, where sharing gains no capacity.",
        ),
        value(
            "--start",
            kind="int",
            minimum=0,
            metavar="N",
            default=0,
            help="Skip the first N jobs (arrival order).",
        ),
        value(
            "--limit", kind="int", minimum=1, metavar="N", help="Simulate N jobs from --start on."
        ),
        value(
            "--load",
            kind="float",
            metavar="RHO",
            help="Rescale arrival times so that the jobs offer this host RHO of its GPU time "
            "(GPUs x run time, a shared job its fraction, over host GPUs x the arrival span); "
            "run times are kept. For cluster traces, e.g. --load 0.9; 0.001 <= RHO <= 1000.",
        ),
        value("--seed", kind="int", metavar="N", default=0, help="Seed of --generate."),
        value(
            "--save-trace",
            kind="path",
            metavar="FILE",
            help="Write the jobs simulated as a JSON Lines trace.",
        ),
        value(
            "--plot",
            kind="path",
            metavar="DIR",
            help="Write PNG figures there (made when missing, in a directory that exists): "
            "effective bandwidth per policy, GPU occupancy over time, completion-time CDF "
            "(needs pip install 'gpualloc[plot]').",
        ),
        value(
            "--report",
            kind="path",
            metavar="FILE",
            help="Write a Markdown report: the settings, the comparison table, and the figures "
            "of --plot.",
        ),
        json_flag("Print JSON: summaries, jobs and the timeline."),
    ),
)
