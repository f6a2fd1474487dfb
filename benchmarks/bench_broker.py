#!/usr/bin/env python3
"""The broker's targets: throughput and start-up through ``gpualloc serve``.

Starts a broker on a bundled topology (a temporary socket and state directory, as this user),
then prints:

- the library (``gpualloc.api.hold``) with 8 client processes: alloc+release cycles per second
  (target >= 1000), the p50/p99 latency of each call, alloc and release alike (target p99
  <= 10 ms), and the CPU time a cycle costs the broker (its loop and its placement worker) and
  the clients, and the broker's read and write system calls (``/proc/PID/io``): on a shared
  machine the rate follows what others run, the CPU less, the system calls not at all;
- ``gpualloc run -n 1 -- true`` through the broker: median wall time over ``python -c pass``
  (target <= 40 ms);
- command-line cycles (``alloc --hold`` + ``release``, a process each) with 8 clients, next to
  the same pattern with ``python -c pass`` for both commands (target: >= 80 % of it).

Exit status 1 on a missed target. Byte-code caching is forced on, as in bench_launch.py.
``--library-only`` stops after the library's figures: to compare two checkouts in the same
minutes, run it in turns with ``PYTHONPATH=OTHER_CHECKOUT`` and without (the first line names
the gpualloc that ran). ``--clients 1`` gives what one cycle costs the broker alone, with no
other request to share a turn's ledger write with (the targets are for 8).

Usage: python benchmarks/bench_broker.py [--runs N] [--seconds S] [--topology NAME]
       [--library-only] [--clients N]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from process_timing import gpualloc_argv, median_ms

CLIENTS = 8
LIBRARY_TARGET_CYCLES_S = 1000.0
P99_TARGET_MS = 10.0
RUN_TARGET_MS = 40.0
CLI_TARGET_SHARE = 0.8


def start_broker(topology: str, directory: Path, env: dict[str, str]) -> subprocess.Popen:
    socket = directory / "broker.sock"
    broker = subprocess.Popen(
        [sys.executable, "-m", "gpualloc", "--topology", topology, "serve", "--socket", str(socket),
         "--state-dir", str(directory / "state")],
        env=env, stderr=subprocess.DEVNULL, cwd=directory,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not socket.exists():
        if broker.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the broker did not start")
        time.sleep(0.05)
    return broker


def _library_client(args: tuple[float]) -> tuple[list[float], float]:
    """alloc+release cycles through ``gpualloc.api.hold`` for ``seconds``: each call's ms, and
    the CPU seconds the client spent on them."""
    (seconds,) = args
    import gpualloc.api as api

    latencies = []
    cpu = time.process_time()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        started = time.perf_counter()
        with api.hold(1):
            held = time.perf_counter()
        released = time.perf_counter()
        latencies += [(held - started) * 1000, (released - held) * 1000]
    return latencies, time.process_time() - cpu


def cpu_s(pid: int) -> float:
    """The CPU time (user + system) ``pid`` and its children running now have spent: the
    broker's loop and its placement worker (``/proc/PID/stat`` fields 14 and 15)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for member in [pid, *_children(pid)]:
        try:
            fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def syscalls(pid: int) -> tuple[int, int]:
    """The read and write system calls ``pid`` has made (``syscr``, ``syscw`` of
    ``/proc/PID/io``: recv and send count among them)."""
    fields = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return int(fields["syscr"]), int(fields["syscw"])


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(child) for child in text.split()]


def _cli_client(args: tuple[list[str], dict[str, str], float]) -> int:
    base, env, seconds = args
    cycles = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        lease = subprocess.run(
            [*base, "alloc", "--hold", "--format", "json"],
            env=env, check=True, capture_output=True, text=True,
        ).stdout.split('"id": "', 1)[1][:12]  # fmt: skip
        subprocess.run([*base, "release", lease], env=env, check=True, capture_output=True)
        cycles += 1
    return cycles


def _python_client(args: tuple[list[str], dict[str, str], float]) -> int:
    _, env, seconds = args
    cycles = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
        subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
        cycles += 1
    return cycles


def _rate(worker, job: tuple, clients: int = CLIENTS) -> tuple[float, list]:
    """Cycles per second over the clients, and what each returned (a latency list counts
    two calls a cycle)."""
    start = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(clients) as pool:
        results = pool.map(worker, [job] * clients)
    elapsed = time.perf_counter() - start
    done = sum(len(r[0]) // 2 if isinstance(r, tuple) else r for r in results)
    return done / elapsed, results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=21, help="timed starts of run")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each load test")
    parser.add_argument("--topology", default="dgx1-v100")
    parser.add_argument(
        "--library-only", action="store_true", help="stop after the library's figures"
    )
    parser.add_argument(
        "--clients",
        type=int,
        default=CLIENTS,
        help="library clients (1: the broker's own cost of a cycle, with no batching)",
    )
    options = parser.parse_args()
    import gpualloc

    print(f"gpualloc {gpualloc.__version__} from {Path(gpualloc.__file__).parent}")

    directory = Path(tempfile.mkdtemp(prefix="gpualloc-bench-broker-"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.pop("GPUALLOC_TOPOLOGY", None)
    env["GPUALLOC_BROKER"] = str(directory / "broker.sock")
    broker = start_broker(options.topology, directory, env)
    os.environ.update(env)
    base = gpualloc_argv()
    missed = False
    try:
        broker_before, calls_before = cpu_s(broker.pid), syscalls(broker.pid)
        library_rate, per_client = _rate(_library_client, (options.seconds,), options.clients)
        broker_spent = cpu_s(broker.pid) - broker_before
        (reads, writes), (reads_before, writes_before) = syscalls(broker.pid), calls_before
        reads, writes = reads - reads_before, writes - writes_before
        calls = sorted(ms for client, _ in per_client for ms in client)
        cycles = len(calls) // 2
        clients_spent = sum(spent for _, spent in per_client)
        p50, p99 = calls[len(calls) // 2], calls[int(len(calls) * 0.99)]
        print(f"through the broker on {options.topology}, {os.cpu_count()} cores:")
        ok = library_rate >= LIBRARY_TARGET_CYCLES_S
        missed |= not ok
        print(
            f"  library, {options.clients} clients        {library_rate:8.0f} alloc+release "
            "cycles/s  "
            f"(target {LIBRARY_TARGET_CYCLES_S:.0f}: {'ok' if ok else 'MISSED'})"
        )
        ok = p99 <= P99_TARGET_MS
        missed |= not ok
        print(
            f"  library call latency      p50 {p50:5.2f} ms, p99 {p99:5.2f} ms  (target p99 "
            f"{P99_TARGET_MS:.0f}: {'ok' if ok else 'MISSED'})"
        )
        print(
            f"  CPU per cycle             broker {broker_spent / cycles * 1e6:5.0f} us, "
            f"clients {clients_spent / cycles * 1e6:5.0f} us"
        )
        print(
            f"  broker system calls       {reads / cycles:5.1f} reads, {writes / cycles:5.1f} "
            "writes per cycle"
        )
        if options.library_only:
            return 1 if missed else 0

        run = [*base, "run", "-n", "1", "-q", "--", "true"]
        subprocess.run(run, env=env, check=True)
        python_ms = median_ms([sys.executable, "-c", "pass"], options.runs, env)
        run_ms = median_ms(run, options.runs, env)
        added = run_ms - python_ms
        ok = added <= RUN_TARGET_MS
        missed |= not ok
        print(f"  python -c pass            {python_ms:7.1f} ms (median of {options.runs})")
        print(
            f"  run -n 1 -- true          {run_ms:7.1f} ms: {added:+.1f} ms  (target "
            f"+{RUN_TARGET_MS:.0f}: {'ok' if ok else 'MISSED'})"
        )

        job = (base, env, options.seconds)
        cli_rate, _ = _rate(_cli_client, job)
        ceiling, _ = _rate(_python_client, job)
        share = cli_rate / ceiling
        ok = share >= CLI_TARGET_SHARE
        missed |= not ok
        print(f"  command line, {CLIENTS} clients   {cli_rate:7.1f} alloc+release cycles/s")
        print(
            f"  python -c pass twice      {ceiling:7.1f} cycles/s: gpualloc reaches "
            f"{share:.0%}  (target {CLI_TARGET_SHARE:.0%}: {'ok' if ok else 'MISSED'})"
        )
        return 1 if missed else 0
    finally:
        broker.terminate()
        broker.wait(timeout=30)
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
