"""What one user may take of the broker (``gpualloc/broker/limits.py``): floods cost the
flooder, and one user's connections and request rate are capped (root is never limited).

On b2653dd a user's 3,200 ``snapshot`` calls a second (under the 5,000-a-second limit, every
request alike) put another user's calls at p99 434 ms, and connection attempts were not limited
at all. Now a request costs its user's budget about what it costs the broker (a full snapshot
ten hellos), connections opened a second are limited per user, and an idle connection is
closed, and a flood past the budget is hung up on. ``benchmarks/bench_broker_flood.py``
measures another user's latency under a flood. The protocol's own limits (a request's size and
deadline) and what a client writes, bounded where the broker says it back, are
``test_broker_protocol.py``'s.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import time
from pathlib import Path

import pytest

from gpualloc.broker.limits import SNAPSHOT_COST, Limits, request_cost
from gpualloc.errors import BrokerError
from gpualloc.wire.client import BrokerClient
from tests.broker_harness import RunningBroker, TurnedBroker
from tests.unix_users import UnixUser, UserCommandLine, ensure_user, shared_directory

TOPOLOGY = "nvlink-pairs-4gpu"
"""The host of the broker whose connections and request rate are capped."""


def test_a_full_snapshot_costs_ten_hellos_of_the_budget() -> None:
    limits = Limits(max_connections=64, max_requests_per_s=100)  # bursts of 200
    snapshots = 0
    while limits.take(1000, request_cost("snapshot", {"full": True})):
        snapshots += 1
    assert snapshots == int(200 // SNAPSHOT_COST)
    hellos = 0
    other = Limits(max_connections=64, max_requests_per_s=100)
    while other.take(1000, request_cost("hello", {})):
        hellos += 1
    assert hellos == 200
    assert limits.take(0, 1e9), "root is never limited"


def test_connection_attempts_are_limited_per_user() -> None:
    limits = Limits(max_connections=64, max_requests_per_s=100, max_connects_per_s=5)
    opened = sum(limits.connects.take(1000) for _ in range(50))
    assert opened == 10  # a burst of twice the rate
    assert limits.connects.take(1001), "another user's budget is their own"


@pytest.mark.slow
def test_connections_a_user_closed_do_not_count_against_the_next_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user at ``broker.max_connections`` who closes its connections and opens another at
    once is answered, even when the loop meets the new connection before the old ones' end
    of file (epoll may report them in either order: the CI run of 1d4dd80 refused the fuzzer's
    first request after its walk of the connection bound); while they stay open, the next is
    refused."""
    from gpualloc.broker import listener
    from gpualloc.broker.peers import Peer

    monkeypatch.setattr(listener, "peer_of", lambda sock: Peer(pid=1, uid=4242, gid=4242))
    turned = TurnedBroker(tmp_path)
    try:
        turned.broker.limits.max_connections = 3
        held = [turned.connect() for _ in range(3)]
        turned.broker._accept()
        over = turned.connect()
        turned.broker._accept()  # refused: the three are open
        with over, over.makefile("rb") as said:
            assert "max_connections" in said.readline().decode()
        for client in held:
            client.close()
        after = turned.connect()
        turned.broker._accept()  # before the loop has read the three's end of file
        assert turned.broker.limits.connections[4242] == 1
        after.sendall(b'{"v": 1, "op": "hello", "args": {}}\n')
        with after:
            assert turned.answers(after, 1)[0]["ok"]
    finally:
        turned.close()


LIMITS = """
import json, socket, sys, time
path, opened = sys.argv[1], []
answers = []
for _ in range(int(sys.argv[2])):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(path)
    opened.append(s)
time.sleep(0.3)  # the broker has refused the connections over the cap by now
for s in opened:
    try:
        s.sendall(b'{"v": 1, "op": "hello", "args": {}}\\n' * int(sys.argv[3]))
    except OSError:  # a connection over the cap: the broker said why and closed it
        pass
for s in opened:
    reader = s.makefile("rb")
    for _ in range(int(sys.argv[3])):
        try:
            line = reader.readline()
        except OSError:
            line = b""
        if not line:
            answers.append("closed")
            break
        body = json.loads(line)
        answers.append("ok" if body.get("ok") else body["error"]["message"])
print(json.dumps(answers))
"""


@pytest.mark.slow
def test_one_users_connections_and_request_rate_are_capped(
    users: dict[str, UnixUser], as_user: UserCommandLine
) -> None:
    config = shared_directory("gpualloc-etc-")
    config.chmod(0o755)
    (config / "config.toml").write_text("[broker]\nmax_connections = 3\nmax_requests_per_s = 5\n")
    broker = RunningBroker(TOPOLOGY, system_config=config / "config.toml").start()
    try:
        run = as_user._run
        argv = [as_user.python, "-c", LIMITS, str(broker.socket)]
        said = run(users["alice"], [*argv, "5", "1"], {})
        assert said.returncode == 0, said.stderr
        many = json.loads(said.stdout)
        assert many.count("ok") == 3, many  # two connections over the cap
        assert sum("max_connections" in a for a in many) == 2
        said = run(users["bob"], [*argv, "1", "30"], {})
        assert said.returncode == 0, said.stderr
        fast = json.loads(said.stdout)
        assert "ok" in fast and any("too many requests" in a for a in fast), fast
        assert broker.hello()["protocol"] == 1  # root is not limited
    finally:
        broker.stop()
        shutil.rmtree(broker.directory, ignore_errors=True)
        shutil.rmtree(config, ignore_errors=True)


def test_the_broker_closes_idle_connections_and_refuses_a_connection_storm(
    tmp_path: Path,
) -> None:
    config = tmp_path / "system.toml"
    config.write_text('[broker]\nidle_timeout = "1s"\nmax_connects_per_s = 5\n')
    config.chmod(0o644)
    broker = RunningBroker("dgx1-v100", system_config=config).start()
    try:
        # root is never limited: the storm and the idle test run as a user
        from tests.unix_users import as_user, ensure_user

        def storm() -> None:
            idle = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            idle.connect(str(broker.socket))
            idle.settimeout(10)
            assert idle.recv(1) == b"", "the broker closes an idle connection after a second"
            refused = 0
            for _ in range(40):  # the real client: it reads the refusal even when the broker
                try:  # closed the socket before the request was written (EPIPE)
                    BrokerClient(broker.socket, answer_s=5).call("hello", retry=False)
                except BrokerError as error:
                    refused += "max_connects_per_s" in str(error)
            assert refused >= 20, refused

        user = ensure_user("gpualloc-t-alice")
        as_user(user.uid, user.gid, storm)
        started = time.monotonic()
        assert broker.hello()["protocol"] == 1 and time.monotonic() - started < 1
    finally:
        broker.stop()
        shutil.rmtree(broker.directory, ignore_errors=True)


def test_a_refused_connection_is_told_why_even_when_its_request_meets_a_closed_socket(
    tmp_path: Path,
) -> None:
    """The broker refuses a connection by writing its reason and closing at once; a client
    whose request is written after the close gets EPIPE, and must still say the reason
    (the CI run of 78620bc saw a client that said only 'Broken pipe')."""
    import threading

    from gpualloc.wire import protocol

    path = tmp_path / "broker.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    refused = threading.Event()

    def refuse() -> None:
        connection, _ = listener.accept()
        connection.sendall(
            protocol.error_line(BrokerError("too many connections (broker.max_connects_per_s)"))
        )
        connection.close()
        refused.set()

    server = threading.Thread(target=refuse)
    server.start()
    client = BrokerClient(path, answer_s=5)
    client._connect(time.monotonic() + 5)  # connected, nothing written yet
    assert refused.wait(5)
    server.join()
    with pytest.raises(BrokerError, match="max_connects_per_s"):
        client.call("hello", retry=False)
    listener.close()


@pytest.mark.slow
def test_a_flood_past_the_budget_is_refused_once_and_hung_up_on(tmp_path: Path) -> None:
    """A refused request used to cost the broker a parse and an answer each, however many a
    flooder pipelined; now the first one past the budget is answered and the connection
    closed (``benchmarks/bench_broker_flood.py`` measures another user's latency meanwhile)."""
    from tests.unix_users import as_user, ensure_user

    config = tmp_path / "system.toml"
    config.write_text("[broker]\nmax_requests_per_s = 5\n")
    config.chmod(0o644)
    broker = RunningBroker("dgx1-v100", system_config=config).start()

    def flood() -> None:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connection.connect(str(broker.socket))
        connection.settimeout(10)
        connection.sendall(b'{"v": 1, "op": "hello", "args": {}}\n' * 200)
        lines = connection.makefile("rb").readlines()  # until the broker hangs up
        assert sum(b'"ok":true' in line for line in lines) == 10  # a burst: twice the rate
        assert [b"max_requests_per_s" in line for line in lines[10:]] == [True], lines[10:]
        time.sleep(1.0)  # the budget refills
        assert BrokerClient(broker.socket, answer_s=5).call("hello", retry=False)

    try:
        user = ensure_user("gpualloc-t-alice")
        as_user(user.uid, user.gid, flood)
    finally:
        broker.stop()
        shutil.rmtree(broker.directory, ignore_errors=True)


SNAPSHOT = b'{"v": 1, "op": "snapshot", "args": {"full": true}}\n'
GC = b'{"v": 1, "op": "gc", "args": {}}\n'
"""A request that takes the broker a walk of its state directory and answers in 140 bytes."""


@pytest.mark.slow
def test_a_users_pipelined_requests_wait_behind_another_users_request(tmp_path: Path) -> None:
    """One user's requests take at most server.USER_SLICE_S of a turn of the loop; the rest
    wait for the next turn, after the other users' requests. A user who pipelines thousands
    of requests on one connection (within a budget raised for it) delays another user's
    hello by about one slice, not by all of them."""
    from tests.unix_users import ensure_user, start_as_user, wait_for_user

    config = tmp_path / "system.toml"
    config.write_text("[broker]\nmax_requests_per_s = 1000000\n")
    config.chmod(0o644)
    broker = RunningBroker("dgx1-v100", system_config=config).start()
    flooder, other = ensure_user("gpualloc-t-alice"), ensure_user("gpualloc-t-bob")
    report = broker.directory / "times.jsonl"  # a directory every user reaches
    report.touch()
    report.chmod(0o666)
    sent_read, sent_write = os.pipe()
    count = 6_000  # 210 kB, their answers 840 kB (within server.MAX_UNREAD_BYTES)

    def said(**times: float) -> None:
        with report.open("a") as out:
            out.write(json.dumps(times) + "\n")

    def flood() -> None:
        os.close(sent_read)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(60)
            connection.connect(str(broker.socket))
            began = time.monotonic()
            connection.sendall(GC * count)
            os.write(sent_write, b"x")
            with connection.makefile("rb") as reader:
                assert all(b'"ok":true' in reader.readline() for _ in range(count))
            said(flood_s=time.monotonic() - began)

    def hello() -> None:
        os.close(sent_write)  # so that a flooder that failed reads as the end of the pipe
        assert os.read(sent_read, 1) == b"x", "the flooder failed"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(60)
            connection.connect(str(broker.socket))
            began = time.monotonic()
            connection.sendall(b'{"v": 1, "op": "hello", "args": {}}\n')
            with connection.makefile("rb") as reader:
                assert b'"ok":true' in reader.readline()
            said(hello_s=time.monotonic() - began)

    try:
        users = [(flooder, start_as_user(flooder.uid, flooder.gid, flood))]
        users.append((other, start_as_user(other.uid, other.gid, hello)))
        for user, pid in users:
            wait_for_user(pid, user.uid, timeout_s=120)
        times: dict[str, float] = {}
        for line in report.read_text().splitlines():
            times.update(json.loads(line))
        flood_s, hello_s = times["flood_s"], times["hello_s"]
        print(
            f"{count} gc requests pipelined: {flood_s * 1000:.0f} ms; "
            f"another user's hello: {hello_s * 1000:.0f} ms"
        )
        assert flood_s > 0.1, "the flood is too short to be cut in turns"
        assert hello_s < flood_s / 4, times
    finally:
        os.close(sent_read)
        os.close(sent_write)
        broker.stop()
        shutil.rmtree(broker.directory, ignore_errors=True)


@pytest.mark.slow
def test_a_client_that_reads_no_answers_is_cut_off_at_its_bound() -> None:
    """Answers a client does not read pile up in the broker to server.MAX_UNREAD_BYTES at
    most; then its connection is closed (what the kernel holds of them it may still read),
    and everyone else is answered as before."""
    broker = RunningBroker("dgx1-v100").start()
    count = 1000  # 11 MB of answers: past the bound and what the socket buffers hold
    try:
        answered = _answers_read_after(broker, count, 2.0)  # all answered in half a second
        assert 0 < answered < count, answered
        assert broker.hello()["protocol"] == 1
    finally:
        broker.stop()
        shutil.rmtree(broker.directory, ignore_errors=True)


def _answers_read_after(
    broker: RunningBroker, count: int, unread_s: float, *, nudge_s: float | None = None
) -> int:
    """Send ``count`` full snapshots at once, read nothing for ``unread_s`` (another user's
    call answered meanwhile; with ``nudge_s``, a hello sent that often meanwhile), then read
    until the broker closes: how many answers came (a timeout: it never closed)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(30)
        connection.connect(str(broker.socket))
        connection.sendall(SNAPSHOT * count)
        end = time.monotonic() + unread_s
        while nudge_s is not None and time.monotonic() < end:
            time.sleep(nudge_s)
            with contextlib.suppress(OSError):
                connection.sendall(b'{"v": 1, "op": "hello", "args": {}}\n')
        time.sleep(max(0.0, end - time.monotonic()))
        assert broker.hello()["protocol"] == 1
        answered = 0
        with connection.makefile("rb") as reader, contextlib.suppress(ConnectionError):
            while reader.readline():
                answered += 1
    return answered


def test_a_client_that_stops_reading_is_closed_after_the_idle_timeout(tmp_path: Path) -> None:
    """Answers a client leaves unread, under MAX_UNREAD_BYTES, no longer hold its connection
    open for good: one that takes nothing for ``broker.idle_timeout`` is closed, as an idle
    one is (64 such connections of one user held 256 MiB of the broker's memory)."""
    config = tmp_path / "system.toml"
    config.write_text('[broker]\nidle_timeout = "1s"\n')
    config.chmod(0o644)
    broker = RunningBroker("dgx1-v100", system_config=config).start()
    count = 200  # about 2 MB of answers: more than the socket buffers, less than the bound
    try:
        answered = _answers_read_after(broker, count, 3.0)
        assert 0 < answered < count, answered
        nudged = _answers_read_after(broker, count, 3.0, nudge_s=0.3)  # requests, no reads
        assert 0 < nudged < count, nudged
    finally:
        broker.stop()
        shutil.rmtree(broker.directory, ignore_errors=True)


def _connect_flood(path: Path, seconds: float) -> None:
    """Non-blocking connect and close, as fast as one process can, for ``seconds``."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        attempt = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
        try:
            attempt.connect(str(path))
        except OSError:
            pass  # EAGAIN: the listen queue is full
        finally:
            attempt.close()


def _run_queue_s(pid: int | str = "self") -> float:
    """Seconds ``pid`` has spent runnable but waiting for a CPU: the second field of
    ``/proc/PID/schedstat`` (the scheduler's time, not the process's; every user may read
    it), Documentation/scheduler/sched-stats.rst."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9


ANSWER_S = 0.5
"""How long another user's call may take under one user's connect flood, beyond what the
machine's scheduler kept its processes waiting for a CPU."""


@pytest.mark.slow
def test_one_users_connect_flood_leaves_others_calls_answered_at_once(tmp_path: Path) -> None:
    """Connections are counted per user only once accepted, so a user who connects at full
    speed from several processes fills the listen queue that every user shares, and another
    user's connection waits behind it: their ``alloc`` took about a second, the loop accepting
    the flood without end. Now the broker has the CPU priority to drain the queue faster than
    the flood fills it (it runs at startup.NICE, its worker too), and drains it once a turn
    (refusing the flooder's connections at once) before the others' requests, so another
    user's calls, each on a connection of its own (as every ``gpualloc`` command opens one),
    are answered within half a second of what the broker controls: the time a call takes
    less the time its client, the broker and its worker spent runnable, waiting for a CPU.
    On a machine loaded by other work, that wait is the scheduler's, not the broker's, and
    alone passed the bound now and then (docs/administration.md has the measurements); the
    broker's priority, the other half of what it controls, is checked as such."""
    from gpualloc.ledger.store import new_lease_id
    from tests.unix_users import start_as_user, wait_for_user

    broker = RunningBroker("dgx1-v100").start()
    flooder, worker = ensure_user("gpualloc-t-alice"), ensure_user("gpualloc-t-bob")
    processes = (broker.process.pid, broker.worker())  # type: ignore[union-attr]
    report = broker.directory / "calls.json"  # a directory every user reaches
    report.touch()
    os.chown(report, worker.uid, worker.gid)
    flooding: list[int] = []

    def waited() -> float:
        return sum(_run_queue_s(pid) for pid in ("self", *processes))

    def work() -> None:
        time.sleep(0.5)  # the flood is under way
        calls = []
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            time.sleep(0.01)  # within this user's broker.max_connects_per_s
            alloc = {"lease_id": new_lease_id(), "options": {"policy": "mapa", "count": 1},
                     "terms": {"source": "alloc", "hold": True}}  # fmt: skip
            for op in ("alloc", "release"):
                before, began = waited(), time.monotonic()
                with BrokerClient(broker.socket, answer_s=10) as client:
                    client.call(op, alloc if op == "alloc" else {"leases": [alloc["lease_id"]]})
                calls.append((time.monotonic() - began, waited() - before))
        report.write_text(json.dumps(calls))

    try:
        if os.getpriority(os.PRIO_PROCESS, 0) == 0:  # else the administrator's value is kept
            # What the broker controls of the scheduler (startup.NICE): nine times the CPU of
            # a user's process (CFS weights 9548 and 1024) or more. At nice 0 the flood's
            # processes take the CPU the broker waits for, which the bound below leaves out.
            assert all(os.getpriority(os.PRIO_PROCESS, pid) <= -10 for pid in processes)
        for _ in range(4):  # twice the cores of the machine that measured it
            flood = lambda: _connect_flood(broker.socket, 4.5)  # noqa: E731
            flooding.append(start_as_user(flooder.uid, flooder.gid, flood))
        wait_for_user(start_as_user(worker.uid, worker.gid, work), worker.uid, timeout_s=60)
        calls = json.loads(report.read_text())
        took, cpu_wait = max(calls, key=lambda call: call[0] - call[1])
        slowest = max(wall for wall, _ in calls)
        print(
            f"{len(calls)} calls under the connect flood: slowest {slowest * 1000:.0f} ms; "
            f"the slowest beyond the CPU wait {(took - cpu_wait) * 1000:.0f} ms "
            f"({took * 1000:.0f} ms less {cpu_wait * 1000:.0f} ms waiting for a CPU)"
        )
        assert took - cpu_wait < ANSWER_S, (took, cpu_wait)
    finally:
        try:
            for pid in flooding:
                wait_for_user(pid, flooder.uid, timeout_s=30)
        finally:
            broker.stop()


PROCESS_FLOOD = 6000
"""Sleeping processes another user starts while a lease has a process to watch: enough that a
walk of all of ``/proc`` in the loop stalls requests (a whole walk at once: p99 175 ms on a
2-core machine; in steps: 12 ms), few enough to leave the machine unharmed (pid_max 32,768)."""
CYCLE_P99_S = 0.1
"""The bound ``docs/administration.md`` states for another user's alloc+release meanwhile
(p99 12-14 ms on a 2-core machine; the bound leaves room for other work on a shared one)."""


@pytest.mark.slow
def test_another_users_processes_do_not_stall_the_loop() -> None:
    """The broker follows a lease's process tree in steps of a few milliseconds: a user with
    thousands of processes costs another user's alloc+release no more than one step. That
    holds with a lease whose group leader has ended while its group runs on (whether the
    group still runs was a walk of all of ``/proc`` at every reap: p99 174 ms)."""
    import json
    import os
    import signal
    import subprocess

    from tests.unix_users import as_user, ensure_user

    flooder, user = ensure_user("gpualloc-t-bob"), ensure_user("gpualloc-t-alice")
    broker = RunningBroker("dgx1-v100").start()
    job = subprocess.Popen(["sleep", "600"])
    spawn = f"i=0; while [ $i -lt {PROCESS_FLOOD} ]; do sleep 600 & i=$((i+1)); done; echo ok"
    flood = subprocess.Popen(
        ["sh", "-c", f"{spawn}; wait"], user=flooder.uid, group=flooder.gid, extra_groups=[],
        start_new_session=True, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    leader: subprocess.Popen[str] | None = None
    timings = broker.directory / "timings.json"  # a directory every user reaches
    timings.touch()
    os.chown(timings, user.uid, user.gid)

    def cycles() -> None:
        spent = []
        for turn in range(150):
            request = {"options": {"policy": "mapa", "count": 1}}
            request["terms"] = {"source": "alloc", "hold": True}
            began = time.perf_counter()
            lease = broker.call("alloc", {**request, "lease_id": f"{turn:012x}"})["lease"]
            broker.call("release", {"leases": [lease["id"]]})
            spent.append(time.perf_counter() - began)
            time.sleep(0.03)
        timings.write_text(json.dumps(spent))

    try:
        broker.call("alloc", {"options": {"policy": "mapa", "count": 1}, "lease_id": "f" * 12,
                              "terms": {"source": "alloc", "pid": job.pid}})  # fmt: skip
        assert flood.stdout is not None and flood.stdout.readline() == "ok\n"
        # A job whose group outlives its leader, asked of at every reap; started after the
        # flood, its member comes late in a walk of /proc in pid order.
        leader = subprocess.Popen(
            ["sh", "-c", "sleep 600 >/dev/null & read line"], stdin=subprocess.PIPE,
            text=True, start_new_session=True,
        )  # fmt: skip
        terms = {"source": "alloc", "pid": leader.pid, "process_group": leader.pid}
        grouped = broker.call("alloc", {"options": {"policy": "mapa", "count": 1},
                                        "lease_id": "e" * 12, "terms": terms})  # fmt: skip
        assert grouped["lease"]["process_group"] == leader.pid
        leader.communicate("\n", timeout=30)
        time.sleep(2)  # the last sleeps exec'd and asleep: the test measures the broker
        as_user(user.uid, user.gid, cycles)
        spent = sorted(json.loads(timings.read_text()))
        p99 = spent[int(len(spent) * 0.99)]
        said = f"p99 {p99 * 1000:.0f} ms, max {spent[-1] * 1000:.0f} ms"
        print(said)
        assert p99 < CYCLE_P99_S, said
        leases = broker.call("snapshot")["ledger"]["leases"]
        assert any(lease["id"] == "e" * 12 for lease in leases), "the group job lost its lease"
    finally:
        if leader is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(leader.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(flood.pid, signal.SIGKILL)
        flood.wait(timeout=60)
        flood.stdout.close()  # type: ignore[union-attr]
        job.kill()
        job.wait(timeout=60)
        broker.stop()
        shutil.rmtree(broker.directory, ignore_errors=True)
