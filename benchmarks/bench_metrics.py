#!/usr/bin/env python3
"""How long one Prometheus scrape of ``gpualloc metrics --serve`` takes (its budget:
under 50 ms on a 16-GPU host).

Fills a temporary ledger of ``torus-2d-16`` with one lease per GPU pair and a queue of waiting
jobs, serves it, and times HTTP GETs of /metrics the way Prometheus makes them (a fresh
connection each time; each scrape reads the ledger afresh). Prints the median, p99 and worst;
exit status 1 when the median misses the target.

Usage: python benchmarks/bench_metrics.py [--scrapes N] [--topology NAME]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime, timezone

TARGET_MS = 50.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--topology", default="torus-2d-16")
    options = parser.parse_args()
    state = tempfile.mkdtemp(prefix="gpualloc-bench-metrics-")
    os.environ["GPUALLOC_STATE_DIR"] = state
    waiting = _fill(options.topology)
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "gpualloc", "--topology", options.topology, "metrics", "--serve",
         f"127.0.0.1:{port}"],
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        _wait_for(port)
        times = []
        for _ in range(options.scrapes):
            start = time.perf_counter()
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                r.read()
            times.append((time.perf_counter() - start) * 1000)
    finally:
        server.terminate()
        server.wait()
        for process in waiting:
            process.kill()
            process.wait()
    times.sort()
    median = statistics.median(times)
    p99 = times[max(0, int(len(times) * 0.99) - 1)]
    print(
        f"{options.topology}: {options.scrapes} scrapes, median {median:.1f} ms, p99 {p99:.1f} ms, "
        f"worst {times[-1]:.1f} ms (target: median under {TARGET_MS:g} ms)"
    )
    return 0 if median < TARGET_MS else 1


def _fill(topology: str) -> list[subprocess.Popen]:
    """A lease per GPU pair until the host is full, then four waiting jobs."""
    argv = [sys.executable, "-m", "gpualloc", "--topology", topology]
    pair = [*argv, "alloc", "-n", "2", "--hold"]
    while subprocess.run(pair, capture_output=True, check=False).returncode == 0:
        pass
    waiters = [
        subprocess.Popen([*argv, "alloc", "-n", "2", "--hold", "--wait"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
        for _ in range(4)
    ]  # fmt: skip
    print(f"ledger filled at {datetime.now(timezone.utc):%H:%M:%S}, 4 jobs waiting")
    return waiters


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_for(port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit("the metrics server did not start")


if __name__ == "__main__":
    sys.exit(main())
