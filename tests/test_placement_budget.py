"""Issue 40, hole 2: one request cannot buy unbounded placement work.

On b2653dd a 32-GPU host made ``plan -n 10 --policy drb|besteffort|spread`` run for minutes
(C(32, 10) = 64 million sets), and ``run`` did it holding the ledger's lock; DRB's t_min alone
took 7 s for 22 GPUs. Now every search runs under ``placement.time_budget`` (the broker's
``broker.placement_budget``), a search cut short answers greedily and says so, t_min is bounded
by a count (so scores stay deterministic), and a slow request costs its own user's budget.

Since issue 43 DRB, pack and spread answer that PCIe host exactly within milliseconds (twins,
branch and bound); the searches that must run past a budget here are on a 32-GPU host known
only by a measured bandwidth matrix (a class per pair: every order search falls back on plain
branch and bound over orders).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from gpualloc.broker import placer as placer_module
from gpualloc.broker.limits import BUSY_TOKEN_S, FREE_BUSY_S, Limits
from gpualloc.broker.placer import RESTARTS, STUCK_MARGIN_S, Placer
from gpualloc.errors import GpuallocError
from gpualloc.host.local import PlacementPending
from gpualloc.ledger.occupancy import Occupancy
from gpualloc.ledger.schema import Ledger
from gpualloc.model import Topology
from gpualloc.model.request import HostState, JobRequest
from gpualloc.placement import deadline
from gpualloc.placement.choose import choose
from gpualloc.placement.decide import decision_context, place
from gpualloc.placement.mapa.patterns import build_pattern
from gpualloc.placement.policies.registry import get_policy, policy_names
from gpualloc.placement.sets.search import T_MIN_NODES, cheapest_communication
from gpualloc.placement.want import Want
from gpualloc.topologies import load_bundled
from tests.broker_harness import RunningBroker
from tests.child_processes import finish

ROOT = Path(__file__).resolve().parent.parent


def measured_32() -> Topology:
    """32 GPUs known by a measured bandwidth matrix alone, every pair its own bandwidth."""
    from gpualloc.discovery.bandwidth_matrix import topology_from_bandwidth_matrix

    rng = random.Random(43)
    matrix = [[0.0] * 32 for _ in range(32)]
    for a in range(32):
        for b in range(a + 1, 32):
            matrix[a][b] = matrix[b][a] = round(rng.uniform(5, 100), 2)
    return topology_from_bandwidth_matrix(matrix, name="measured-32", origin="test")


@pytest.fixture(scope="module")
def host32() -> Topology:
    """Two sockets of 16 GPUs, four GPUs a PCIe switch: the host of the issue's measurement."""
    return load_bundled("pcie-32gpu-2socket")


@pytest.fixture(scope="module")
def host32_file(tmp_path_factory: pytest.TempPathFactory, host32: Topology) -> Path:
    path = tmp_path_factory.mktemp("host32") / "pcie-32gpu-2socket.json"
    path.write_bytes(msgspec.json.encode(host32))
    return path


@pytest.fixture(scope="module")
def slow_host() -> Topology:
    return measured_32()


@pytest.fixture(scope="module")
def slow_host_file(tmp_path_factory: pytest.TempPathFactory, slow_host: Topology) -> Path:
    path = tmp_path_factory.mktemp("slow") / "measured-32.json"
    path.write_bytes(msgspec.json.encode(slow_host))
    return path


@pytest.mark.parametrize("policy", [p for p in policy_names() if p not in ("slurm", "baseline")])
def test_a_search_past_its_budget_answers_greedily_and_says_so(
    host32: Topology, policy: str
) -> None:
    busy = frozenset({0, 5, 17})
    request = JobRequest(
        10, build_pattern("ring", 10), True, required=frozenset({3}), excluded=frozenset({4})
    )
    state = HostState.with_busy(32, busy)
    ctx = decision_context(host32, request, state)
    started = time.monotonic()
    placement = place(get_policy(policy), ctx, budget_s=0.1)
    took = time.monotonic() - started
    assert took < 10, f"{policy} took {took:.1f} s under a 0.1 s budget"  # minutes on b2653dd
    gpus = placement.gpus
    assert len(set(gpus)) == 10 and 3 in gpus and 4 not in gpus and not busy & set(gpus)
    if placement.cut_short:  # a greedy answer, said
        assert "budget (placement.time_budget)" in placement.cut_short
        assert "greedy" in placement.cut_short


def test_searches_past_their_budget_on_32_gpus_are_cut_short(
    host32: Topology, slow_host: Topology
) -> None:
    occupancy = Occupancy.build(slow_host, Ledger(host="test"), ())
    # besteffort's search of 10 of these 32 GPUs takes about 1 ms since issue 43's third pass
    # (it took seconds), and its score tables about 4 ms more: a tenth of a millisecond
    # leaves it cut short on a machine several times faster than CI's too
    for policy, budget_s in (
        ("mapa-greedy", 0.05),
        ("drb", 0.05),
        ("spread", 0.05),
        ("besteffort", 0.0001),
    ):
        want = Want(JobRequest(10, build_pattern("ring", 10), True), policy=policy)
        placement = choose(slow_host, occupancy, want, budget_s=budget_s)
        assert placement.cut_short, f"{policy} ordered 10 of 32 GPUs in {budget_s * 1000:g} ms?"
    occupancy = Occupancy.build(host32, Ledger(host="test"), ())
    for policy in ("drb", "spread", "pack"):
        want = Want(JobRequest(10, build_pattern("ring", 10), True), policy=policy)
        placement = choose(host32, occupancy, want, budget_s=0.05)
        assert not placement.cut_short, f"{policy} is exact on the PCIe host (issue 43)"
    spread = choose(
        host32, occupancy, Want(JobRequest(4, build_pattern("ring", 4), True), policy="spread"),
        budget_s=0.05,
    )  # fmt: skip
    assert {host32.gpu(g).numa_node for g in spread.gpus} == {0, 1}, "spread spreads"


def test_within_budget_the_answer_is_the_exact_one() -> None:
    """The budget changes nothing where the search finishes: every policy on dgx1-v100."""
    topology = load_bundled("dgx1-v100")
    occupancy = Occupancy.build(topology, Ledger(host="test"), ())
    for policy in policy_names():
        for k in (1, 3, 5, 8):
            want = Want(JobRequest(k, build_pattern("ring", k), True), policy=policy)
            exact = choose(topology, occupancy, want)
            budgeted = choose(topology, occupancy, want, budget_s=1.0)
            assert budgeted == exact and not budgeted.cut_short


def test_the_deadline_is_per_decision_and_unlimited_outside_one() -> None:
    assert not deadline.current().limited
    with pytest.raises(deadline.OverBudget), deadline.within(0.0):
        for _ in range(10 * deadline.CHECK_EVERY):
            time.sleep(0)
            deadline.current().tick()
    assert not deadline.current().limited, "the budget ends with its block"


def test_t_min_is_bounded_by_a_count_and_exact_on_every_bundled_host(host32: Topology) -> None:
    """DRB's t_min (the cheapest set of k GPUs) took 7 s for 22 of 32 GPUs; it stops after
    T_MIN_NODES sets, a count, so the same host gives the same scores everywhere."""
    distance = decision_context(
        host32, JobRequest(1, build_pattern("ring", 1), True)
    ).utility_model.distance
    started = time.monotonic()
    first = cheapest_communication(distance, 22)
    assert time.monotonic() - started < 5
    cheapest_communication.cache_clear()
    assert cheapest_communication(distance, 22) == first
    torus = load_bundled("torus-2d-16")
    d16 = decision_context(
        torus, JobRequest(1, build_pattern("ring", 1), True)
    ).utility_model.distance
    import itertools

    for k in (3, 5):  # brute force agrees where the bound is not reached
        brute = min(
            sum(d16[a][b] for a, b in itertools.combinations(s, 2))
            for s in itertools.combinations(range(16), k)
        )
        assert cheapest_communication(d16, k) == pytest.approx(brute)
    assert T_MIN_NODES > 636  # torus-2d-16, the bundled host that needs the most


def test_plan_on_a_32_gpu_host_answers_within_its_budget(slow_host_file: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUALLOC_")}
    env |= {"PYTHONPATH": str(ROOT), "GPUALLOC_PLACEMENT_BUDGET": "0.2"}
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "gpualloc", "--topology", str(slow_host_file), "plan", "-n", "16",
         "--policy", "mapa-greedy", "--json"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started < 30
    assert "ran past its 0.2 s budget (placement.time_budget)" in result.stderr
    data = json.loads(result.stdout)
    assert len(data["gpus"]) == 16 and "greedy" in data["cut_short"]


def test_a_slow_request_costs_its_own_user() -> None:
    limits = Limits(max_connections=64, max_requests_per_s=5000)
    limits.charge_time(1000, FREE_BUSY_S)  # a request within its fixed cost: nothing more
    assert limits.take(1000, 10_000)  # the whole burst is still there
    other = Limits(max_connections=64, max_requests_per_s=5000)
    other.charge_time(1000, FREE_BUSY_S + 0.075)  # a placement that ran to the broker's budget
    assert not other.take(1000, 10_000 - 0.075 / BUSY_TOKEN_S + 1)
    assert other.take(1001, 10_000), "another user's budget is their own"
    other.charge_time(0, 100.0)
    assert other.take(0, 1e9), "root is never limited"


@pytest.mark.slow
def test_the_broker_searches_in_its_worker_and_answers_others_meanwhile(
    slow_host_file: Path, tmp_path: Path
) -> None:
    """A 32-GPU search runs to its budget in the broker's placement worker; meanwhile the
    loop answers others at once (it stalled for the whole search before: issue 40, hole 2)."""
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
        assert "ran past its 0.015 s budget" in notes, notes
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
