"""How long a lease lives when its job misbehaves, and what a user sees of a lease nobody knows:
real processes, real process groups, real kills."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpualloc.topologies import load_bundled
from tests.child_processes import end
from tests.cli_harness import TIMEOUT_S, gpualloc, gpualloc_argv, status

pytestmark = pytest.mark.slow

DAEMONISING_JOB = """\
import os, sys, time
if os.fork() == 0:
    if "--setsid" in sys.argv:
        os.setsid()
    os.closerange(3, 1024)  # drops the inherited lease lock, as daemon helpers do
    with open(sys.argv[1], "w") as out:
        out.write(str(os.getpid()))
    time.sleep(120)
    os._exit(0)
"""


def _daemonise(tmp_path: Path, topology: str, *flags: str) -> int:
    """Run a job that leaves a daemon child behind and exits; the daemon's pid."""
    script = tmp_path / "job.py"
    script.write_text(DAEMONISING_JOB)
    pid_file = tmp_path / "daemon.pid"
    # A shell with job control starts each job as the leader of its own process group.
    log = tmp_path / "run.log"
    with log.open("w") as output:  # not a pipe: the daemon keeps its stdout and stderr open
        result = subprocess.run(
            gpualloc_argv("run", "--gpus", "0", "--", sys.executable, str(script),
                          str(pid_file), *flags, topology=topology),
            stdout=output, stderr=output, timeout=TIMEOUT_S, start_new_session=True,
        )  # fmt: skip
    assert result.returncode == 0, log.read_text()
    deadline = time.monotonic() + TIMEOUT_S
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return int(pid_file.read_text())


def _end(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + TIMEOUT_S
    while Path(f"/proc/{pid}").exists():
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_a_daemon_child_that_closed_the_lease_lock_keeps_the_gpus_through_the_job_group(
    tmp_path: Path,
) -> None:
    daemon = _daemonise(tmp_path, "dgx1-v100")
    try:
        (lease,) = status()["leases"]
        assert lease["process_group"] == lease["pid"] and lease["gpus"][0]["index"] == 0
        assert gpualloc("gc").returncode == 0
        assert status()["gpus"][0]["state"] == "held"  # the job is gone; its daemon is not
    finally:
        _end(daemon)
    assert status()["gpus"][0]["state"] == "free"


def test_a_daemon_that_left_the_group_keeps_the_gpus_while_it_runs_on_them(
    tmp_path: Path,
) -> None:
    """setsid as well: only the GPU's process list still ties it to the lease."""
    plain = tmp_path / "dgx1.json"
    data = load_bundled("dgx1-v100").to_json_dict()
    plain.write_text(json.dumps(data))
    daemon = _daemonise(tmp_path, str(plain), "--setsid")
    seen = tmp_path / "dgx1-seen.json"  # the same GPUs (one ledger) and what NVML would list
    seen.write_text(json.dumps({**data, "processes": [{"gpu": 0, "pid": daemon}]}))
    try:
        assert status(str(plain))["gpus"][0]["state"] == "free"  # nothing seen on the GPU
        held = status(str(seen))
        assert held["gpus"][0]["state"] == "held", held
        other = seen.with_name("dgx1-other.json")  # the daemon on GPU 1: not the lease's
        other.write_text(json.dumps({**data, "processes": [{"gpu": 1, "pid": daemon}]}))
        assert status(str(other))["gpus"][0]["state"] == "free"
    finally:
        _end(daemon)


def test_an_alloc_killed_before_it_printed_the_id_leaves_a_lease_status_marks(
    tmp_path: Path,
) -> None:
    # A reader that never reads: alloc blocks writing its output and is killed there.
    reader, writer = os.pipe()
    filler = b"x" * 65536
    os.set_blocking(writer, False)  # fill the pipe: the next write blocks
    try:
        while True:
            os.write(writer, filler)
    except BlockingIOError:
        pass
    os.set_blocking(writer, True)
    alloc = subprocess.Popen(
        gpualloc_argv("alloc", "-n", "2", "--hold", "--format", "json"),
        stdout=writer, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    os.close(writer)
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not status()["leases"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        end(alloc)  # blocked in its write to the full pipe until killed
        os.close(reader)
    (lease,) = status()["leases"]
    assert lease["orphaned"] and not lease["announced"]
    text = gpualloc("status").stdout
    assert "ORPHANED" in text and "release --mine" in text
    freed = gpualloc("release", "--mine", "--json")
    assert freed.returncode == 0 and status()["leases"] == []


def test_an_alloc_that_printed_its_id_confirms_the_lease() -> None:
    made = gpualloc("alloc", "-n", "1", "--hold", "--format", "json")
    assert made.returncode == 0, made.stderr
    (lease,) = status()["leases"]
    assert lease["announced"] and not lease["orphaned"] and lease["creator_pid"] is None


def test_whoever_reaps_sees_the_gpus_processes_even_when_ignoring_foreign_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lease kept by a process on its GPU must not be reaped by the next command just because
    that command was told to ignore foreign processes (--ignore-foreign, the Slurm hooks): NVML
    is asked then too, once, and only when a lease looks dead."""
    from datetime import datetime, timezone

    import gpualloc.host.local as allocate
    from gpualloc.discovery.processes import ProcessReport
    from gpualloc.ledger.schema import Lease, LeasedGpu
    from gpualloc.model.topology import GpuProcess

    topology = load_bundled("dgx1-v100")
    lease = Lease(
        id="0123456789ab", gpus=(LeasedGpu(index=3),), uid=os.getuid(), user="me",
        pid=2**22 - 1, created=datetime.now(timezone.utc), source="run",
    )  # fmt: skip
    daemon = subprocess.Popen(["sleep", "60"])
    asked = []

    def nvml(_topology) -> ProcessReport:
        asked.append(1)
        return ProcessReport([GpuProcess(gpu=3, pid=daemon.pid)], source="nvml")

    monkeypatch.setattr(allocate, "describes_this_host", lambda _topology: True)
    monkeypatch.setattr(allocate, "live_processes", nvml)
    try:
        host = allocate.LocalHost.open(topology, ignore_foreign=True)
        assert host.processes.source == "none" and asked == []  # not asked up front
        with host.transaction() as txn:
            txn.add(lease)
        for _ in range(2):
            assert [x.id for x in host.snapshot().ledger.leases] == [lease.id]
        assert asked == [1]
    finally:
        end(daemon)
    fresh = allocate.LocalHost.open(topology, ignore_foreign=True)
    assert fresh.snapshot().ledger.leases == []  # its process is gone: reaped
