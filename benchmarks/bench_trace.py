#!/usr/bin/env python3
"""Replaying the Alibaba GPU trace: how long ``gpualloc simulate`` takes on
the whole openb pod list (every task that ran on GPUs) on an 8-GPU host.

Prints the tasks read, the jobs simulated and the seconds, reading and simulating apart, and
the time per 10,000 jobs (target: under 30 s on a 2-core machine, "seconds" for a replay).
Exit status 1 on a missed target.

Usage: python benchmarks/bench_trace.py [--trace FILE] [--topology NAME] [--load RHO]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from gpualloc.simulate.engine import SimOptions, simulate
from gpualloc.simulate.trace_files import read_trace_file
from gpualloc.simulate.window import scale_to_load
from gpualloc.topologies import load_bundled

DEFAULT_TRACE = (
    Path(__file__).resolve().parents[2]
    / "shared" / "reference" / "traces" / "alibaba-gpu-2023" / "openb_pod_list_default.csv"
)  # fmt: skip
TARGET_S_PER_10K = 30.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--topology", default="pcie-8gpu-2socket")
    parser.add_argument("--load", type=float, default=0.9)
    parser.add_argument("--sharing", type=int, default=4)
    options = parser.parse_args()
    topology = load_bundled(options.topology)
    started = time.perf_counter()
    jobs, notes = read_trace_file(options.trace, host_model=topology.gpus[0].name)
    jobs = scale_to_load(jobs, topology.gpu_count, options.load)
    read_s = time.perf_counter() - started
    started = time.perf_counter()
    result = simulate(
        topology,
        jobs,
        SimOptions(policy="mapa", queue="backfill", runtime="fixed", sharing=options.sharing),
    )
    simulate_s = time.perf_counter() - started
    per_10k = (read_s + simulate_s) * 10_000 / len(jobs)
    where = f"{options.topology}, load {options.load}, sharing {options.sharing}"
    print(f"{options.trace.name} on {where}:")
    for note in notes:
        print(f"  {note}")
    print(f"  read and rescale   {read_s:6.2f} s")
    print(f"  simulate (mapa)    {simulate_s:6.2f} s for {len(result.jobs)} jobs")
    verdict = "ok" if per_10k <= TARGET_S_PER_10K else "MISSED"
    print(f"  per 10,000 jobs    {per_10k:6.1f} s  (target {TARGET_S_PER_10K:g}: {verdict})")
    return 0 if per_10k <= TARGET_S_PER_10K else 1


if __name__ == "__main__":
    raise SystemExit(main())
