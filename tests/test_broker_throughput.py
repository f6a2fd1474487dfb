"""The broker's throughput: what it does not do again on every request. It does not search a
placement it found for the same request on the same free GPUs, wait for ext4 to write out a
ledger it renames into place (an unsynced write is preallocated), read ``/proc`` for a peer it
has read already, or write once per answer and log line where a turn of its loop has several
(``benchmarks/bench_broker.py`` measures what that buys)."""

from __future__ import annotations

import io
import json
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpualloc.atomic import write_text_atomic
from gpualloc.broker import server
from gpualloc.broker.log import log_lines
from gpualloc.host import local
from gpualloc.host.lease_terms import LeaseTerms
from gpualloc.host.local import LocalHost
from gpualloc.ledger.store import new_lease_id
from gpualloc.model.request import JobRequest
from gpualloc.placement.mapa.patterns import build_pattern
from gpualloc.placement.want import Want
from gpualloc.topologies import load_bundled
from tests.broker_harness import TurnedBroker


def _want(gpus: int, **fields: Any) -> Want:
    return Want(request=JobRequest(gpus, build_pattern("ring", gpus), True), **fields)


@pytest.fixture
def searches(monkeypatch: pytest.MonkeyPatch) -> list[Want]:
    """Every search the host runs, by request."""
    made: list[Want] = []

    def counting(function: Any) -> Any:
        def counted(topology: Any, occupancy: Any, want: Want, **kwargs: Any) -> Any:
            made.append(want)
            return function(topology, occupancy, want, **kwargs)

        return counted

    monkeypatch.setattr(local, "choose", counting(local.choose))
    monkeypatch.setattr(local, "searched", counting(local.searched))
    return made


def _host(tmp_path: Path, memo: bool) -> LocalHost:
    host = LocalHost.open(load_bundled("dgx1-v100"), state_dir=tmp_path / "state")
    host.placement_memo = {} if memo else None
    return host


def _cycle(host: LocalHost, want: Want) -> tuple[int, ...]:
    made = host.allocate(want, LeaseTerms(source="alloc", hold=True))
    host.release_leases([made.lease.id])
    return made.lease.indices


def test_the_same_request_on_the_same_free_gpus_is_searched_once(
    tmp_path: Path, searches: list[Want]
) -> None:
    host = _host(tmp_path, memo=True)
    two, three = _want(2), _want(3)
    first = [_cycle(host, two) for _ in range(5)]
    assert len(set(first)) == 1 and len(searches) == 1
    _cycle(host, three)
    assert len(searches) == 2  # another request: searched
    held = host.allocate(_want(1), LeaseTerms(source="alloc", hold=True))
    assert len(searches) == 3
    _cycle(host, two)  # another host state (one GPU held): searched again
    assert len(searches) == 4
    host.release_leases([held.lease.id])
    assert _cycle(host, two) == first[0] and len(searches) == 4  # the first state again


def test_answers_are_the_searchs_own(tmp_path: Path, searches: list[Want]) -> None:
    remembered, searched = _host(tmp_path / "a", memo=True), _host(tmp_path / "b", memo=False)
    for gpus in (1, 2, 3, 4, 2, 1, 3):
        assert _cycle(remembered, _want(gpus)) == _cycle(searched, _want(gpus))


def test_explicit_lists_are_not_remembered(tmp_path: Path, searches: list[Want]) -> None:
    host = _host(tmp_path, memo=True)
    for _ in range(3):
        _cycle(host, _want(2, explicit=(4, 5)))
    assert len(searches) == 3 and host.placement_memo == {}


def test_the_memo_is_forgotten_at_its_bound(
    tmp_path: Path, searches: list[Want], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local, "MAX_REMEMBERED_PLACEMENTS", 2)
    host = _host(tmp_path, memo=True)
    for gpus in (1, 2, 3):
        _cycle(host, _want(gpus))
    assert host.placement_memo is not None and len(host.placement_memo) == 1


@pytest.mark.parametrize("fallocate_works", [True, False])
def test_an_unsynced_atomic_write_holds_its_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fallocate_works: bool
) -> None:
    asked: list[int] = []

    def fallocate(descriptor: int, offset: int, length: int) -> None:
        asked.append(length)
        if not fallocate_works:
            raise OSError(95, "Operation not supported")

    monkeypatch.setattr(os, "posix_fallocate", fallocate)
    path = tmp_path / "ledger.json"
    path.write_text("an old and much longer text than the new one\n")
    write_text_atomic(path, "ünïcode\n", mode=0o644, sync=False)
    assert path.read_text(encoding="utf-8") == "ünïcode\n"
    assert asked == [len("ünïcode\n".encode())]  # its bytes, not its characters
    assert path.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["ledger.json"]  # no temporary left


def test_a_synced_write_is_not_preallocated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "posix_fallocate", lambda *args: pytest.fail("preallocated"))
    write_text_atomic(tmp_path / "x", "text", sync=True)
    assert (tmp_path / "x").read_text() == "text"


# ---- the broker's loop, in this process ------------------------------------------------------


@pytest.fixture
def turned(tmp_path: Path) -> Iterator[TurnedBroker]:
    broker = TurnedBroker(tmp_path)
    try:
        yield broker
    finally:
        broker.close()


def _hold_line(gpus: int = 1) -> bytes:
    """An ``alloc --hold`` request as the broker's clients send it."""
    args = {
        "lease_id": new_lease_id(),
        "options": {"policy": "mapa", "count": gpus, "sensitive": True},  # _want(gpus)
        "terms": {"source": "alloc", "hold": True},
        "wait": None,
    }
    return json.dumps({"v": 1, "op": "alloc", "args": args}).encode() + b"\n"


@pytest.fixture
def proc_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every file of ``/proc/<this process>/`` opened (the peer of the test's connections)."""
    mine = f"/proc/{os.getpid()}/"
    opened: list[str] = []

    def counting(function: Any) -> Any:
        def counted(path: Any, *args: Any, **kwargs: Any) -> Any:
            if str(path).startswith(mine):
                opened.append(str(path))
            return function(path, *args, **kwargs)

        return counted

    monkeypatch.setattr(os, "open", counting(os.open))
    monkeypatch.setattr(io, "open", counting(io.open))  # pathlib's read_text opens with it
    return opened


def test_a_connection_reads_its_peers_proc_facts_once(
    turned: TurnedBroker, proc_reads: list[str]
) -> None:
    """The peer's real uid and start time are read at its first request that needs them,
    not at every request: four leases over one connection read what one lease over another
    reads (``--hold``: no other process of the test is read)."""
    first = turned.connect()
    first.sendall(_hold_line() + _hold_line())
    assert all(a["ok"] for a in turned.answers(first, 2))
    first.sendall(_hold_line() + _hold_line())
    assert all(a["ok"] for a in turned.answers(first, 2))
    four = len(proc_reads)
    assert four > 0
    second = turned.connect()
    second.sendall(_hold_line())
    assert turned.answers(second, 1)[0]["ok"]
    assert len(proc_reads) - four == four  # another connection reads them once, as well
    first.close()
    second.close()


def test_a_turns_answers_go_out_in_one_write_per_connection(
    turned: TurnedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three requests that arrive together are answered in one turn: one write to their
    connection, after the ledger write, and one write to the log for the turn's two
    leases."""
    monkeypatch.setattr(server, "USER_SLICE_S", 60.0)  # as root's: none waits a turn
    client = turned.connect()
    client.sendall(b'{"v":1,"op":"hello","args":{}}\n' + _hold_line(2) + _hold_line(3))
    writes: list[set[str]] = []
    ledger = turned.broker.service.store.directory.ledger_file

    def send(connection: socket.socket, data: Any, *args: Any) -> int:
        writes.append({lease["id"] for lease in json.loads(ledger.read_text())["leases"]})
        return real_send(connection, data, *args)

    real_send = socket.socket.send
    monkeypatch.setattr(socket.socket, "send", send)
    answers = turned.answers(client, 3)
    assert [a["ok"] for a in answers] == [True, True, True]
    (written,) = writes  # one write, once the ledger holds both leases it tells of
    assert {a["result"]["lease"]["id"] for a in answers[1:]} == written
    assert len(turned.logged) == 1 and len(turned.logged[0]) == 2, turned.logged
    assert all("lease" in line for line in turned.logged[0])
    client.close()


def test_the_log_writes_a_turns_lines_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    written: list[str] = []

    class Stream:
        def write(self, text: str) -> None:
            written.append(text)

        def flush(self) -> None:
            pass

    monkeypatch.setattr(sys, "stderr", Stream())
    log_lines(["root: lease a", "internal error:\nTraceback\x1b[2J"])
    (text,) = written
    lines = text.splitlines()
    assert len(lines) == 3 and text.endswith("\n")
    assert lines[0].endswith(" gpualloc serve: root: lease a")
    assert lines[2] == "    Traceback\\x1b[2J"  # indented, its escape sequence shown
