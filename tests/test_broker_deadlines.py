"""Every client call has a deadline, and a request whose client has gone is not
applied.

On b2653dd, with the broker stopped (SIGSTOP), ``alloc`` and root's ``slurm prolog`` hung
silently until killed, and the broker applied their requests after it resumed: an orphan hold
nobody would release. Now a client waits ``host.broker_timeout`` of silence at most (a waiting
job hears from the broker every few seconds, so only a stopped or stalled broker runs it out),
and the broker drops a change whose client closed its connection. A full state disk is said as a
full disk.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker_harness import RunningBroker, running_broker

pytestmark = pytest.mark.slow


@pytest.fixture
def broker() -> Iterator[RunningBroker]:
    yield from running_broker("dgx1-v100")


def _gpualloc(
    broker: RunningBroker, *args: str, timeout: str | None
) -> subprocess.CompletedProcess:
    """``gpualloc ARGS`` through ``broker``, waiting ``timeout`` for it (None: the default)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUALLOC_")}
    env.update(GPUALLOC_BROKER=str(broker.socket))
    if timeout is not None:
        env.update(GPUALLOC_BROKER_TIMEOUT=timeout)
    return subprocess.run(
        [sys.executable, "-m", "gpualloc", *args],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip


def _asked_stopped(
    broker: RunningBroker, *args: str, timeout: str | None
) -> tuple[subprocess.CompletedProcess, float]:
    """``gpualloc ARGS`` while the broker is stopped (SIGSTOP); its result and how long it took."""
    assert broker.process is not None
    os.kill(broker.process.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        asked = _gpualloc(broker, *args, timeout=timeout)
        return asked, time.monotonic() - started
    finally:
        os.kill(broker.process.pid, signal.SIGCONT)


def test_a_stopped_broker_is_said_at_the_deadline_and_the_request_is_not_applied(
    broker: RunningBroker,
) -> None:
    asked, took = _asked_stopped(broker, "alloc", "--hold", "-n", "1", timeout="2s")
    assert asked.returncode == 18, asked.stderr
    assert "busy or stopped" in asked.stderr and took < 30
    time.sleep(1.0)  # the broker, running again, reads the request and its client's hang-up
    assert broker.call("snapshot", {"full": True})["ledger"]["leases"] == []
    assert "whose client has gone: not applied" in broker.log_text()


def _hold_line(index: int, gpus: int = 1, **more: object) -> bytes:
    args = {
        "lease_id": f"{index:012x}",
        "options": {"policy": "mapa", "count": gpus, "sensitive": False},
        "terms": {"source": "alloc", "hold": True},
        **more,
    }
    return json.dumps({"v": 1, "op": "alloc", "args": args}).encode() + b"\n"


def _answered(connection: socket.socket) -> None:
    """Until the broker's answer waits in ``connection``, unread."""
    connection.settimeout(30)
    assert connection.recv(1, socket.MSG_PEEK), "the broker closed without an answer"


def test_an_alloc_whose_client_goes_before_reading_its_answer_is_undone(
    broker: RunningBroker,
) -> None:
    """A lease stands only for a client that got its answer. An alloc closed just after
    sending could become a lease nobody was told of when the broker checked for a hang-up
    before applying, not after answering. Closing with the answer unread, or having
    shut the socket for reading, made such a lease every time, as did a waiting client gone
    before reading the answer its turn sent."""
    holder = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    holder.connect(str(broker.socket))
    holder.sendall(_hold_line(60, gpus=8))
    with holder, holder.makefile("rb") as reader:
        assert json.loads(reader.readline())["ok"]
    waiter = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    waiter.connect(str(broker.socket))
    waiter.sendall(_hold_line(61, wait={}))
    time.sleep(0.5)  # in the queue
    broker.call("release", {"leases": [f"{60:012x}"]})  # its turn: its lease, its answer sent
    deadline = time.monotonic() + 10
    while f"lease {61:012x} from the queue" not in broker.log_text():
        assert time.monotonic() < deadline, broker.log_text()[-2000:]
        time.sleep(0.05)
    waiter.close()
    unread = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unread.connect(str(broker.socket))
    unread.sendall(_hold_line(1))
    _answered(unread)
    unread.close()  # its answer unread: the broker hears ECONNRESET
    deaf = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    deaf.connect(str(broker.socket))
    deaf.shutdown(socket.SHUT_RD)  # the broker's answer cannot be written
    deaf.sendall(_hold_line(2))
    time.sleep(1.0)  # open meanwhile: the request is applied, its answer fails
    deaf.close()
    burst = []
    for index in range(3, 53):  # the race: send, close at once
        quick = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        quick.connect(str(broker.socket))
        quick.sendall(_hold_line(index))
        burst.append(quick)
    for quick in burst:
        quick.close()
    told = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # read, then closed: it stands
    told.connect(str(broker.socket))
    told.sendall(_hold_line(99))
    with told, told.makefile("rb") as reader:
        kept = json.loads(reader.readline())["result"]["lease"]["id"]
    deadline = time.monotonic() + 10
    while True:
        leases = [lease["id"] for lease in broker.call("snapshot")["ledger"]["leases"]]
        if leases == [kept] or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert leases == [kept], broker.log_text()[-3000:]
    log = broker.log_text()
    assert f"lease {1:012x} released: its client went before reading its id" in log
    assert f"lease {2:012x} released: its client went before reading its id" in log
    assert f"lease {61:012x} released: its client went before reading its id" in log


def test_a_stopped_broker_is_said_after_slurms_message_timeout_by_default(
    broker: RunningBroker,
) -> None:
    """Unset, the deadline is Slurm's MessageTimeout default (slurm.conf: 10 s), not 30 s."""
    asked, took = _asked_stopped(broker, "release", "--mine", timeout=None)
    assert asked.returncode == 18, asked.stderr
    assert "said nothing for 10 s" in asked.stderr and 10 <= took < 20, (took, asked.stderr)


def test_a_waiting_client_outlives_its_silence_deadline(broker: RunningBroker) -> None:
    """The broker says something to a waiting client every few seconds: a wait longer than
    the deadline ends by the queue's own --timeout (exit 124), not by the deadline."""
    held = _gpualloc(broker, "alloc", "--hold", "-n", "8", "--format", "json", timeout="2s")
    assert held.returncode == 0, held.stderr
    waited = _gpualloc(
        broker, "alloc", "--hold", "--wait", "--timeout", "12", "-n", "1", timeout="2s"
    )
    assert waited.returncode == 124, waited.stderr
    lease = json.loads(held.stdout)["lease"]["id"]
    assert _gpualloc(broker, "release", lease, timeout="2s").returncode == 0


def test_a_wait_longer_than_the_idle_timeout_ends_by_its_own_timeout(tmp_path: Path) -> None:
    """A waiter's --timeout answer is held back until its batch is written; its connection,
    with no waiter left and nothing in its outbox yet, was closed as idle in the same turn
    once the wait had outlasted ``broker.idle_timeout`` (60 s by default): exit 18, "the broker
    closed the connection", instead of the timeout's exit 124. (A waiter started in a turn
    that looks for idle connections lost its lease's answer the same way.)"""
    config = tmp_path / "system.toml"
    config.write_text('[broker]\nidle_timeout = "1s"\n')
    config.chmod(0o644)
    broker = RunningBroker("dgx1-v100", system_config=config).start()
    try:
        held = _gpualloc(broker, "alloc", "--hold", "-n", "8", timeout="10s")
        assert held.returncode == 0, held.stderr
        waited = _gpualloc(
            broker, "alloc", "--hold", "--wait", "--timeout", "3", "-n", "1", timeout="10s"
        )
        assert waited.returncode == 124, waited.stderr
        assert "no GPUs for this job within 3 s" in waited.stderr
    finally:
        broker.stop()


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs (root, and a kernel that lets the test mount; skips otherwise)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False, timeout=120)


def _fill(disk: Path) -> Path:
    """``disk`` filled to its last byte by one file (returned, for the test to remove)."""
    filler = disk / "filler"
    with contextlib.suppress(OSError), filler.open("wb") as handle:
        while True:
            handle.write(b"x" * 4096)
            handle.flush()
    return filler


def test_a_waiter_on_a_full_state_disk_hears_why_at_once(tiny_disk: Path) -> None:
    """On 4d2ba32 a job queued while the state disk was full heard nothing until its client's
    deadline (exit 18, "busy or stopped"): its entry was never written and the failed write
    was said only to the clients with an answer. And the broker logged a traceback a second
    for its fair-share file. Now the waiter hears the full disk (exit 8) at once, and the log
    says the fair share's failure once."""
    from gpualloc.errors import ExitCode

    broker = RunningBroker("dgx1-v100")
    broker.state = tiny_disk / "state"
    broker.start()
    try:
        assert _gpualloc(broker, "alloc", "--hold", "-n", "8", timeout="30s").returncode == 0
        began = time.monotonic()
        assert _gpualloc(broker, "status", "--json", timeout="30s").returncode == 0
        baseline = time.monotonic() - began  # a client's own start-up, on this machine now
        filler = _fill(tiny_disk)
        # A 6 KB command: its waiter's entry cannot fit the ledger file's last page.
        job = ["run", "--wait", "--timeout", "60", "-n", "1", "--", "true", "y" * 6000]
        began = time.monotonic()
        full = _gpualloc(broker, *job, timeout="30s")
        took = time.monotonic() - began
        assert full.returncode == ExitCode.IO, full.stderr
        assert "the file system is full" in full.stderr and "the ledger is unchanged" in full.stderr
        assert took < baseline + 1.0, (took, baseline)
        time.sleep(3.5)  # the broker tries to save the fair share once a second meanwhile
        log = broker.log_text()
        assert "Traceback" not in log, log[-3000:]
        assert log.count("fair share could not be saved") == 1, log[-3000:]
        assert broker.call("snapshot", {"full": True})["ledger"]["queue"] == []
        filler.unlink()
        again = _gpualloc(broker, "release", "--mine", timeout="30s")
        assert again.returncode == 0, again.stderr
    finally:
        broker.stop()


def test_a_full_state_disk_is_said_as_a_full_disk(tiny_disk: Path) -> None:
    """On b2653dd a full state disk was reported as "the broker does not answer ... start it",
    after 10 s of retries; now every client of the failed write is told the disk is full."""
    from gpualloc.errors import ExitCode

    broker = RunningBroker("dgx1-v100")
    broker.state = tiny_disk / "state"
    broker.start()
    try:
        assert _gpualloc(broker, "alloc", "--hold", "-n", "1", timeout="30s").returncode == 0
        filler = _fill(tiny_disk)
        # The broker writes in place: a ledger that still fits its file's pages is written;
        # one that outgrows them, with leases named as long as a name may be, is not.
        granted = 1
        for _ in range(7):
            started = time.monotonic()
            full = _gpualloc(
                broker, "alloc", "--hold", "-n", "1", "--name", "x" * 128, timeout="30s"
            )
            if full.returncode != 0:
                break
            granted += 1
        assert full.returncode == ExitCode.IO, full.stderr
        assert "the file system is full" in full.stderr and "the ledger is unchanged" in full.stderr
        assert "free space on the file system" in full.stderr
        assert time.monotonic() - started < 8, "the client retried as if the broker had died"
        filler.unlink()
        again = _gpualloc(broker, "alloc", "--hold", "-n", "1", timeout="30s")
        assert again.returncode == 0, again.stderr
        leases = broker.call("snapshot", {"full": True})["ledger"]["leases"]
        assert len(leases) == granted + 1
        assert broker.ledger()["leases"] == leases  # the file is whole again, and the same
    finally:
        broker.stop()
