#!/usr/bin/env python3
"""What ``gpualloc run`` costs a job, and how many allocations the ledger takes per second.

Prints the median wall time of ``gpualloc run -n 1 -- true`` on a bundled topology next to
``python -c pass`` and ``true``, and checks gpualloc's added cost against its budget
(200 ms over ``python -c pass``); then alloc+release throughput with 8 concurrent clients, both
through the command line (a process per call, as scripts use it) and through the library (the
ledger's own capacity); then how soon a ``run --wait`` job starts after the GPUs it waits for
are released (budget: within 500 ms). Exit status 1 on a budget miss.

Targets are printed next to the figures: ``run`` at most 100 ms over ``python -c pass``, at least 20
command-line cycles/s with 8 clients, at least 200 library cycles/s with 8 processes, and a library
alloc p99 of at most 50 ms with 8 processes. ``benchmarks/bench_startup.py`` times every command's
start.

Runs against a temporary state directory. Byte-code caching is forced on: an installed gpualloc
has its ``.pyc`` files, and environments that set ``PYTHONDONTWRITEBYTECODE`` (some CI images)
would otherwise make every start compile the package from source.

Usage: python benchmarks/bench_launch.py [--runs N] [--cycles N] [--topology NAME]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from process_timing import cpu_ms, gpualloc_argv, median_ms

BUDGET_MS = 200.0
RUN_TARGET_MS = 100.0
CLI_TARGET_CYCLES_S = 20.0
P99_TARGET_MS = 50.0
"""Targets, printed beside the figures (they do not set the exit status yet)."""
LIBRARY_TARGET_CYCLES_S = 200.0
"""The library's target, the same."""
START_LATENCY_BUDGET_MS = 500.0
CLIENTS = 8


def _cli_client(args: tuple[list[str], dict[str, str], int]) -> int:
    base, env, cycles = args
    for _ in range(cycles):
        lease = subprocess.run(
            [*base, "alloc", "--hold", "--format", "json"],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        lease_id = lease.split('"id": "', 1)[1][:12]
        subprocess.run([*base, "release", lease_id], env=env, check=True, capture_output=True)
    return cycles


def _python_client(args: tuple[list[str], dict[str, str], int]) -> int:
    """The command-line clients' pattern with ``python -c pass`` for both commands: the most
    cycles per second any Python command line can give on this machine."""
    _, env, cycles = args
    for _ in range(cycles * 2):
        subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
    return cycles


def _library_client(args: tuple[str, str, int]) -> list[float]:
    """``cycles`` alloc+release cycles through the library; the latency of each alloc (ms)."""
    topology_name, state, cycles = args
    os.environ["GPUALLOC_STATE_DIR"] = state
    from gpualloc.host.lease_terms import LeaseTerms
    from gpualloc.host.local import LocalHost
    from gpualloc.model.request import JobRequest
    from gpualloc.placement.mapa.patterns import build_pattern
    from gpualloc.placement.want import Want
    from gpualloc.topologies import load_bundled

    host = LocalHost.open(load_bundled(topology_name))
    want = Want(JobRequest(gpus=1, pattern=build_pattern("ring", 1), sensitive=False))
    latencies = []
    for _ in range(cycles):
        started = time.perf_counter()
        allocation = host.allocate(want, LeaseTerms(source="alloc", hold=True))
        latencies.append((time.perf_counter() - started) * 1000)
        host.release(allocation.lease.id)
    return latencies


def _start_latency_ms(base: list[str], env: dict[str, str], repeats: int) -> list[float]:
    """From the moment a release has committed to the moment a waiting job's command runs."""
    latencies = []
    for _ in range(repeats):
        held = subprocess.run(
            [*base, "alloc", "--hold", "-n", "8", "--format", "json"],
            env=env, check=True, capture_output=True, text=True,
        ).stdout.split('"id": "', 1)[1][:12]  # fmt: skip
        waiter = subprocess.Popen(
            [*base, "run", "--wait", "-q", "--", "date", "+%s.%N"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        while (
            '"queue": []'
            in subprocess.run(
                [*base, "status", "--json"], env=env, capture_output=True, text=True
            ).stdout
        ):
            time.sleep(0.02)
        subprocess.run([*base, "release", held], env=env, check=True, capture_output=True)
        released = time.time()
        out, _ = waiter.communicate(timeout=60)
        latencies.append((float(out) - released) * 1000)
    return latencies


def _throughput(worker, jobs: list) -> tuple[float, list]:
    """Cycles per second over all clients, and what each client returned."""
    start = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(len(jobs)) as pool:
        results = pool.map(worker, jobs)
    done = sum(len(r) if isinstance(r, list) else r for r in results)
    return done / (time.perf_counter() - start), results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=21, help="timed starts per command")
    parser.add_argument("--cycles", type=int, default=5, help="alloc+release per CLI client")
    parser.add_argument("--topology", default="dgx1-v100")
    options = parser.parse_args()

    state = tempfile.mkdtemp(prefix="gpualloc-bench-")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["GPUALLOC_STATE_DIR"] = state
    base = [*gpualloc_argv(), "--topology", options.topology]
    try:
        run = [*base, "run", "-n", "1", "-q", "--", "true"]
        for warm_up in (run, [*base, "alloc", "--hold"], [*base, "release", "--mine"]):
            subprocess.run(warm_up, env=env, check=True, stdout=subprocess.DEVNULL)
        true_ms = median_ms([shutil.which("true") or "true"], options.runs, env)
        python_ms = median_ms([sys.executable, "-c", "pass"], options.runs, env)
        run_ms = median_ms(run, options.runs, env)
        added = run_ms - python_ms
        print(f"median of {options.runs} starts on {options.topology}:")
        print(f"  true                              {true_ms:7.1f} ms")
        print(f"  python -c pass                    {python_ms:7.1f} ms")
        print(f"  gpualloc run -n 1 -- true         {run_ms:7.1f} ms")
        verdict = "ok" if added <= BUDGET_MS else "OVER BUDGET"
        print(
            f"  added over python -c pass         {added:7.1f} ms  (budget {BUDGET_MS:.0f}: "
            f"{verdict}; target {RUN_TARGET_MS:.0f}: "
            f"{'ok' if added <= RUN_TARGET_MS else 'MISSED'})"
        )

        alloc_cpu, release_cpu, python_cpu = cpu_ms(
            [
                [*base, "alloc", "--hold"],
                [*base, "release", "--mine"],
                [sys.executable, "-c", "pass"],
            ],
            10,
            env,
        )
        cli_rate, _ = _throughput(_cli_client, [(base, env, options.cycles)] * CLIENTS)
        ceiling, _ = _throughput(_python_client, [(base, env, options.cycles)] * CLIENTS)
        library_rate, per_client = _throughput(
            _library_client, [(options.topology, state, options.cycles * 20)] * CLIENTS
        )
        latencies = sorted(ms for client in per_client for ms in client)
        p50, p99 = latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.99)]
        print(f"alloc+release with {CLIENTS} concurrent clients:")
        print(
            f"  command line (2 processes/cycle)  {cli_rate:7.1f} cycles/s  (target "
            f"{CLI_TARGET_CYCLES_S:.0f}: {'ok' if cli_rate >= CLI_TARGET_CYCLES_S else 'MISSED'})"
        )
        cores = os.cpu_count()
        print(f"  python -c pass twice (ceiling)    {ceiling:7.1f} cycles/s  ({cores} cores)")
        print(
            f"  CPU per command                   alloc {alloc_cpu:.0f} ms, release "
            f"{release_cpu:.0f} ms, python -c pass {python_cpu:.0f} ms"
        )
        verdict = "ok" if library_rate >= LIBRARY_TARGET_CYCLES_S else "MISSED"
        print(
            f"  library (2 transactions/cycle)    {library_rate:7.1f} cycles/s  (target "
            f"{LIBRARY_TARGET_CYCLES_S:.0f}: {verdict})"
        )
        print(
            f"  library alloc latency             p50 {p50:5.1f} ms, p99 {p99:5.1f} ms  ("
            f"target p99 {P99_TARGET_MS:.0f}: {'ok' if p99 <= P99_TARGET_MS else 'MISSED'})"
        )
        latencies = _start_latency_ms(base, env, repeats=5)
        typical = statistics.median(latencies)
        verdict = "ok" if typical <= START_LATENCY_BUDGET_MS else "OVER BUDGET"
        print("run --wait: start after the GPUs are released (5 times):")
        print(
            f"  median {typical:6.0f} ms, max {max(latencies):6.0f} ms  (budget "
            f"{START_LATENCY_BUDGET_MS:.0f}: {verdict})"
        )
        return 0 if added <= BUDGET_MS and typical <= START_LATENCY_BUDGET_MS else 1
    finally:
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
