#!/usr/bin/env python3
"""How fast the simulator runs: 10,000 jobs on a 16-GPU topology with the ``mapa`` policy.

The target is under a minute on a 2-core machine. The workload is the MAPA
generator's shape with arrivals spread over time (so the queue is neither always empty nor
always full) and job sizes of 2 to 8 GPUs. Prints the wall time per queue discipline, the jobs
simulated per second, and the mean placement-decision time; exit status 1 on a miss.

With ``--growth`` it prints instead how the cost grows with the jobs: the
MAPA paper's workload (``--generate mapa:jobs=N``: every job queued at time 0, FIFO) on a
DGX-1 V100 at 1,000 and 10,000 jobs (and 100,000 with ``--large``), in jobs per second, and
the growth exponent between sizes (1: linear; 2: quadratic).

With ``--goals`` it times the simulator's goals as a user meets them, the whole
command in a fresh process (start-up included), each ``--runs`` times: ``gpualloc -t dgx1-v100
simulate --generate mapa:jobs=10000`` and ``--generate mixed:jobs=10000`` (goal 5 s each) and
``--trace`` of the Alibaba pod list (goal 3 s; skipped where ``shared/`` does not hold it);
exit status 1 when the slowest run of one misses its goal.

Usage: python benchmarks/bench_simulate.py [--jobs N] [--topology NAME] [--policy P]
       python benchmarks/bench_simulate.py --growth [--large]
       python benchmarks/bench_simulate.py --goals [--runs N]
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import time
from pathlib import Path

from gpualloc.simulate.engine import SimOptions, simulate
from gpualloc.simulate.generate import generate
from gpualloc.topologies import load_bundled

BUDGET_S = 60.0
POD_LIST = (
    Path(__file__).resolve().parents[2]
    / "shared/reference/traces/alibaba-gpu-2023/openb_pod_list_default.csv"
)
GOALS: tuple[tuple[str, tuple[str, ...], float], ...] = (
    ("mapa:jobs=10000", ("--generate", "mapa:jobs=10000"), 5.0),
    ("mixed:jobs=10000", ("--generate", "mixed:jobs=10000"), 5.0),
    ("the Alibaba pod list", ("--trace", str(POD_LIST)), 3.0),
)
"""The simulator's goals: what follows ``gpualloc -t dgx1-v100 simulate``, and the
goal in seconds."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--topology", default="torus-2d-16")
    parser.add_argument("--policy", default="mapa")
    parser.add_argument("--growth", action="store_true", help="jobs/s at 1k and 10k jobs")
    parser.add_argument("--large", action="store_true", help="with --growth: 100k jobs too")
    parser.add_argument("--goals", action="store_true", help="the goals' commands, timed")
    parser.add_argument("--runs", type=int, default=3, help="with --goals: runs of each")
    options = parser.parse_args()
    if options.goals:
        return goals(options.runs)
    if options.growth:
        return growth((1_000, 10_000, 100_000) if options.large else (1_000, 10_000))
    topology = load_bundled(options.topology)
    spec = f"mapa:jobs={options.jobs},min_gpus=2,max_gpus=8,arrival=spread"
    jobs = generate(spec, seed=0)
    worst = 0.0
    print(f"{options.jobs} jobs ({spec}) on {options.topology}, policy {options.policy}:")
    for queue in ("fifo", "backfill"):
        start = time.perf_counter()
        result = simulate(topology, jobs, SimOptions(policy=options.policy, queue=queue))
        elapsed = time.perf_counter() - start
        worst = max(worst, elapsed)
        decisions = result.decision_ms
        print(
            f"  {queue:<9} {elapsed:7.1f} s  {options.jobs / elapsed:8.0f} jobs/s  "
            f"mean decision {sum(decisions) / len(decisions):6.2f} ms  "
            f"({len(decisions)} decisions)"
        )
    verdict = "ok" if worst <= BUDGET_S else "OVER BUDGET"
    print(f"slowest {worst:.1f} s (budget {BUDGET_S:.0f} s: {verdict})")
    return 0 if worst <= BUDGET_S else 1


def growth(sizes: tuple[int, ...]) -> int:
    topology = load_bundled("dgx1-v100")
    print("mapa:jobs=N on dgx1-v100, policy mapa, fifo (all queued at time 0):")
    previous: tuple[int, float] | None = None
    for size in sizes:
        jobs = generate(f"mapa:jobs={size}", seed=0)
        start = time.perf_counter()
        simulate(topology, jobs, SimOptions(policy="mapa", queue="fifo"))
        elapsed = time.perf_counter() - start
        line = f"  {size:>7} jobs  {elapsed:7.2f} s  {size / elapsed:8.0f} jobs/s"
        if previous is not None:
            exponent = math.log(elapsed / previous[1]) / math.log(size / previous[0])
            line += f"  growth exponent from {previous[0]}: {exponent:.2f}"
        print(line)
        previous = (size, elapsed)
    return 0


def goals(runs: int) -> int:
    """Each of :data:`GOALS` run ``runs`` times as a command; its wall times and the goal."""
    bare = math.inf
    for _ in range(3):  # the bare interpreter's start-up, for scale (the machine's speed varies)
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        bare = min(bare, time.perf_counter() - start)
    print(f"gpualloc -t dgx1-v100 simulate ... (python -c pass: {bare * 1000:.0f} ms):")
    missed = 0
    for name, arguments, goal in GOALS:
        if arguments[0] == "--trace" and not POD_LIST.is_file():
            print(f"  {name:<22} skipped: {POD_LIST} is not here")
            continue
        command = [sys.executable, "-m", "gpualloc", "-t", "dgx1-v100", "simulate", *arguments]
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True)
            times.append(time.perf_counter() - start)
        verdict = "ok" if max(times) <= goal else "OVER"
        missed += max(times) > goal
        shown = ", ".join(f"{t:.2f}" for t in times)
        print(f"  {name:<22} {shown} s  (goal {goal:g} s: {verdict})")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
