"""The broker's queue is fair between users, and stays fair under attack.

A user's one job starts before the second of another user's 32 (fair share), and what each user
had is saved beside the ledger and read back after a restart, decayed by the time away. One
user cannot jam the queue by naming another's waiter, nor stall it with jobs that user's own
leases block.

Every user may read the ledger (0644), so every waiter's id is public. On b2653dd a user who
sent an ``alloc`` with another user's waiter id as its ``lease_id`` got a lease under that id;
from then on the waiter's turn could never be recorded, no queued job of anyone started while
GPUs were free, and others' releases answered exit 11. Now an id in use is refused before any
work, and a turn that fails anyway drops and tells only its own waiter.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.broker_harness import RunningBroker, broker_leases, hold_request, running_broker
from tests.child_processes import end_all, finish
from tests.unix_users import UnixUser, UserCommandLine

TOPOLOGY = "dgx1-v100"
FOUR_GPUS = "nvlink-pairs-4gpu"
"""The host of the test whose one user holds all its GPUs, one lease each."""

JAM = """
import json, os, sys
from pathlib import Path
from gpualloc.wire.client import BrokerClient

socket, victim = Path(sys.argv[1]), sys.argv[2]
args = {
    "lease_id": victim,
    "options": {"policy": "mapa", "count": 1},
    "terms": {"source": "alloc", "pid": None, "hold": True, "command": [], "announce": False},
    "wait": None,
}
try:
    print(json.dumps({"answer": BrokerClient(socket).call("alloc", args)["lease"]["id"]}))
except Exception as problem:
    print(json.dumps({"refused": getattr(problem, "message", str(problem))}))
"""


@pytest.fixture
def broker() -> Iterator[RunningBroker]:
    yield from running_broker(TOPOLOGY)


def _until(condition: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _ledger(broker: RunningBroker) -> dict[str, Any]:
    """What every user may read: the broker's ledger file."""
    return {"queue": [], "leases": [], **broker.ledger()}


# ---- under attack --------------------------------------------------------------------------------


@pytest.mark.slow
def test_naming_another_users_waiter_is_refused_and_the_queue_keeps_moving(
    users: dict[str, UnixUser], broker: RunningBroker
) -> None:
    alice, bob, carol = users["alice"], users["bob"], users["carol"]
    as_user = UserCommandLine(alice)
    env = {"GPUALLOC_BROKER": str(broker.socket)}

    def gpualloc(user: UnixUser, *args: str) -> subprocess.CompletedProcess[str]:
        return as_user(user, *args, env=env)

    held = gpualloc(alice, "alloc", "--hold", "--gpus", "0-6", "--format", "json")
    assert held.returncode == 0, held.stderr
    alices = json.loads(held.stdout)["lease"]["id"]
    waiting = as_user.popen(
        bob, "run", "--wait", "-n", "2", "--", "sleep", "30", env=env
    )  # two GPUs: it waits while only GPU 7 is free
    try:
        _until(lambda: _ledger(broker)["queue"], "bob's waiter")
        (waiter,) = _ledger(broker)["queue"]
        jam = as_user._run(carol, [as_user.python, "-c", JAM, str(broker.socket), waiter["id"]], {})
        assert jam.returncode == 0, jam.stderr
        said = json.loads(jam.stdout)
        assert "refused" in said and "in use" in said["refused"], said
        assert not [x for x in _ledger(broker)["leases"] if x["id"] == waiter["id"]]

        released = gpualloc(alice, "release", alices)
        assert released.returncode == 0, released.stderr
        _until(
            lambda: any(x["user"] == bob.name for x in _ledger(broker)["leases"]),
            "bob's queued job to start once GPUs are free",
        )
        now = gpualloc(carol, "alloc", "--hold", "-n", "1", "--format", "json")
        assert now.returncode == 0, now.stderr
        carols = json.loads(now.stdout)["lease"]["id"]
        assert gpualloc(carol, "release", carols).returncode == 0
    finally:
        waiting.kill()
        waiting.communicate(timeout=30)


@pytest.mark.slow
def test_a_turn_that_fails_drops_and_tells_only_its_own_waiter(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker's queue, in process: the first waiter's turn fails when it is recorded; it
    alone is dropped with the error, and the waiter behind it starts in the same pass."""
    from gpualloc.broker.fair_share import FairShare
    from gpualloc.broker.peers import Peer
    from gpualloc.broker.service import LedgerService
    from gpualloc.config import Config
    from gpualloc.errors import LedgerError
    from gpualloc.host.local import LocalHost
    from gpualloc.host.queue_policy import QueuePolicy
    from gpualloc.topologies import load_bundled

    config = Config.load()
    host = LocalHost.open(load_bundled(TOPOLOGY), state_dir=tmp_path / "state", owner=True)
    service = LedgerService(host, QueuePolicy.from_config(config), FairShare(3600.0), config)
    monkeypatch.setattr(LedgerService, "_follow", lambda self, allocation: allocation)
    me = Peer(uid=0, gid=0, pid=__import__("os").getpid())
    wait = {"timeout_s": None, "priority": "normal", "max_bypass": 8}
    ids = []
    for lease_id in ("aaaaaaaaaaaa", "bbbbbbbbbbbb"):
        args = {
            "lease_id": lease_id,
            "options": {"policy": "mapa", "count": 1},
            "terms": {"source": "alloc", "pid": me.pid, "command": [], "announce": False},
            "wait": wait,
        }
        ids.append(service.alloc(me, args))
    record = LocalHost.record

    def failing(self: LocalHost, txn: Any, placement: Any, want: Any, terms: Any, **kw: Any):
        if terms.lease_id == "aaaaaaaaaaaa":
            raise LedgerError("this turn cannot be recorded")
        return record(self, txn, placement, want, terms, **kw)

    monkeypatch.setattr(LocalHost, "record", failing)
    started = service.turns()
    assert [(s.waiter_id, s.allocation is None) for s in started] == [
        ("aaaaaaaaaaaa", True),
        ("bbbbbbbbbbbb", False),
    ]
    assert started[0].error is not None and "cannot be recorded" in started[0].error.message
    assert not host.snapshot().ledger.queue, "the failed waiter stayed in the queue"


@pytest.mark.slow
def test_a_job_its_owner_blocks_does_not_freeze_other_users(
    users: dict[str, UnixUser], broker: RunningBroker
) -> None:
    """Through a real broker: alice holds GPU 0 and waits for all eight
    GPUs; bob's allocations keep starting on the seven free ones, past any ``max_bypass``."""
    alice, bob = users["alice"], users["bob"]
    as_user = UserCommandLine(alice)
    env = {"GPUALLOC_BROKER": str(broker.socket)}
    held = as_user(alice, "alloc", "--hold", "--gpus", "0", "--format", "json", env=env)
    assert held.returncode == 0, held.stderr
    waiting = as_user.popen(
        alice, "run", "--wait", "-n", "8", "--", "true", env=env
    )  # the broker's max_bypass: 8
    try:
        _until(lambda: _ledger(broker)["queue"], "alice's waiter")
        for _ in range(10):  # past the host's max_bypass of 8
            taken = as_user(bob, "alloc", "--hold", "-n", "1", "--format", "json", env=env)
            assert taken.returncode == 0, taken.stderr
            lease = json.loads(taken.stdout)["lease"]["id"]
            assert as_user(bob, "release", lease, env=env).returncode == 0
        assert _ledger(broker)["queue"][0]["passed_over"] == 0
    finally:
        waiting.kill()
        waiting.communicate(timeout=30)


# ---- fair share ----------------------------------------------------------------------------------


WAITERS = """
import json, socket, sys
path, count = sys.argv[1], int(sys.argv[2])
opened = []
for n in range(count):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    request = {"lease_id": "%012x" % (0xA0000000 + n), "options": {"policy": "mapa", "count": 1},
               "terms": {"source": "alloc", "hold": True}, "wait": {}}
    s.sendall(json.dumps({"v": 1, "op": "alloc", "args": request}).encode() + b"\\n")
    opened.append(s)
print("queued", flush=True)
sys.stdin.read()  # hold the connections until told
"""


@pytest.mark.slow
def test_a_users_one_job_starts_before_the_second_of_another_users_32(
    users: dict[str, UnixUser], as_user: UserCommandLine
) -> None:
    broker = RunningBroker(FOUR_GPUS).start()
    alice, bob, carol = users["alice"], users["bob"], users["carol"]
    env = {"GPUALLOC_BROKER": str(broker.socket)}
    clients: list[subprocess.Popen[str]] = []
    try:
        held = []
        for _ in range(4):
            out = as_user(carol, "alloc", "--hold", "--format", "json", env=env)
            held.append(json.loads(out.stdout)["lease"]["id"])
        many = subprocess.Popen(
            [as_user.python, "-c", WAITERS, str(broker.socket), "32"],
            user=alice.uid, group=alice.gid, extra_groups=[], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        clients.append(many)
        assert many.stdout and many.stdout.readline().strip() == "queued"
        queue = lambda: broker.call("snapshot")["ledger"]["queue"]  # noqa: E731
        _until(lambda: len(queue()) == 32, "alice's 32 waiters")
        one = as_user.popen(bob, "alloc", "--wait", "--hold", "--format", "json", env=env)
        clients.append(one)
        _until(lambda: len(queue()) == 33, "bob's waiter")

        def holders() -> list[str]:
            return sorted(x["user"] for x in broker_leases(broker) if x["user"] != carol.name)

        assert as_user(carol, "release", held[0], env=env).returncode == 0
        _until(lambda: holders() == [alice.name], "alice's first job")
        assert as_user(carol, "release", held[1], env=env).returncode == 0
        _until(lambda: len(holders()) == 2, "the next job")
        assert holders() == [alice.name, bob.name], "alice's second job started before bob's"
        out, err = finish(one, timeout_s=30)
        assert one.returncode == 0, err
        assert as_user(carol, "release", held[2], env=env).returncode == 0
        _until(lambda: holders() == [alice.name, alice.name, bob.name], "alice's second job")
        finish(many, input="", timeout_s=30)
        _until(lambda: not queue(), "alice's waiters to leave with their connections")
    finally:
        end_all(clients)
        broker.stop()
        shutil.rmtree(broker.directory, ignore_errors=True)


def test_fair_share_outlives_a_broker_restart(tmp_path: Path) -> None:
    """What a user had is saved beside the ledger and read back, decayed by the time away."""
    from gpualloc.broker.fair_share import FairShare

    path = tmp_path / "fair-share.json"
    before = FairShare(3600.0)
    before.usage = {1001: 7200.0, 1002: 10.0}
    before.save(path)
    after = FairShare(3600.0)
    after.load(path)
    assert after.usage[1001] == pytest.approx(7200.0, rel=1e-3)
    saved = json.loads(path.read_text())
    saved["saved"] -= 3600.0  # as if the broker had been down an hour: one half-life
    path.write_text(json.dumps(saved))
    later = FairShare(3600.0)
    later.load(path)
    assert later.usage[1001] == pytest.approx(3600.0, rel=1e-3)
    path.write_text("{not json")
    damaged = FairShare(3600.0)
    damaged.load(path)  # a damaged file forgives; it never stops the broker
    assert damaged.usage == {}


def test_a_failing_fair_share_save_is_said_once_a_minute(tmp_path: Path) -> None:
    """A save that fails (a full disk: the broker saves once a second) is one log line, said
    again a minute later while it fails, and once when it works again; never an exception."""
    from gpualloc.broker.fair_share import FairShare

    now, said = [0.0], []
    share = FairShare(3600.0, clock=lambda: now[0], log=said.append)
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    for second in range(125):
        now[0] = float(second)
        share.usage = {1001: float(second)}
        share.save(blocked / "fair-share.json")
    assert len(said) == 3 and all("could not be saved" in line for line in said), said
    share.save(tmp_path / "fair-share.json")
    assert len(said) == 4 and "saved again" in said[-1]
    assert json.loads((tmp_path / "fair-share.json").read_text())["usage"] == {"1001": 124.0}


def test_the_broker_saves_fair_share_beside_its_ledger(broker: RunningBroker) -> None:
    broker.call("alloc", hold_request("eeeeeeeeeeee", gpus=2))
    _until(lambda: (broker.state / "fair-share.json").exists(), "the fair-share file", 5)
    saved = json.loads((broker.state / "fair-share.json").read_text())
    _until(
        lambda: json.loads((broker.state / "fair-share.json").read_text())["usage"].get("0", 0) > 0,
        "root's GPU-seconds to count",
        5,
    )
    assert (broker.state / "fair-share.json").stat().st_mode & 0o777 == 0o644
    assert saved["saved"] > 0
