"""The broker's queue stays fair under attack: one user cannot jam it by naming another's
waiter, nor stall it with jobs that user's own leases block.

Every user may read the ledger (0644), so every waiter's id is public. On b2653dd a user who
sent an ``alloc`` with another user's waiter id as its ``lease_id`` got a lease under that id;
from then on the waiter's turn could never be recorded, no queued job of anyone started while
GPUs were free, and others' releases answered exit 11. Now an id in use is refused before any
work, and a turn that fails anyway drops and tells only its own waiter.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.broker_harness import RunningBroker, running_broker
from tests.unix_users import UnixUser, UserCommandLine, ensure_user

pytestmark = pytest.mark.slow

TOPOLOGY = "dgx1-v100"

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


@pytest.fixture(scope="module")
def users() -> dict[str, UnixUser]:
    return {name: ensure_user(f"gpualloc-t-{name}") for name in ("alice", "bob", "carol")}


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
