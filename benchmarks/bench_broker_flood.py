#!/usr/bin/env python3
"""Another user's latency while one user floods the broker.

Run as root from the repository root: ``python benchmarks/bench_broker_flood.py [--seconds 10]``.
Starts a real broker (``gpualloc serve``) on a bundled topology with the default limits, and two
real Unix users: the flooder sends full ``snapshot`` requests, the dearest a user may ask, as
fast as the broker answers over four pipelined connections; the other user alloc+releases one
GPU through the library's client in a loop. Prints the flooder's requests answered and refused
a second and the other user's p50, p99 and maximum call latency, then the same with nobody
flooding. Target: the other user's p99 <= 20 ms under the flood. Exit status 1 on a missed target.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpualloc.errors import GpuallocError  # noqa: E402
from gpualloc.ledger.store import new_lease_id  # noqa: E402
from gpualloc.wire.client import BrokerClient  # noqa: E402
from tests.broker_harness import RunningBroker  # noqa: E402
from tests.unix_users import UnixUser, ensure_user, start_as_user, wait_for_user  # noqa: E402

P99_TARGET_MS = 20.0
SNAPSHOT = b'{"v":1,"op":"snapshot","args":{"full":true}}\n'


def _placements(count: int) -> bytes:
    """``count`` requests that each make the broker search anew: a
    10-GPU DRB job on the 32-GPU host, every one excluding another pair of GPUs, so that no
    answer the broker remembers fits, each followed by a release of what it got."""
    lines = []
    for i in range(count):
        first, second = i % 32, (i * 7 + 3) % 32
        options = {"count": 10, "sensitive": True, "policy": "drb",
                   "exclude": sorted({first, second})}  # fmt: skip
        alloc = {"lease_id": new_lease_id(), "options": options,
                 "terms": {"source": "alloc", "hold": True}}  # fmt: skip
        lines.append(json.dumps({"v": 1, "op": "alloc", "args": alloc}).encode() + b"\n")
        lines.append(b'{"v":1,"op":"release","args":{"mine":true}}\n')
    return b"".join(lines)


def _flood(path: Path, seconds: float, report: int, kind: str = "snapshot") -> None:
    """Full snapshots (or searching placements, ``kind``) over 4 connections, 16 in flight on
    each, for ``seconds``; a connection the broker closes is opened again at once (as a
    flooder would)."""
    answered = refused = reconnects = 0
    connections: list = [None] * 4
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for i in range(len(connections)):
            if connections[i] is None:
                try:
                    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    s.settimeout(10)
                    s.connect(str(path))
                    connections[i] = (s, s.makefile("rb"))
                    reconnects += 1
                except OSError:
                    continue
            s, reader = connections[i]
            try:
                s.sendall(SNAPSHOT * 16 if kind == "snapshot" else _placements(8))
                for _ in range(16):
                    line = reader.readline()
                    if not line:
                        raise ConnectionResetError
                    if b'"ok":true' in line:
                        answered += 1
                    else:
                        refused += 1
            except OSError:
                s.close()
                connections[i] = None
    summary = {"answered": answered, "refused": refused, "connections": reconnects}
    os.write(report, json.dumps(summary).encode())


def _work(path: Path, seconds: float, report: int) -> None:
    """Alloc and release one GPU again and again; every call's latency in ms."""
    client = BrokerClient(path, answer_s=30)
    times: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        began = time.perf_counter()
        try:
            made = client.call(
                "alloc",
                {"lease_id": new_lease_id(), "options": {"policy": "mapa", "count": 1},
                 "terms": {"source": "alloc", "hold": True}},
            )  # fmt: skip
        except GpuallocError:
            made = None
        times.append((time.perf_counter() - began) * 1000)
        if made is not None:
            began = time.perf_counter()
            client.call("release", {"leases": [made["lease"]["id"]]})
            times.append((time.perf_counter() - began) * 1000)
        time.sleep(0.005)
    os.write(report, json.dumps(times).encode())


def _read(fd: int) -> object:
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    os.close(fd)
    return json.loads(b"".join(chunks))


def _round(
    broker: RunningBroker,
    worker: UnixUser,
    flooder: UnixUser | None,
    seconds: float,
    kind: str = "snapshot",
):
    work_r, work_w = os.pipe()
    flood_r, flood_w = os.pipe()
    pids = [
        (
            start_as_user(worker.uid, worker.gid, lambda: _work(broker.socket, seconds, work_w)),
            worker.uid,
        )
    ]
    if flooder is not None:
        flood = start_as_user(
            flooder.uid, flooder.gid, lambda: _flood(broker.socket, seconds, flood_w, kind)
        )
        pids.append((flood, flooder.uid))
    os.close(work_w)
    os.close(flood_w)
    times = _read(work_r)
    flood = _read(flood_r) if flooder is not None else None
    for pid, uid in pids:
        wait_for_user(pid, uid)
    return times, flood


def _line(label: str, times: list[float]) -> str:
    ordered = sorted(times)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return (
        f"{label}: {len(times)} calls, p50 {statistics.median(ordered):.2f} ms, "
        f"p99 {p99:.2f} ms, max {ordered[-1]:.2f} ms"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--topology", default="dgx1-v100")
    parser.add_argument(
        "--flood",
        choices=("snapshot", "placement"),
        default="snapshot",
        help="what the flooder sends: full snapshots, or 10-GPU DRB allocations that each "
        "search anew on a 32-GPU PCIe host (then --topology is that host)",
    )
    options = parser.parse_args()
    if os.geteuid() != 0:
        print("run as root: the flooder and the worker are real Unix users", file=sys.stderr)
        return 2
    flooder, worker = ensure_user("gpualloc-t-alice"), ensure_user("gpualloc-t-bob")
    topology = options.topology
    if options.flood == "placement":
        import msgspec

        from gpualloc.topologies import load_bundled

        made = Path(tempfile.mkdtemp(prefix="gpualloc-flood-")) / "pcie-32gpu-2socket.json"
        made.write_bytes(msgspec.json.encode(load_bundled("pcie-32gpu-2socket")))
        made.parent.chmod(0o755)
        topology = str(made)
    broker = RunningBroker(topology).start()
    try:
        quiet, _ = _round(broker, worker, None, options.seconds)
        flooded, flood = _round(broker, worker, flooder, options.seconds, options.flood)
    finally:
        broker.stop()
        shutil.rmtree(broker.directory, ignore_errors=True)
    print(f"broker on {Path(topology).stem}, default limits, {options.seconds:g} s each")
    print(_line("another user's alloc/release, nobody flooding", quiet))
    assert isinstance(flood, dict)
    what = "full snapshots" if options.flood == "snapshot" else "searching allocs and releases"
    print(
        f"flooder: {flood['answered'] / options.seconds:.0f} {what} a second answered, "
        f"{flood['refused'] / options.seconds:.0f} refused (broker.max_requests_per_s), "
        f"{flood['connections'] / options.seconds:.0f} connections made a second (most refused)"
    )
    print(_line("another user's alloc/release, under the flood", flooded))
    ordered = sorted(flooded)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    verdict = "met" if p99 <= P99_TARGET_MS else "MISSED"
    print(f"target p99 <= {P99_TARGET_MS:g} ms under the flood: {verdict}")
    return 0 if p99 <= P99_TARGET_MS else 1


if __name__ == "__main__":
    sys.exit(main())
