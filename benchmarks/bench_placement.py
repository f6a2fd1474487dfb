#!/usr/bin/env python3
"""Speed of placement decisions on every bundled host, pattern and job size.

Run on its own: ``python benchmarks/bench_placement.py [--policy mapa] [--repeats 5]
[--host NAME ...] [--insensitive] [--cap-s 5]``. For each (host, pattern, k) it times
``policy.place`` (the decision itself, not process start-up) on the empty host and on random
busy sets that leave enough GPUs free, and prints the p99 and the maximum in milliseconds, with a
flag where the issue's budget is missed (10 ms on 8-GPU hosts, 100 ms on 16-GPU hosts). A case
slower than ``--cap-s`` is not repeated. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpualloc.model.request import HostState, JobRequest  # noqa: E402
from gpualloc.placement.engine import decision_context  # noqa: E402
from gpualloc.placement.patterns import BUILTIN_PATTERNS, build_pattern  # noqa: E402
from gpualloc.placement.registry import get_policy  # noqa: E402
from gpualloc.topologies import bundled_names, load_bundled  # noqa: E402


def budget_ms(gpu_count: int) -> float:
    return 10.0 if gpu_count <= 8 else 100.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="mapa")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--host", action="append")
    parser.add_argument("--pattern", action="append")
    parser.add_argument("--insensitive", action="store_true")
    parser.add_argument("--cap-s", type=float, default=5.0)
    args = parser.parse_args()
    policy = get_policy(args.policy)
    hosts = args.host or bundled_names()
    patterns = args.pattern or list(BUILTIN_PATTERNS)
    missed = 0
    print(f"policy {policy.name}, {'insensitive' if args.insensitive else 'sensitive'} jobs")
    print(f"{'host':<20}{'pattern':<8}{'k':>3}{'p99 ms':>10}{'max ms':>10}  budget")
    for name in hosts:
        topology = load_bundled(name)
        n = topology.gpu_count
        rng = random.Random(0)
        for pattern in patterns:
            for k in range(1, n + 1):
                request = JobRequest(k, build_pattern(pattern, k), not args.insensitive)
                timings = []
                for repeat in range(args.repeats):
                    busy = (
                        frozenset()
                        if repeat == 0
                        else frozenset(rng.sample(range(n), rng.randint(0, n - k)))
                    )
                    ctx = decision_context(topology, request, HostState.with_busy(n, busy))
                    start = time.perf_counter()
                    policy.place(ctx)
                    timings.append((time.perf_counter() - start) * 1000)
                    if timings[-1] > args.cap_s * 1000:
                        break
                timings.sort()
                p99 = timings[min(len(timings) - 1, int(0.99 * len(timings)))]
                over = timings[-1] > budget_ms(n)
                missed += over
                flag = "OVER" if over else "ok"
                print(f"{name:<20}{pattern:<8}{k:>3}{p99:>10.1f}{timings[-1]:>10.1f}  {flag}")
    print(f"cases over budget: {missed}")


if __name__ == "__main__":
    main()
