"""``run --wait`` / ``alloc --wait`` end to end: real processes on a bundled topology, and a
waiter's timeout through the broker.

Tests synchronise on what the processes report (the queue as ``status --json`` shows it, lines
the jobs print, exits), never on fixed sleeps.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.broker_harness import RunningBroker, hold_request, running_broker, through_broker
from tests.child_processes import end_all, finish
from tests.cli_harness import TIMEOUT_S, gpualloc, gpualloc_argv, status

STARTED: list[subprocess.Popen] = []
"""The waiters the running test started (:func:`_started`)."""


@pytest.fixture(autouse=True)
def _waiters_end_with_the_test() -> Iterator[None]:
    """A waiter a failed test left in the queue would wait for ever: it ends with its test."""
    yield
    try:
        end_all(STARTED)
    finally:
        STARTED.clear()


def _started(process: subprocess.Popen) -> subprocess.Popen:
    STARTED.append(process)
    return process


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for: {what}"
        time.sleep(0.05)


def _queued(count: int) -> Callable[[], bool]:
    return lambda: len(status()["queue"]) == count


def _hold(gpus: str) -> str:
    result = gpualloc("alloc", "--hold", "--gpus", gpus, "--format", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["lease"]["id"]


def _waiter(*args: str) -> subprocess.Popen:
    argv = gpualloc_argv("run", "--wait", *args)
    return _started(
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    )


def _finish(process: subprocess.Popen) -> tuple[int, str, str]:
    out, err = finish(process, timeout_s=TIMEOUT_S)
    return process.returncode, out, err


def test_a_waiter_starts_when_the_holder_releases_on_the_pair_plan_would_choose() -> None:
    everything = _hold("0-7")
    waiter = _waiter("-n", "2", "--sensitive", "--", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES")
    _until(_queued(1), "the waiter to join the queue")
    (entry,) = status()["queue"]
    assert entry["position"] == 1 and entry["request"]["gpus"] == 2 and entry["seq"] == 0
    assert gpualloc("release", everything).returncode == 0
    code, out, err = _finish(waiter)
    assert code == 0, err
    planned = json.loads(gpualloc("plan", "-n", "2", "--sensitive", "--json").stdout)["gpus"]
    assert out == ",".join(map(str, planned)) + "\n"
    # Not a terminal: plain status lines saying what it waits for and who holds the GPUs.
    assert "#1 of 1 in the queue: the job needs 2 GPUs" in err
    assert "held by " in err
    assert status()["queue"] == []


def test_timeout_exits_124_and_leaves_the_queue() -> None:
    _hold("0-7")
    result = gpualloc("run", "--wait", "--timeout", "0.5", "--", "true")
    assert result.returncode == 124
    assert "no GPUs for this job within 0.5 s" in result.stderr
    assert status()["queue"] == []
    assert gpualloc("run", "--timeout", "5", "--", "true").returncode == 2  # needs --wait
    assert gpualloc("run", "--wait", "--timeout", "soon", "--", "true").returncode == 2


def test_postponement_waits_for_an_nvlinked_pair_even_with_two_gpus_free() -> None:
    """DGX-1: with GPUs 1 and 4 free (no NVLink between them: PCIe across the sockets), a
    sensitive pair job with --min-bandwidth waits; when 5-7 come free it takes an NVLinked pair
    there, the pair 'plan' chooses on those GPUs."""
    _hold("0,2,3")
    right = _hold("5-7")
    waiter = _waiter("-n", "2", "--min-bandwidth", "20", "--", "sh", "-c", "echo $GPUALLOC_GPUS")
    _until(_queued(1), "the waiter to join the queue")
    now = gpualloc("run", "-n", "2", "--min-bandwidth", "20", "--", "true")
    assert now.returncode == 10 and "below --min-bandwidth 20" in now.stderr
    assert gpualloc("release", right).returncode == 0
    code, out, err = _finish(waiter)
    assert code == 0, err
    chosen = [int(g) for g in out.split(",")]
    planned = json.loads(gpualloc("plan", "-n", "2", "--busy", "0,2,3", "--json").stdout)
    assert chosen == planned["gpus"] and planned["scores"]["effective_gbps"] >= 20
    assert 1 not in chosen or 4 not in chosen


@pytest.mark.parametrize("wait", [["--wait"], []], ids=["wait", "no-wait"])
def test_a_threshold_no_placement_can_meet_is_refused_at_once(wait: list[str]) -> None:
    """Exit 9 with or without --wait: telling the user to --wait for it (exit 10) was wrong."""
    result = gpualloc("run", "-n", "2", *wait, "--min-bandwidth", "5000", "--", "true")
    assert result.returncode == 9 and "wait forever" in result.stderr
    assert "--wait" not in result.stderr


def test_min_utility_postpones_by_drb_utility() -> None:
    """With GPU 0 held, DRB's utility of every free pair drops (interference with the running
    job, fragmentation): a threshold between the two keeps the job out until GPU 0 is free."""
    idle = json.loads(gpualloc("plan", "-n", "2", "--policy", "drb", "--json").stdout)
    busy = json.loads(
        gpualloc("plan", "-n", "2", "--policy", "drb", "--busy", "0", "--json").stdout
    )
    threshold = (idle["scores"]["utility"] + busy["scores"]["utility"]) / 2
    assert busy["scores"]["utility"] < threshold < idle["scores"]["utility"]
    held = _hold("0")
    args = ["-n", "2", "--policy", "drb", "--min-utility", f"{threshold:.6f}"]
    refused = gpualloc("run", *args, "--", "true")
    assert refused.returncode == 10 and "below --min-utility" in refused.stderr
    waiter = _waiter(*args, "--", "sh", "-c", "echo $GPUALLOC_GPUS")
    _until(_queued(1), "the waiter to queue")
    assert gpualloc("release", held).returncode == 0
    code, out, err = _finish(waiter)
    assert code == 0, err
    assert out.strip() == ",".join(map(str, idle["gpus"]))


def _hold_for_another_user(gpus: str, time_limit_s: float | None = None) -> Callable[[], None]:
    """GPUs held by a lease of another uid (what makes a waiting job blocked by others, to
    which ``--max-bypass`` applies), written as the broker writes its peers' leases; returns
    its release."""
    from gpualloc.host.lease_terms import LeaseTerms
    from gpualloc.host.local import LocalHost
    from gpualloc.model.request import JobRequest
    from gpualloc.placement.mapa.patterns import build_pattern
    from gpualloc.placement.want import Want
    from gpualloc.topologies import load_bundled

    chosen = tuple(range(int(gpus.split("-")[0]), int(gpus.split("-")[1]) + 1))
    host = LocalHost.open(load_bundled("dgx1-v100"), ignore_foreign=True)
    request = JobRequest(len(chosen), build_pattern("ring", len(chosen)), sensitive=False)
    other = 54321
    lease = host.allocate(
        Want(request, explicit=chosen),
        LeaseTerms(source="alloc", hold=True, uid=other, time_limit_s=time_limit_s),
    ).lease
    return lambda: host.release_leases([lease.id], uid=other) and None


def test_a_job_that_ends_before_a_blocked_jobs_reservation_starts_and_passes_nobody() -> None:
    """EASY backfill (gpualloc/host/backfill.py): another user's hour on GPUs 0-5 is the
    blocked 8-GPU job's wait; a 1-GPU job of ten minutes ends before it and starts without
    counting as a pass, while one with no --time waits, told why."""
    _hold_for_another_user("0-5", time_limit_s=3600.0)
    big = _waiter("-n", "8", "--max-bypass", "1", "--", "true")
    _until(_queued(1), "the 8-GPU job to queue")
    for _ in range(2):  # more than its --max-bypass: these passes prove they delay it not
        short = gpualloc("run", "-n", "1", "--wait", "--timeout", "60", "--time", "10", "--",
                         "true")  # fmt: skip
        assert short.returncode == 0, short.stderr
    assert status()["queue"][0]["passed_over"] == 0
    endless = gpualloc("run", "-n", "1", "--wait", "--timeout", "0.5", "--", "true")
    assert endless.returncode == 124
    assert "8-GPU job starts by " in endless.stderr and "no --time" in endless.stderr
    assert big.poll() is None
    shown = gpualloc("status").stdout  # the head's reservation, in squeue's words
    assert "it starts by " in shown and "on GPU 0-7, by the running jobs' time limits" in shown


def test_backfill_lets_small_jobs_pass_a_blocked_big_one_but_not_forever() -> None:
    release = _hold_for_another_user("0-5")  # GPUs 6 and 7 free
    big = _waiter("-n", "4", "--max-bypass", "1", "--", "true")
    _until(_queued(1), "the 4-GPU job to queue")
    small = gpualloc("run", "-n", "1", "--wait", "--timeout", "60", "--", "true")
    assert small.returncode == 0  # passed the blocked 4-GPU job
    assert status()["queue"][0]["passed_over"] == 1
    refused = gpualloc("run", "-n", "1", "--wait", "--timeout", "0.5", "--", "true")
    assert refused.returncode == 124  # two GPUs free, but the big job may not be passed again
    assert "passed over 1 time: no more backfill" in refused.stderr
    jumper = gpualloc("run", "-n", "1", "--", "true")  # not waiting does not mean not queueing
    assert jumper.returncode == 10 and "may not pass it" in jumper.stderr
    release()
    assert _finish(big)[0] == 0


def test_a_job_its_own_owners_lease_blocks_freezes_nobody() -> None:
    """A user holds GPU 0 and waits for all 8; that job can never start
    while its own lease stands, so it neither stops backfill nor counts as passed over: other
    jobs start on the 7 free GPUs as often as they like."""
    held = _hold("0")
    big = _waiter("-n", "8", "--max-bypass", "1", "--", "true")
    _until(_queued(1), "the 8-GPU job to queue")
    for _ in range(3):  # more than --max-bypass
        assert gpualloc("run", "-n", "1", "--", "true").returncode == 0
        assert gpualloc("run", "-n", "1", "--wait", "--timeout", "30", "--", "true").returncode == 0
    (entry,) = status()["queue"]
    assert entry["passed_over"] == 0  # and status says why, and what that count counts:
    assert entry["reason"].startswith("Resources: the job needs 8 GPUs and 7 usable ones")
    assert entry["reason"].endswith("and do not count against its --max-bypass")
    shown = gpualloc("status").stdout
    assert " 0/1 " in shown and "Passed/max" in shown and "Resources: the job needs" in shown
    assert gpualloc("release", held).returncode == 0
    assert _finish(big)[0] == 0


def test_priority_high_goes_before_an_earlier_normal_job(tmp_path: Path) -> None:
    held = _hold("0-7")
    order = tmp_path / "order.txt"
    normal = _waiter("-n", "8", "--", "sh", "-c", f"echo normal >> {order}")
    _until(_queued(1), "the normal job to queue")
    high = _waiter("-n", "8", "--priority", "high", "--", "sh", "-c", f"echo high >> {order}")
    _until(_queued(2), "the high-priority job to queue")
    assert [w["priority"] for w in status()["queue"]] == ["high", "normal"]  # turn order
    assert gpualloc("release", held).returncode == 0
    assert _finish(high)[0] == 0 and _finish(normal)[0] == 0
    assert order.read_text() == "high\nnormal\n"


def test_a_killed_or_interrupted_waiter_leaves_no_entry() -> None:
    _hold("0-7")
    killed = _waiter("--", "true")
    _until(_queued(1), "the waiter to queue")
    killed.kill()
    _finish(killed)
    assert status()["queue"] == []  # left out at once by every reader
    collected = gpualloc("gc")
    assert "waiting 1-GPU job from the queue" in collected.stdout  # and dropped by a writer
    interrupted = _waiter("--", "true")
    _until(_queued(1), "the waiter to queue")
    interrupted.send_signal(signal.SIGINT)
    code, _, err = _finish(interrupted)
    assert code == 130 and "Traceback" not in err
    assert json.loads(Path(_ledger_file()).read_text())["queue"] == []  # removed, not reaped


def test_an_interrupted_waiter_says_where_it_stood_and_what_it_left() -> None:
    """It printed a bare "interrupted"."""
    import re

    _hold("0-7")
    waiter = _waiter("-n", "2", "--", "true")
    assert waiter.stderr is not None
    line = waiter.stderr.readline()  # its first waiting line: it has a place in the queue
    assert "#1 of 1 in the queue" in line, line
    waiter.send_signal(signal.SIGINT)
    code, _, err = _finish(waiter)
    assert code == 130, err
    assert re.fullmatch(
        r"error: interrupted while waiting in the queue \(#1 of 1, for \d+s\); the job left "
        r"the queue and holds no GPU\n",
        err,
    ), err
    assert status()["queue"] == []


def test_the_brokers_waiting_line_is_drawn_and_interrupted_as_the_ledgers() -> None:
    """A waiting status as the broker sends it (an event on its socket) reaches the status line
    as the embedded ledger's does: drawn with its length and wait, and said when interrupted."""
    from gpualloc.cli.open_ledger import StatusLine, wait_line
    from gpualloc.host.brokered import _reporter
    from gpualloc.host.terms import WaitStatus

    heard: list[WaitStatus] = []
    _reporter(heard.append)({"position": 3, "queue_length": 5, "reason": "the job needs 8 GPUs",
                             "holders": "held by bob: 0-7", "waited_s": 65.0})  # fmt: skip
    (status,) = heard
    assert wait_line(status, 200).startswith("gpualloc: waiting 1m, #3 of 5 in the queue")
    line = StatusLine()
    line.show(status)
    assert line.interrupted().message == (
        "interrupted while waiting in the queue (#3 of 5, for 1m); the job left the queue and "
        "holds no GPU"
    )
    assert line.interrupted().exit_code == 130


@pytest.fixture
def broker() -> Iterator[RunningBroker]:
    yield from running_broker("nvlink-pairs-4gpu")


def test_a_waiters_timeout_is_kept_to_and_says_why(broker: RunningBroker) -> None:
    broker.call("alloc", hold_request("ffffffffffff", gpus=4))
    started = time.monotonic()
    waiter = through_broker(broker, "alloc", "--wait", "--timeout", "1.5", "--hold")
    _, err = finish(waiter, timeout_s=30)
    assert waiter.returncode == 124, err
    assert time.monotonic() - started < 5
    assert "no GPUs for this job within 1.5 s (the job needs 1 GPU and" in err
    assert not broker.call("snapshot")["ledger"]["queue"]


def _ledger_file() -> str:
    return status()["ledger"]


@pytest.mark.slow
def test_32_waiters_on_8_gpus_all_run_and_never_share_a_gpu(tmp_path: Path) -> None:
    log = tmp_path / "log.txt"
    job = (
        "import os, sys, time\n"
        "gpu = os.environ['GPUALLOC_GPUS']\n"
        "def note(what):\n"
        "    with open(sys.argv[1], 'a') as f: f.write(f'{gpu} {what} {time.monotonic()}\\n')\n"
        "note('start'); time.sleep(0.2); note('end')\n"
    )
    script = tmp_path / "job.py"
    script.write_text(job)
    waiters = [
        _waiter("-n", "1", "-q", "--", sys.executable, str(script), str(log)) for _ in range(32)
    ]
    for waiter in waiters:
        code, _, err = _finish(waiter)
        assert code == 0, err
    events: dict[str, list[tuple[float, str]]] = {}
    for line in log.read_text().splitlines():
        gpu, what, when = line.split()
        events.setdefault(gpu, []).append((float(when), what))
    assert sum(len(e) for e in events.values()) == 64  # 32 starts, 32 ends
    for gpu, timeline in events.items():
        kinds = [what for _, what in sorted(timeline)]
        assert kinds == ["start", "end"] * (len(kinds) // 2), f"GPU {gpu} was shared"
    assert status()["queue"] == [] and status()["leases"] == []


def test_alloc_wait_gets_a_lease_when_gpus_free() -> None:
    held = _hold("0-7")
    waiter = _started(
        subprocess.Popen(
            gpualloc_argv("alloc", "--wait", "--hold", "-n", "2", "--format", "json"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    )
    _until(_queued(1), "alloc to queue")
    assert gpualloc("release", held).returncode == 0
    code, out, err = _finish(waiter)
    assert code == 0, err
    assert json.loads(out)["lease"]["source"] == "alloc"


def test_on_a_terminal_the_status_line_is_redrawn_in_place_and_cleared() -> None:
    import os
    import pty

    held = _hold("0-7")
    master, slave = pty.openpty()
    waiter = _started(
        subprocess.Popen(
            gpualloc_argv("run", "--wait", "-q", "--", "true"),
            stdout=subprocess.DEVNULL,
            stderr=slave,
        )
    )
    os.close(slave)
    seen = b""
    while seen.count(b"\r\x1b[Kgpualloc: waiting") < 2:  # drawn, then redrawn over itself
        chunk = os.read(master, 4096)
        assert chunk, seen
        seen += chunk
    assert b"#1 of 1 in the queue" in seen and b"\n" not in seen
    assert gpualloc("release", held).returncode == 0
    assert waiter.wait(TIMEOUT_S) == 0
    try:
        while chunk := os.read(master, 4096):
            seen += chunk
    except OSError:  # EIO: the terminal's last writer has gone
        pass
    os.close(master)
    assert seen.endswith(b"\r\x1b[K")  # the line is cleared before the job starts
