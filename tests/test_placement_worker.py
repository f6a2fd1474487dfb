"""The broker's placement worker: searches off the loop (``gpualloc/broker/placer.py``).

A search the broker does not know the answer to runs in a worker process while the loop
answers everyone else; requests behind a search keep their order; users take the worker in
turn; a search that fails, a worker that dies, restarts too often or is stuck each cost at
most one search, and a request whose answer never fits is searched in the loop after
``MAX_ASKS`` asks.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from gpualloc.broker import placer as placer_module
from gpualloc.broker.placer import MAX_ASKS, RESTARTS, STUCK_MARGIN_S, Placer
from gpualloc.errors import GpuallocError
from gpualloc.host.local import PlacementPending
from gpualloc.ledger.occupancy import Occupancy
from gpualloc.ledger.schema import Ledger
from gpualloc.ledger.store import new_lease_id
from gpualloc.model import Topology
from gpualloc.model.request import JobRequest
from gpualloc.placement.mapa.patterns import build_pattern
from gpualloc.placement.want import Want
from gpualloc.topologies import load_bundled
from tests.broker_harness import RunningBroker, TurnedBroker
from tests.child_processes import finish
from tests.placement_hosts import measured_32

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def host32_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two sockets of 16 GPUs, four GPUs a PCIe switch, as a topology file."""
    path = tmp_path_factory.mktemp("host32") / "pcie-32gpu-2socket.json"
    path.write_bytes(msgspec.json.encode(load_bundled("pcie-32gpu-2socket")))
    return path


@pytest.fixture(scope="module")
def slow_host_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """:func:`~tests.placement_hosts.measured_32`, as a topology file."""
    path = tmp_path_factory.mktemp("slow") / "measured-32.json"
    path.write_bytes(msgspec.json.encode(measured_32()))
    return path


@pytest.mark.slow
def test_the_broker_searches_in_its_worker_and_answers_others_meanwhile(
    slow_host_file: Path, tmp_path: Path
) -> None:
    """A 32-GPU search runs to its budget in the broker's placement worker; meanwhile the
    loop answers others at once (it stalled for the whole search when searches ran in the loop)."""
    config = tmp_path / "system.toml"
    config.write_text("[placement]\ntime_budget = 2.0\n")
    broker = RunningBroker(str(slow_host_file), system_config=config).start()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUALLOC_")}
        env |= {"PYTHONPATH": str(ROOT), "GPUALLOC_BROKER": str(broker.socket)}
        started = time.monotonic()
        search = subprocess.Popen(
            [sys.executable, "-m", "gpualloc", "alloc", "--hold", "-n", "16",
             "--policy", "mapa-greedy", "--format", "json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        time.sleep(1.0)  # the client has started and asked; the worker searches
        answers = []
        for _ in range(5):
            hello_started = time.monotonic()
            broker.hello()
            answers.append(time.monotonic() - hello_started)
        out, err = finish(search, timeout_s=120)
        assert search.returncode == 0, err + broker.log_text()[-2000:]
        took = time.monotonic() - started
        assert took >= 2.0, "the search ran to its 2 s budget"
        assert max(answers) < 0.5, answers
        assert "ran past its 2 s budget" in err
        assert len(json.loads(out)["environment"]["GPUALLOC_GPUS"].split(",")) == 16
        assert len(broker.ledger()["leases"]) == 1
    finally:
        broker.stop()


def _pipelined(socket_path: Path, lines: list[dict]) -> list[dict]:
    """Send ``lines`` in one write on one connection; their answers, in order."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(60)
        connection.connect(str(socket_path))
        connection.sendall(b"".join(json.dumps(line).encode() + b"\n" for line in lines))
        reader = connection.makefile("rb")
        return [json.loads(reader.readline()) for _ in lines]


def _searching_alloc(lease_id: str) -> dict:
    request = {"count": 10, "sensitive": True, "policy": "drb"}
    terms = {"source": "alloc", "hold": True}
    return {"v": 1, "op": "alloc", "args": {"lease_id": lease_id, "options": request,
                                            "terms": terms}}  # fmt: skip


@pytest.mark.slow
def test_requests_behind_a_search_keep_their_order_and_a_dead_worker_is_replaced(
    host32_file: Path,
) -> None:
    broker = RunningBroker(str(host32_file)).start()
    try:
        release = {"v": 1, "op": "release", "args": {"mine": True}}
        made, released = _pipelined(broker.socket, [_searching_alloc("aaaaaaaaaaaa"), release])
        assert made["ok"] and released["ok"], (made, released)
        assert [lease["id"] for lease in released["result"]["released"]] == ["aaaaaaaaaaaa"]
        assert broker.ledger()["leases"] == []
        os.kill(broker.worker(), 9)
        time.sleep(0.5)
        request = _searching_alloc("bbbbbbbbbbbb")
        request["args"]["options"]["exclude"] = [0]  # not remembered: searched again
        (made,) = _pipelined(broker.socket, [request])
        assert made["ok"], made
        assert "placement worker ended" in broker.log_text()
    finally:
        broker.stop()


_TIMED_CLIENT = """
import json, socket, sys, time
with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
    connection.connect(sys.argv[1])
    started = time.monotonic()
    connection.sendall(sys.argv[2].encode() + b"\\n")
    answer = json.loads(connection.makefile("rb").readline())
print(json.dumps({"took": time.monotonic() - started, "ok": answer.get("ok")}))
"""


@pytest.mark.slow
def test_a_new_users_search_waits_one_budget_per_other_user_searching(
    slow_host_file: Path, tmp_path: Path
) -> None:
    """The bound docs/administration.md states: the worker takes one search of each user at
    a time, users in turn, so a new user's search waits for the one the worker has and at
    most one of each other user with a search queued, however many they queued: (k + 2)
    budgets to its answer with k others searching. Each of three users here queues four
    searches that run to the budget (for a placement no job may take, so that the host does
    not change meanwhile); a fourth user's one-GPU alloc answers within the bound, where
    waiting for the twelve in the order they came would take twice as long."""
    from tests.unix_users import UserCommandLine, ensure_user

    budget_s, searching = 0.5, ("alice", "bob", "carol")
    users = {name: ensure_user(f"gpualloc-t-{name}") for name in (*searching, "dave")}
    config = tmp_path / "system.toml"
    config.write_text(f"[placement]\ntime_budget = {budget_s}\n")
    as_user = UserCommandLine(users["alice"])
    broker = RunningBroker(str(slow_host_file), system_config=config).start()

    def client(user: str, lease_id: str, request: dict) -> subprocess.Popen[str]:
        line = _searching_alloc(lease_id)
        line["args"]["options"] = request
        return subprocess.Popen(
            [as_user.python, "-c", _TIMED_CLIENT, str(broker.socket), json.dumps(line)],
            env={"PYTHONPATH": as_user.python_path, "PATH": "/usr/bin:/bin"},
            user=users[user].uid, group=users[user].gid, extra_groups=[],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/",
        )  # fmt: skip

    try:
        queued = []
        for number, user in enumerate(searching * 4):
            request = {"count": 16, "sensitive": True, "policy": "mapa-greedy",
                       "exclude": [number], "min_utility": 1.0}  # fmt: skip
            queued.append(client(user, f"{number + 1:012x}", request))
        time.sleep(1.0)  # every search is queued, the first has the worker
        new = client("dave", "dddddddddddd", {"policy": "mapa", "count": 1})
        out, err = finish(new, timeout_s=120)
        answer = json.loads(out)
        bound_s = (len(searching) + 2) * budget_s
        assert answer["ok"], (err, broker.log_text()[-2000:])
        for search in queued:  # each refused: no placement has utility 1
            assert json.loads(finish(search, timeout_s=120)[0])["ok"] is False
        assert answer["took"] < bound_s + 0.5, (answer, bound_s)
    finally:
        broker.stop()


def _worker_answers(placer: Placer, timeout_s: float = 60) -> list:
    """The worker's next answers, waited for."""
    import select

    deadline_at = time.monotonic() + timeout_s
    while time.monotonic() < deadline_at:
        select.select([placer.fileno()], [], [], 1.0)
        found = placer.answers()
        if found:
            return found
    raise AssertionError("the placement worker did not answer")


def test_a_search_that_fails_in_the_worker_is_refused_and_the_worker_goes_on() -> None:
    """A search that raised anything but a gpualloc error ended the worker for the broker's
    lifetime (a pattern naming a pair twice raised an AssertionError in the order search):
    now it is refused, its traceback logged once, and the worker searches the next."""
    topology = load_bundled("dgx1-v100")
    logged: list[str] = []
    placer = Placer.start(topology, 1.0, log=logged.append)
    try:
        want = Want(JobRequest(2, build_pattern("ring", 2), True))
        placer.ask(1000, PlacementPending(("broken",), None, want))  # type: ignore[arg-type]
        assert _worker_answers(placer) == [(("broken",), None)]
        with pytest.raises(GpuallocError, match="placement search failed on this request"):
            placer.defers(("broken",))
        with pytest.raises(GpuallocError):  # again without a search, and without a log
            placer.defers(("broken",))
        (line,) = logged
        assert "internal error in the placement worker" in line and "Traceback" in line
        occupancy = Occupancy.build(topology, Ledger(host="test"), ())
        placer.ask(1000, PlacementPending(("good",), occupancy, want))
        ((key, placement),) = _worker_answers(placer)
        assert key == ("good",) and len(placement.gpus) == 2 and placer.alive
    finally:
        placer.stop()


DYING_WORKER = (
    "-c",
    "import os, signal\n"
    "import gpualloc.placement.choose as choose\n"
    "from gpualloc.broker.placer import main\n"
    "real = choose.searched\n"
    "def searched(topology, occupancy, want, **budget):\n"
    "    if want.request.gpus == 3:  # as native code that crashes would: nothing written\n"
    "        os.kill(os.getpid(), signal.SIGKILL)\n"
    "    return real(topology, occupancy, want, **budget)\n"
    "choose.searched = searched\n"
    "raise SystemExit(main())\n",
)
"""A worker that dies hard (SIGKILL, nothing written) on any search of three GPUs, through
the placer's one hook, its worker's command line, which only the broker's own code sets."""


def _pending(topology: Topology, gpus: int, excluded: int = 0) -> PlacementPending:
    occupancy = Occupancy.build(topology, Ledger(host="test"), ())
    want = Want(JobRequest(gpus, build_pattern("ring", gpus), True, excluded=frozenset({excluded})))
    return PlacementPending(("search", gpus, excluded), occupancy, want)


def test_a_request_in_flight_at_two_deaths_of_the_worker_is_refused_without_a_search(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A search that kills its process (native code that crashes, memory it cannot have) was
    searched again in the broker's loop, where it would kill the broker: now it is asked of
    the new worker, and once a worker has died twice with it in flight, it is refused with
    one line (the exit code of a refused request), logged once, and never searched again;
    the next worker serves the others."""
    monkeypatch.setattr(Placer, "worker", DYING_WORKER)
    topology = load_bundled("dgx1-v100")
    logged: list[str] = []
    placer = Placer.start(topology, 1.0, log=logged.append)
    try:
        deadly = _pending(topology, 3)
        assert placer.defers(deadly.key)
        placer.ask(1000, deadly)
        assert _worker_answers(placer) == [(deadly.key, None)], logged  # after two deaths
        assert sum("the placement worker ended: started again" in line for line in logged) == 2
        for _ in range(2):  # the same request on the same host state: refused, not searched
            with pytest.raises(GpuallocError) as refused:
                placer.defers(deadly.key)
            assert refused.value.exit_code == GpuallocError.exit_code
            assert "placement worker died 2 times while searching this request" in str(
                refused.value
            )
        (said,) = [line for line in logged if "died 2 times" in line]
        assert said.startswith("error: ") and "uid 1000" in said and "\n" not in said
        good = _pending(topology, 2)
        assert placer.defers(good.key)
        placer.ask(1000, good)
        ((key, placement),) = _worker_answers(placer)
        assert key == good.key and len(placement.gpus) == 2 and placer.alive
    finally:
        placer.stop()


def _kill_and_replace(placer: Placer) -> None:
    """Kill the worker (SIGKILL) and let the placer see it end."""
    import select

    assert placer.process is not None
    pid = placer.process.pid
    os.kill(pid, signal.SIGKILL)
    deadline_at = time.monotonic() + 60
    while placer.process is not None and placer.process.pid == pid:
        assert time.monotonic() < deadline_at, "the placer never saw its worker end"
        select.select([placer.fileno()], [], [], 1.0)
        assert placer.answers() == []


def test_a_worker_that_died_restarts_times_in_the_window_starts_again_only_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker is started again at once RESTARTS times in RESTART_WINDOW_S (the first
    start is not one of them); at the next death it is not, until the window has passed:
    meanwhile a search is left to the loop (its short ``broker.placement_budget``), and a
    request that was in flight at that death is refused at once, not searched in the loop."""
    window_s = 8.0  # the RESTARTS restarts below take well under a second
    monkeypatch.setattr(placer_module, "RESTART_WINDOW_S", window_s)
    monkeypatch.setattr(Placer, "worker", DYING_WORKER)
    topology = load_bundled("dgx1-v100")
    logged: list[str] = []
    placer = Placer.start(topology, 1.0, log=logged.append)
    try:
        for _ in range(RESTARTS):
            _kill_and_replace(placer)
            assert placer.alive, logged
        assert time.monotonic() - placer.starts[0] < window_s, "the machine is too slow"
        deadly = _pending(topology, 3)
        placer.ask(1000, deadly)
        assert _worker_answers(placer) == [(deadly.key, None)]
        assert not placer.alive and placer.process is None
        assert logged[-1] == "warning: the placement worker ended: searches run in the loop for now"
        with pytest.raises(GpuallocError, match="cannot be started again for now"):
            placer.defers(deadly.key)
        other = _pending(topology, 2)
        assert placer.defers(other.key) is False, "searched in the loop"
        assert not placer.alive, "started again within the window"
        time.sleep(max(0.0, placer.starts[0] + window_s - time.monotonic()) + 0.1)
        assert placer.defers(other.key) is True
        assert placer.alive and logged[-1] == "the placement worker started again"
        placer.ask(1000, other)
        ((key, placement),) = _worker_answers(placer)
        assert key == other.key and len(placement.gpus) == 2
    finally:
        placer.stop()


@pytest.mark.slow
def test_while_the_worker_waits_out_its_restarts_the_loop_searches_with_its_budget(
    slow_host_file: Path, tmp_path: Path
) -> None:
    """Past RESTARTS restarts within RESTART_WINDOW_S the broker has no worker until the
    window has passed; a search meanwhile runs in its loop, cut at the loop's own 15 ms
    (``broker.placement_budget``), not the worker's 0.5 s (``placement.time_budget``)."""
    broker = _budgeted_broker(slow_host_file, tmp_path)
    try:
        for restarts in range(1, RESTARTS + 1):
            os.kill(broker.worker(), signal.SIGKILL)
            _until_logged(broker, "the placement worker ended: started again", count=restarts)
        os.kill(broker.worker(), signal.SIGKILL)
        _until_logged(broker, "the placement worker ended: searches run in the loop for now")
        started = time.monotonic()
        (made,) = _pipelined(broker.socket, [_big_search("aaaaaaaaaaaa")])
        assert made["ok"], made
        notes = " ".join(made["result"]["notes"])
        assert "ran past its 0.015 s budget (broker.placement_budget)" in notes, notes
        assert time.monotonic() - started < 5
        assert "placement worker started again" not in broker.log_text()
    finally:
        broker.stop()


def _until_logged(
    broker: RunningBroker, text: str, timeout_s: float = 30, *, count: int = 1
) -> None:
    deadline_at = time.monotonic() + timeout_s
    while broker.log_text().count(text) < count:
        assert time.monotonic() < deadline_at, broker.log_text()[-3000:]
        time.sleep(0.05)


def _big_search(lease_id: str) -> dict:
    """16 of the measured 32 GPUs by MAPA's greedy order: past any budget here."""
    request = {"count": 16, "sensitive": True, "policy": "mapa-greedy"}
    terms = {"source": "alloc", "hold": True}
    return {"v": 1, "op": "alloc", "args": {"lease_id": lease_id, "options": request,
                                            "terms": terms}}  # fmt: skip


def _budgeted_broker(slow_host_file: Path, tmp_path: Path) -> RunningBroker:
    config = tmp_path / "system.toml"
    config.write_text("[placement]\ntime_budget = 0.5\n")
    return RunningBroker(str(slow_host_file), system_config=config).start()


@pytest.mark.slow
def test_a_killed_worker_is_started_again_and_searches_the_next_request(
    slow_host_file: Path, tmp_path: Path
) -> None:
    """A worker killed (SIGKILL: the OOM killer, an administrator) was never started again:
    every later search ran in the loop, cut to greedy at ``broker.placement_budget``. The
    search's note names the budget it ran under: the worker's (0.5 s) or the loop's."""
    broker = _budgeted_broker(slow_host_file, tmp_path)
    try:
        first = broker.worker()
        os.kill(first, 9)
        _until_logged(broker, "the placement worker ended: started again")
        assert broker.worker() != first
        (made,) = _pipelined(broker.socket, [_big_search("aaaaaaaaaaaa")])
        assert made["ok"], made
        notes = " ".join(made["result"]["notes"])
        assert "ran past its 0.5 s budget (placement.time_budget)" in notes, notes
    finally:
        broker.stop()


@pytest.mark.slow
def test_a_stuck_worker_is_replaced_and_its_request_answered_greedily(
    slow_host_file: Path, tmp_path: Path
) -> None:
    """A worker that never answers (stopped here, as a search that never ends would be) held
    its request, and every search asked after it, for ever: past its budget and a margin it
    is killed and replaced, the request answered with the greedy placement, saying so."""
    broker = _budgeted_broker(slow_host_file, tmp_path)
    try:
        stuck = broker.worker()
        os.kill(stuck, signal.SIGSTOP)
        started = time.monotonic()
        (made,) = _pipelined(broker.socket, [_big_search("aaaaaaaaaaaa")])
        took = time.monotonic() - started
        assert made["ok"], made
        assert 1.5 * 0.5 + STUCK_MARGIN_S <= took < 1.5 * 0.5 + STUCK_MARGIN_S + 10, took
        notes = " ".join(made["result"]["notes"])
        assert "the placement worker's mapa-greedy search ran past its 0.5 s budget" in notes
        assert "was stopped: this is a greedy choice" in notes
        assert len(made["result"]["lease"]["gpus"]) == 16
        assert "the placement worker stuck: started again" in broker.log_text()
        assert broker.worker() != stuck
        release = {"v": 1, "op": "release", "args": {"mine": True}}
        again = _big_search("bbbbbbbbbbbb")
        again["args"]["options"]["exclude"] = [0]  # not remembered: searched by the new one
        _released, made = _pipelined(broker.socket, [release, again])
        assert made["ok"], made
        notes = " ".join(made["result"]["notes"])
        assert "ran past its 0.5 s budget (placement.time_budget): this is" in notes, notes
    finally:
        broker.stop()


class _AnswerThatNeverFits:
    """A placement worker whose every answer comes too late to use (the host changed under
    it): each ask is answered with nothing to remember, so the request is placed again."""

    def __init__(self) -> None:
        self.deferring = True
        self.asked: list[object] = []
        self.unanswered: list[object] = []

    def defers(self, key: object) -> bool:
        return self.deferring

    def ask(self, uid: int, pending: PlacementPending) -> None:
        self.asked.append(pending.key)
        self.unanswered.append(pending.key)

    def wake_at(self) -> float | None:
        return None

    def answers(self) -> list[tuple[object, None]]:
        answered, self.unanswered = self.unanswered, []
        return [(key, None) for key in answered]


def test_a_request_whose_answer_never_fits_is_searched_in_the_loop_after_max_asks(
    tmp_path: Path,
) -> None:
    """A request parked for the worker whose answer no longer fits when it comes asks again,
    at most ``MAX_ASKS`` times; then the loop searches it under its own budget and answers
    (docs/administration.md's bound: two searches of the worker)."""
    turned = TurnedBroker(tmp_path)
    worker = _AnswerThatNeverFits()
    turned.broker.service.host.placer = worker  # type: ignore[assignment]
    turned.broker.service.host.placement_memo = {}
    try:
        client = turned.connect()
        args = {"lease_id": new_lease_id(), "options": {"policy": "mapa", "count": 2},
                "terms": {"source": "alloc", "hold": True}}  # fmt: skip
        client.sendall(json.dumps({"v": 1, "op": "alloc", "args": args}).encode() + b"\n")
        for _ in range(MAX_ASKS + 1):
            turned.broker.turn()
            turned.broker._placed()  # the worker's answer arrives
        (answer,) = turned.answers(client, 1)
        assert answer["ok"], answer
        assert len(worker.asked) == MAX_ASKS
        client.close()
    finally:
        turned.close()
