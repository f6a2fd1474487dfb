"""One byte cannot brick the ledger.

Python hands argv bytes that are not UTF-8 over as lone surrogates (``$'\\xff\\xfe'`` becomes
``"\\udcff\\udcfe"``), and JSON can carry them as ``"\\udcff"``. One stored in a lease made every
later command of every user fail, and a restarted broker exit at once. Now:

- a lease name holding one is refused at the door (command line, library, wire), and a command's
  words are kept with it escaped (``\\xff``): the rule is :mod:`gpualloc.host.terms`'s;
- the ledger writes only what it reads back (a change that would not is refused, nothing
  written);
- a record on disk that cannot be read is left out and kept aside with a note that ``status``
  shows, and every other lease stays.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest

from gpualloc.errors import ExitCode, GpuallocError, LedgerError, RequestError
from gpualloc.ledger.document import parse_ledger, written_ledger
from gpualloc.ledger.statedir import open_broker_directory, open_state_directory
from gpualloc.ledger.store import LedgerStore
from tests.broker_harness import ROOT, RunningBroker, running_broker
from tests.cli_harness import Result
from tests.leases import held_lease

TOPOLOGY = "dgx1-v100"
NOT_UTF8 = "\udcff\udcfe"
"""What Python makes of the argv bytes ff fe (surrogateescape)."""


def _status(cli: Callable[..., Result]) -> dict:
    result = cli("--topology", TOPOLOGY, "status", "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def _everything_still_works(cli: Callable[..., Result]) -> None:
    """status, a new allocation and ``release --mine`` all answer, for anyone."""
    _status(cli)
    made = cli("--topology", TOPOLOGY, "alloc", "--hold", "-n", "1")
    assert made.exit_code == 0, made.stderr
    released = cli("--topology", TOPOLOGY, "release", "--mine")
    assert released.exit_code == 0, released.stderr
    assert _status(cli)["leases"] == []


# ---- the door: names refused, command words escaped -----------------------------------------


def test_a_name_that_is_not_utf8_is_refused_and_every_command_still_works(cli) -> None:
    refused = cli("--topology", TOPOLOGY, "alloc", "--hold", "--name", NOT_UTF8)
    assert refused.exit_code == ExitCode.USAGE, refused.stderr
    assert "not UTF-8" in refused.stderr and "internal error" not in refused.stderr
    assert "--name '\\xff\\xfe'" in refused.stderr  # shown as the bytes typed, one line
    _everything_still_works(cli)


def test_the_wire_refuses_such_a_name_and_escapes_command_words() -> None:
    from gpualloc.broker import requests as wire
    from gpualloc.config import Config

    assert wire.words(["sh", "\udcff", "caf\udcc3", "\ud800"]) == (
        "sh",
        "\\xff",
        "caf\\xc3",
        "\\ud800",
    )
    assert wire.words(["ü 日本"]) == ("ü 日本",)  # UTF-8 text is kept as it is
    with pytest.raises(RequestError, match="not UTF-8"):
        wire.text(NOT_UTF8, "name")
    with pytest.raises(RequestError, match="not valid UTF-8"):
        wire.options_want({"policy": "mapa", "pattern": "ring\udcff"}, Config.load())


def test_lease_terms_keep_the_command_escaped_and_refuse_the_name() -> None:
    from gpualloc.host.lease_terms import LeaseTerms

    terms = LeaseTerms(source="run", pid=os.getpid(), command=("./tr\udce4in", "--x"))
    assert terms.command == ("./tr\\xe4in", "--x")
    with pytest.raises(RequestError, match="not UTF-8"):
        LeaseTerms(source="alloc", hold=True, name=NOT_UTF8)


@pytest.mark.slow
def test_raw_argv_bytes_as_a_name_brick_nothing(tmp_path: Path) -> None:
    """The real entry point, with the bytes themselves in argv."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def gpualloc(*args: str | bytes) -> subprocess.CompletedProcess[bytes]:
        argv = [sys.executable, "-m", "gpualloc", "--topology", TOPOLOGY, *args]
        return subprocess.run(argv, env=env, capture_output=True, timeout=60)

    refused = gpualloc("alloc", "--hold", "--name", b"\xff\xfe")
    assert refused.returncode == ExitCode.USAGE, refused.stderr
    assert b"not UTF-8" in refused.stderr
    for args in (("status",), ("alloc", "--hold", "-n", "2"), ("release", "--mine"), ("status",)):
        done = gpualloc(*args)
        assert done.returncode == 0, (args, done.stderr)


@pytest.mark.slow
def test_a_run_whose_command_is_not_utf8_records_it_escaped_and_bricks_nothing(
    tmp_path: Path, cli
) -> None:
    """``run -- sh -c '...' $'\\xff'``: the job runs with its own bytes; its lease keeps them
    escaped, and ``status`` inside and after the job answers."""
    seen = tmp_path / "status.json"
    script = f'exec "$0" -m gpualloc --topology {TOPOLOGY} status --json > "$1"'
    argv = [
        sys.executable, "-m", "gpualloc", "--topology", TOPOLOGY, "run", "--",
        "sh", "-c", script, sys.executable, str(seen), b"\xff",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(argv, env=env, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    (lease,) = json.loads(seen.read_text())["leases"]
    assert lease["command"] == ["sh", "-c", script, sys.executable, str(seen), "\\xff"]
    _everything_still_works(cli)


# ---- the broker --------------------------------------------------------------------------------


@pytest.fixture
def broker() -> Iterator[RunningBroker]:
    yield from running_broker(TOPOLOGY)


def _hold(lease_id: str, **terms: object) -> dict:
    return {
        "lease_id": lease_id,
        "options": {"policy": "mapa", "count": 1},
        "terms": {"source": "alloc", "hold": True, **terms},
    }


@pytest.mark.slow
def test_lone_surrogates_over_the_wire_brick_neither_the_broker_nor_its_restart(
    broker: RunningBroker,
) -> None:
    with pytest.raises(OSError, match="not UTF-8"):
        broker.call("alloc", _hold("aaaaaaaaaaaa", name=NOT_UTF8))
    bad_request = {**_hold("bbbbbbbbbbbb")}
    bad_request["options"] = {**bad_request["options"], "pattern": "ring\udcff"}
    with pytest.raises(OSError, match=r"not (valid )?UTF-8"):
        broker.call("alloc", bad_request)
    for options in ({"\udcff": 1}, {"policy": "mapa", "count": "\udcff"}):  # the fuzzer's
        fast = {"lease_id": "dddddddddddd", "options": options, "terms": _hold("d")["terms"]}
        with pytest.raises(OSError, match=r"not (valid )?UTF-8"):
            broker.call("alloc", fast)
    made = broker.call("alloc", _hold("cccccccccccc", command=["sh", "\udcff", "\ud800"]))
    assert made["lease"]["command"] == ["sh", "\\xff", "\\ud800"]
    (lease,) = broker.call("snapshot")["ledger"]["leases"]
    assert lease["id"] == "cccccccccccc"
    broker.stop()
    broker.start()  # a broker that restarts reads what it wrote
    (lease,) = broker.call("snapshot")["ledger"]["leases"]
    assert lease["command"] == ["sh", "\\xff", "\\ud800"]
    assert broker.call("release", {"leases": ["cccccccccccc"]})["released"]


# ---- the ledger writes only what it reads back ---------------------------------------------------


def test_a_change_the_ledger_could_not_read_back_is_refused_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    store = LedgerStore(open_state_directory(tmp_path / "state"), host="h")
    kept = held_lease(0, name="train")
    with store.transaction() as txn:
        txn.add(kept)
    before = store.directory.ledger_file.read_bytes()
    good_copy = store.directory.good_copy(os.geteuid()).read_bytes()
    for bad in (
        held_lease(1, name=NOT_UTF8),
        held_lease(2, command=("sh", "\udcff")),
        held_lease(3, pid=0),
    ):
        with pytest.raises(LedgerError, match="would not read back"), store.transaction() as txn:
            txn.add(bad)
    assert store.directory.ledger_file.read_bytes() == before
    assert store.directory.good_copy(os.geteuid()).read_bytes() == good_copy
    assert store.read().ledger.leases == [kept]


def test_in_a_broker_batch_such_a_change_fails_alone(tmp_path: Path) -> None:
    from gpualloc.ledger.owned_store import OwnedLedgerStore

    store = OwnedLedgerStore(open_broker_directory(tmp_path / "broker"), host="h")
    assert store.hold_lock()
    good = held_lease(1)
    with store.batch():
        with pytest.raises(LedgerError, match="not UTF-8"), store.transaction() as txn:
            txn.add(held_lease(0, name=NOT_UTF8))
        with store.transaction() as txn:
            txn.add(good)
    assert store.read().ledger.leases == [good]


# ---- a record that cannot be read is set aside ---------------------------------------------------


def _damage(state: Path, how: str, *, good_copy: bool = True) -> tuple[str, str]:
    """Damage the first lease of the ledger and of its writer's good copy (what a writer that
    stored it would have left): the damaged lease's id and the other's."""
    ids = []
    for path in sorted(state.glob("ledger@*.json")):  # the ledger and the good copy
        if path.name.endswith(".good.json") and not good_copy:
            continue
        data = json.loads(path.read_text())
        damaged = data["leases"][0]
        if how == "not-utf8":
            damaged["name"] = NOT_UTF8
        else:
            damaged["gpus"] = "zero"
        path.write_text(json.dumps(data, separators=(",", ":")) + "\n")
        ids = [lease["id"] for lease in data["leases"]]
    return ids[0], ids[1]


@pytest.mark.parametrize("how", ["not-utf8", "wrong-type"])
def test_a_damaged_lease_record_is_set_aside_and_the_others_stay(
    cli, tmp_path: Path, how: str
) -> None:
    for _ in range(2):
        made = cli("--topology", TOPOLOGY, "alloc", "--hold", "-n", "1")
        assert made.exit_code == 0, made.stderr
    state = tmp_path / "state"
    bad, kept = _damage(state, how)

    status = _status(cli)
    assert [lease["id"] for lease in status["leases"]] == [kept]
    (note,) = [note for note in status["notes"] if bad in note]
    assert "cannot be read" in note and "left out" in note
    assert ("name: text that is not UTF-8" if how == "not-utf8" else "gpus: expected") in note

    made = cli("--topology", TOPOLOGY, "alloc", "--hold", "-n", "1")  # a write sets it aside
    assert made.exit_code == 0, made.stderr
    (quarantine,) = state.glob("ledger@*.quarantine.jsonl")
    (entry,) = [json.loads(line) for line in quarantine.read_text().splitlines()]
    assert entry["label"] == bad and entry["record"]["id"] == bad
    status = _status(cli)
    assert kept in [lease["id"] for lease in status["leases"]]
    assert not [note for note in status["notes"] if bad in note]
    _everything_still_works(cli)


def test_a_record_damaged_in_the_ledger_alone_is_recovered_whole_from_the_named_good_copy(
    cli, tmp_path: Path
) -> None:
    """A hand edit of ``ledger.json`` alone: the good copy its header names still holds the
    lease readable, so nothing is set aside (the recovery :mod:`gpualloc.ledger.store` made
    before)."""
    for _ in range(2):
        assert cli("--topology", TOPOLOGY, "alloc", "--hold", "-n", "1").exit_code == 0
    bad, kept = _damage(tmp_path / "state", "not-utf8", good_copy=False)
    status = _status(cli)
    assert sorted(lease["id"] for lease in status["leases"]) == sorted([bad, kept])
    assert any("recovered generation" in note for note in status["notes"])
    assert not list((tmp_path / "state").glob("*.quarantine.jsonl"))


@pytest.mark.slow
def test_a_broker_restarted_on_a_ledger_with_a_damaged_record_starts_and_sets_it_aside(
    broker: RunningBroker,
) -> None:
    for lease_id in ("dddddddddddd", "eeeeeeeeeeee"):
        broker.call("alloc", _hold(lease_id))
    broker.stop()
    for path in broker.state.glob("ledger*.json"):  # the ledger and the broker's good copy
        data = json.loads(path.read_text())
        data["leases"][0]["name"] = NOT_UTF8  # as the broker once wrote it
        bad = data["leases"][0]["id"]
        path.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    broker.start()
    leases = broker.call("snapshot")["ledger"]["leases"]
    assert [lease["id"] for lease in leases] == [
        i for i in ("dddddddddddd", "eeeeeeeeeeee") if i != bad
    ]
    broker.call("alloc", _hold("ffffffffffff"))  # a write sets it aside
    (quarantine,) = broker.state.glob("ledger*.quarantine.jsonl")
    assert bad in quarantine.read_text()


# ---- the broker writes in place, and recovers a torn ledger from its good copy ------------------


def _broker_files(broker: RunningBroker) -> tuple[Path, Path]:
    (ledger,) = [p for p in broker.state.glob("ledger*.json") if ".good." not in p.name]
    (good,) = broker.state.glob("ledger*.0.good.json")
    return ledger, good


@pytest.mark.slow
def test_the_broker_rewrites_its_files_in_place(broker: RunningBroker) -> None:
    """A rename per batch made ext4 flush the new file: after the first
    write, the ledger and the good copy keep their inodes."""
    broker.call("alloc", _hold("aaaaaaaaaaaa"))
    ledger, good = _broker_files(broker)
    inodes = (ledger.stat().st_ino, good.stat().st_ino)
    broker.call("alloc", _hold("bbbbbbbbbbbb"))
    broker.call("release", {"leases": ["aaaaaaaaaaaa"]})
    assert (ledger.stat().st_ino, good.stat().st_ino) == inodes
    assert ledger.read_bytes() == good.read_bytes()
    assert [lease["id"] for lease in broker.ledger()["leases"]] == ["bbbbbbbbbbbb"]


@pytest.mark.slow
@pytest.mark.parametrize("good_copy", ["whole", "torn"])
def test_a_broker_killed_while_writing_its_ledger_loses_nothing(
    broker: RunningBroker, good_copy: str
) -> None:
    """A broker killed in the middle of its in-place write leaves the start of the new text
    over the old one; the next broker recovers the leases from its good copy, written whole
    before. Where that copy is torn too (only a crash of the machine can do both), it starts
    empty, as before."""
    for lease_id in ("cccccccccccc", "dddddddddddd"):
        broker.call("alloc", _hold(lease_id))
    broker.stop()
    ledger, good = _broker_files(broker)
    old = ledger.read_text()
    written = parse_ledger(old, "the test's ledger")
    written.leases[0] = msgspec.structs.replace(written.leases[0], name="the next write")
    new, _ = written_ledger(written, 0)  # the next generation, as the killed broker wrote it
    good.write_text(new)  # its good copy, written whole first
    ledger.write_text(new[:300] + old[300:])  # then stopped midway through the ledger
    if good_copy == "torn":
        good.write_text(new[:300] + old[300:])
    broker.start()
    leases = broker.call("snapshot")["ledger"]["leases"]
    if good_copy == "whole":
        assert [(lease["id"], lease["name"]) for lease in leases] == [
            ("cccccccccccc", "the next write"),
            ("dddddddddddd", None),
        ]
        assert f"recovered generation {written.generation}" in broker.log_text()
    else:
        assert leases == [] and "starting with an empty ledger" in broker.log_text()
    assert list(broker.state.glob("ledger*.damaged-*"))


@pytest.mark.parametrize("first_write_of_the_run", [True, False])
def test_a_broker_write_that_fails_on_the_ledger_puts_its_good_copy_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first_write_of_the_run: bool
) -> None:
    """The good copy is written first; when ``ledger.json`` then cannot be (a full disk), the
    copy goes back to what it held, so that a broker started on a torn ledger recovers what its
    clients were told, not the change that failed."""
    import errno

    from gpualloc.ledger import owned_store
    from gpualloc.ledger.owned_store import OwnedLedgerStore

    directory = open_broker_directory(tmp_path / "broker")
    store = OwnedLedgerStore(directory, host="h")
    assert store.hold_lock()
    kept = held_lease(1)
    with store.transaction() as txn:
        txn.add(kept)
    if first_write_of_the_run:  # a broker started anew: nothing written by it yet
        store._held.release()
        store = OwnedLedgerStore(directory, host="h")
        assert store.hold_lock()
    good = directory.good_copy(os.geteuid())
    before = good.read_bytes()
    real = owned_store.rewrite_own_copy

    def disk_full_for_the_ledger(path: Path, data: bytes, generation: int) -> bool:
        if path == directory.ledger_file:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, data, generation)

    monkeypatch.setattr(owned_store, "rewrite_own_copy", disk_full_for_the_ledger)
    full = r"the file system is full .*the ledger is unchanged"
    with pytest.raises(GpuallocError, match=full), store.transaction() as txn:
        txn.add(held_lease(2))
    assert good.read_bytes() == before
    assert store.read().ledger.leases == [kept]
