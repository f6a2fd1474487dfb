"""The host's job history (``gpualloc/ledger/history.py``): every lease that ends leaves one
record, appended by whoever writes the ledger in the same write (one append per transaction,
one per batch of the broker's), rotated past its size, never in the ledger's way.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest

from gpualloc.ledger import history
from gpualloc.ledger.statedir import StateDirectory
from tests.broker_harness import RunningBroker, hold_request
from tests.cli_harness import TIMEOUT_S, gpualloc_argv


def _records(state: Path) -> list[dict]:
    (path,) = state.glob("*.history.jsonl")
    return history.read_history(StateDirectory(path.parent, _scope(path)))


def _scope(path: Path) -> str | None:
    stem = path.name.removesuffix(".history.jsonl")
    return stem.partition("@")[2] or None


def _lease_id(result) -> str:
    line = next(x for x in result.stdout.splitlines() if "GPUALLOC_LEASE_ID=" in x)
    return line.split("=", 1)[1]


def test_each_lease_that_ends_leaves_one_record_saying_why(cli, tmp_path: Path) -> None:
    alloc = ("--topology", "dgx1-v100", "alloc", "--hold", "--format", "env")
    held = _lease_id(cli(*alloc, "-n", "2", "--name", "sweep"))
    limited = _lease_id(cli(*alloc, "-n", "1", "--time", "1s"))
    ran = subprocess.run(
        gpualloc_argv("run", "-n", "1", "--", "true"), capture_output=True, text=True,
        timeout=TIMEOUT_S, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert cli("--topology", "dgx1-v100", "release", held).exit_code == 0
    time.sleep(1.1)
    assert cli("--topology", "dgx1-v100", "gc").exit_code == 0
    records = {r["lease"]: r for r in _records(tmp_path / "state")}
    assert len(records) == 3
    released, timed_out = records.pop(held), records.pop(limited)
    (ended,) = records.values()
    assert released["state"] == "released" and released["name"] == "sweep"
    assert len(released["gpus"]) == 2 and released["predicted_gbps"] > 0
    assert released["user"] and released["start"] <= released["end"]
    assert timed_out["state"] == "timeout" and timed_out["time_limit_s"] == 1.0
    assert ended["state"] == "ended" and ended["source"] == "run"
    assert all(r["exit_status"] is None and r["queued"] is None for r in (released, ended))


def test_one_transaction_is_one_append(cli, monkeypatch: pytest.MonkeyPatch) -> None:
    alloc = ("--topology", "dgx1-v100", "alloc", "--hold", "--format", "env", "-n", "1")
    leases = [_lease_id(cli(*alloc)) for _ in range(3)]
    writes: list[bytes] = []
    real_write = os.write

    def counted(descriptor: int, data: bytes) -> int:
        if b'"lease"' in data:
            writes.append(data)
        return real_write(descriptor, data)

    monkeypatch.setattr(history.os, "write", counted)
    assert cli("--topology", "dgx1-v100", "release", *leases).exit_code == 0
    assert len(writes) == 1 and writes[0].count(b"\n") == 3


def test_a_lease_ended_in_a_batch_ends_when_it_left_not_when_the_batch_was_written(
    tmp_path: Path,
) -> None:
    """The broker writes a batch once, at its end: a lease released early in it, whose GPU
    went to the next lease later in it, must not read as overlapping that lease."""
    from gpualloc.ledger.owned_store import OwnedLedgerStore
    from gpualloc.ledger.statedir import open_broker_directory
    from tests.leases import held_lease

    store = OwnedLedgerStore(open_broker_directory(tmp_path / "broker"), host="h")
    assert store.hold_lock()
    first = held_lease(0)
    with store.transaction() as txn:
        txn.add(first)
    with store.batch():
        with store.transaction() as txn:
            txn.remove(first.id)
        time.sleep(0.05)
        second = held_lease(0)
        with store.transaction() as txn:
            txn.add(second)
        time.sleep(0.05)
    (record,) = history.read_history(store.directory)
    assert record["lease"] == first.id
    assert datetime.fromisoformat(record["end"]) < second.created


def test_the_history_is_rotated_past_its_size(cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(history, "MAX_BYTES", 200)
    alloc = ("--topology", "dgx1-v100", "alloc", "--hold", "--format", "env", "-n", "1")
    for _ in range(history.KEEP + 3):
        lease = _lease_id(cli(*alloc))
        assert cli("--topology", "dgx1-v100", "release", lease).exit_code == 0
    state = Path(os.environ["GPUALLOC_STATE_DIR"])
    (current,) = state.glob("*.history.jsonl")
    kept = sorted(p.name.rsplit(".", 1)[1] for p in state.glob("*.history.jsonl.*"))
    assert kept == [str(n) for n in range(1, history.KEEP + 1)]  # the oldest dropped
    assert current.stat().st_size < 400


def test_a_writer_that_may_not_rotate_the_history_still_appends(
    cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a shared sticky directory only the file's owner (or root) may rename it: another
    user's write past the size appends to the full file instead of losing its records."""
    monkeypatch.setattr(history, "MAX_BYTES", 10)
    alloc = ("--topology", "dgx1-v100", "alloc", "--hold", "--format", "env", "-n", "1")
    lease = _lease_id(cli(*alloc))
    assert cli("--topology", "dgx1-v100", "release", lease).exit_code == 0

    def refused(self: Path, target: Path) -> None:
        raise PermissionError(1, "Operation not permitted", str(self))

    monkeypatch.setattr(Path, "replace", refused)
    lease = _lease_id(cli(*alloc))
    assert cli("--topology", "dgx1-v100", "release", lease).exit_code == 0
    state = Path(os.environ["GPUALLOC_STATE_DIR"])
    assert [r["lease"] for r in _records(state)][-1] == lease


def test_a_file_planted_at_the_history_stops_no_release(cli, tmp_path: Path) -> None:
    alloc = ("--topology", "dgx1-v100", "alloc", "--hold", "--format", "env", "-n", "1")
    lease = _lease_id(cli(*alloc))
    state = tmp_path / "state"
    (ledger,) = [p for p in state.glob("ledger*.json") if ".good." not in p.name]
    planted = ledger.with_suffix(".history.jsonl")
    os.mkfifo(planted)  # a reader-less FIFO: opening it to write would hang
    assert cli("--topology", "dgx1-v100", "release", lease).exit_code == 0
    assert cli("--topology", "dgx1-v100", "status", "--json").stdout.count('"id"') == 0


def test_the_broker_writes_the_history_as_root(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the broker's tests run it as root (CI runs as root)")
    broker = RunningBroker("dgx1-v100").start()
    try:
        env = {k: v for k, v in os.environ.items() if k != "GPUALLOC_TOPOLOGY"}
        env["GPUALLOC_BROKER"] = str(broker.socket)
        argv = gpualloc_argv("alloc")[:3]
        held = subprocess.run(
            [*argv, "alloc", "--hold", "-n", "2", "--format", "env"], capture_output=True,
            text=True, env=env, timeout=TIMEOUT_S,
        )  # fmt: skip
        lease = _lease_id(held)
        done = subprocess.run([*argv, "release", lease], env=env, timeout=TIMEOUT_S)
        assert done.returncode == 0
        (path,) = broker.state.glob("*.history.jsonl")
        info = path.stat()
        assert info.st_uid == 0 and info.st_mode & 0o777 == 0o644
        (record,) = _records(broker.state)
        assert record["lease"] == lease and record["state"] == "released"
        quick = "c" * 12  # made and released in one batch of the broker's
        both = [
            {"v": 1, "op": "alloc", "args": hold_request(quick)},
            {"v": 1, "op": "release", "args": {"leases": [quick]}},
        ]
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.connect(str(broker.socket))
            connection.sendall(b"".join(json.dumps(x).encode() + b"\n" for x in both))
            with connection.makefile("rb") as answers:
                assert all(json.loads(answers.readline())["ok"] for _ in both)
        assert [r["lease"] for r in _records(broker.state)][-1] == quick
    finally:
        broker.stop()
        shutil.rmtree(broker.directory, ignore_errors=True)
