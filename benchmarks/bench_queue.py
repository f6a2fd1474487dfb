#!/usr/bin/env python3
"""Speed of the queue's decision at one event: who starts now, with EASY backfill
(gpualloc/host/backfill.py), for 100 waiting jobs on an 8-GPU host; the target is 10 ms at
the p99.

Run on its own: ``python benchmarks/bench_queue.py [--host dgx1-v100] [--waiters 100]
[--samples 200] [--seed 1]``. Each sample is a random host state (leases of 1, 2, 4 GPUs with
declared limits of minutes to hours, some with none) and a random queue (1 to 8 GPUs, half
with a limit; the head needs more GPUs than are free, so that it holds a reservation); it times
:func:`gpualloc.host.queue.next_start` as the broker asks it at each event, with a fresh
attempt function (no placement remembered from an earlier event), and prints the p50, p99
and maximum in milliseconds. Exits 1 when the p99 is over the target; no unit test times
anything.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpualloc.host.queue import attempts, backfill_of, next_start  # noqa: E402
from gpualloc.ledger.occupancy import Occupancy  # noqa: E402
from gpualloc.ledger.schema import Lease, LeasedGpu, Ledger, QueuedRequest, Waiter  # noqa: E402
from gpualloc.topologies import load_bundled  # noqa: E402

TARGET_MS = 10.0


def _state(rng: random.Random, gpu_count: int, now: datetime) -> list[Lease]:
    free = list(range(gpu_count))
    rng.shuffle(free)
    leases = []
    while len(free) > 1 and rng.random() < 0.8:
        size = min(rng.choice((1, 2, 4)), len(free) - 1)
        held, free = free[:size], free[size:]
        limit = None if rng.random() < 0.2 else rng.uniform(600, 4 * 3600)
        leases.append(
            Lease(
                id=f"{len(leases):012x}",
                gpus=tuple(LeasedGpu(index=g) for g in sorted(held)),
                uid=2000 + len(leases),
                user="bench",
                hold=True,
                created=now - timedelta(seconds=rng.uniform(0, 600)),
                source="alloc",
                time_limit_s=limit,
            )
        )
    return leases


def _queue(rng: random.Random, count: int, free: int, now: datetime) -> list[Waiter]:
    waiters = []
    for seq in range(count):
        gpus = free + 1 if seq == 0 else rng.choice((1, 1, 2, 2, 4, 8))
        waiters.append(
            Waiter(
                id=f"{0xB000000 + seq:012x}",
                seq=seq,
                uid=3000 + seq % 7,
                user="waiter",
                pid=1,
                request=QueuedRequest(gpus=min(gpus, 8), sensitive=gpus > 1),
                created=now,
                time_limit_s=rng.uniform(300, 7200) if rng.random() < 0.5 else None,
            )
        )
    return waiters


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="dgx1-v100")
    parser.add_argument("--waiters", type=int, default=100)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    topology = load_bundled(args.host)
    rng = random.Random(args.seed)
    times = []
    reserved = 0
    for _ in range(args.samples):
        now = datetime.now(timezone.utc)
        leases = _state(rng, topology.gpu_count, now)
        occupancy = Occupancy.build(topology, Ledger(host="bench", leases=leases))
        queue = _queue(rng, args.waiters, len(occupancy.free), now)
        started = time.perf_counter()
        attempt = attempts(topology, occupancy)
        backfill = backfill_of(topology, occupancy, attempt, now=now)
        next_start(queue, attempt, backfill=backfill)
        times.append((time.perf_counter() - started) * 1000)
        reserved += bool(backfill._reservations)
    times.sort()
    p50, p99 = times[len(times) // 2], times[min(len(times) - 1, int(len(times) * 0.99))]
    print(f"{args.host}, {args.waiters} waiters, {args.samples} states "
          f"({reserved} with a reservation): p50 {p50:.2f} ms, p99 {p99:.2f} ms, "
          f"max {times[-1]:.2f} ms (target p99 {TARGET_MS:g} ms)")  # fmt: skip
    return 0 if p99 <= TARGET_MS else 1


if __name__ == "__main__":
    sys.exit(main())
