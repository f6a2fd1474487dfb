"""The broker as a service: its protocol's limits, fairness between users, and restarts.

- Malformed, oversized, slow and wrong-version requests get an error or a closed connection,
  and the broker keeps serving everyone else.
- One user's connections and request rate are capped (real users: root is never limited).
- A waiter whose client disconnects leaves the queue; the queue is fair between users.
- A restart, ``kill -9`` included, loses no lease of a live process and releases the dead.

The broker runs as root (tests/broker_harness.py); users are real (tests/unix_users.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpualloc.errors import ExitCode
from tests.broker_harness import ROOT, RunningBroker, running_broker
from tests.child_processes import end, end_all, finish, stderr_until
from tests.job_scripts import DECLARE
from tests.unix_users import UnixUser, UserCommandLine, ensure_user, shared_directory

TOPOLOGY = "nvlink-pairs-4gpu"


@pytest.fixture
def broker() -> Iterator[RunningBroker]:
    yield from running_broker(TOPOLOGY)


def _connect(broker: RunningBroker) -> socket.socket:
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.settimeout(10)
    connection.connect(str(broker.socket))
    return connection


def _answer(connection: socket.socket) -> dict:
    return json.loads(connection.makefile("rb").readline() or b"{}")


def _until(condition: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


# ---- the protocol's limits (as root) -----------------------------------------------------------


@pytest.mark.parametrize(
    "sent",
    [b"not json\n", b"[1, 2]\n", b'{"v": 1, "op": "format-disk"}\n', b'{"v": 1, "op": "alloc"}\n'],
    ids=["not-json", "not-an-object", "unknown-op", "no-arguments"],
)
def test_a_malformed_request_gets_an_error_and_the_broker_keeps_serving(
    broker: RunningBroker, sent: bytes
) -> None:
    with _connect(broker) as connection:
        connection.sendall(sent)
        answer = _answer(connection)
    assert answer["ok"] is False and answer["error"]["message"]
    assert answer["error"]["code"] in (2, 18)
    assert broker.hello()["protocol"] == 1


def test_an_oversized_request_is_refused_and_its_connection_closed(broker: RunningBroker) -> None:
    with _connect(broker) as connection:
        with contextlib.suppress(BrokenPipeError):  # it may close before reading it all
            connection.sendall(b"x" * (70 * 1024))
        answer = _answer(connection)
        assert "at most 65536 bytes" in answer["error"]["message"]
        assert connection.recv(1) == b""  # closed
    assert broker.hello()["protocol"] == 1


@pytest.mark.slow
def test_a_slow_request_loses_its_connection_and_holds_nobody_up(broker: RunningBroker) -> None:
    with _connect(broker) as slow:
        slow.sendall(b'{"v": 1, "op": ')  # and never the rest
        started = time.monotonic()
        assert broker.call("alloc", _hold_request("0123456789ab"))["lease"]["id"]
        assert time.monotonic() - started < 2, "the broker waited for the slow client"
        slow.settimeout(15)
        answer = _answer(slow)
        assert "did not arrive in time" in answer["error"]["message"]


def test_another_protocol_version_is_told_both_versions(broker: RunningBroker) -> None:
    with _connect(broker) as connection:
        connection.sendall(b'{"v": 99, "op": "hello", "args": {}}\n')
        answer = _answer(connection)
    assert answer["error"]["code"] == 18
    assert "protocol 1" in answer["error"]["message"] and "99" in answer["error"]["message"]


def test_a_configured_broker_that_does_not_answer_is_exit_18_never_the_shared_file(
    tmp_path: Path,
) -> None:
    env = {**_clean_env(), "GPUALLOC_BROKER": str(tmp_path / "nobody.sock")}
    env["GPUALLOC_STATE_DIR"] = str(tmp_path / "state")
    result = subprocess.run(
        [sys.executable, "-m", "gpualloc", "alloc", "--hold"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 18, result.stderr
    assert "does not answer" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "state").exists()


def test_a_broker_a_user_named_that_a_trial_passes_by_is_said(
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GPUALLOC_BROKER with a bundled topology: the trial keeps the topology's own ledger, as
    documented, but it said nothing, and the user who named a broker thought it held the
    lease. The host's own broker (system config) needs no word for a trial."""
    socket = tmp_path / "broker.sock"
    monkeypatch.setenv("GPUALLOC_BROKER", str(socket))
    said = (
        f"gpualloc: warning: the broker {socket} (GPUALLOC_BROKER) is not used: the topology "
        "named (dgx1-v100) is not this host, so it has a ledger of its own\n"
    )
    for args in (["alloc", "--hold"], ["plan", "-n", "2"], ["status"]):
        result = cli("--topology", "dgx1-v100", *args)
        assert result.exit_code == 0, result.stderr
        assert said in result.stderr, (args, result.stderr)
    monkeypatch.delenv("GPUALLOC_BROKER")
    system = tmp_path / "etc" / "config.toml"
    system.parent.mkdir(exist_ok=True)
    system.write_text(f'[host]\nbroker = "{socket}"\n')
    result = cli("--topology", "dgx1-v100", "status")
    assert result.exit_code == 0 and "warning" not in result.stderr, result.stderr


def _hold_request(lease_id: str, gpus: int = 1) -> dict:
    return {
        "lease_id": lease_id,
        "options": {"policy": "mapa", "count": gpus, "sensitive": False},
        "terms": {"source": "alloc", "hold": True},
    }


def test_alloc_sent_again_returns_the_lease_it_made(broker: RunningBroker) -> None:
    first = broker.call("alloc", _hold_request("aaaaaaaaaaaa"))
    again = broker.call("alloc", {**_hold_request("aaaaaaaaaaaa"), "retry": True})
    assert again["lease"]["id"] == first["lease"]["id"] == "aaaaaaaaaaaa"
    assert again["lease"]["gpus"] == first["lease"]["gpus"]
    assert len(broker.call("snapshot")["ledger"]["leases"]) == 1


def test_the_broker_decodes_one_job_encoding(broker: RunningBroker) -> None:
    """A job is the JobOptions both clients send ("options"); the queue's own form of a
    request ("request"), which BrokeredHost sent once, is no way in any more."""
    queued = {"gpus": 1, "sensitive": False}
    args = {"lease_id": "cccccccccccc", "request": queued, "terms": _hold_request("c")["terms"]}
    with pytest.raises(OSError, match="bad options"):
        broker.call("alloc", args)
    assert broker.call("snapshot")["ledger"]["leases"] == []


# ---- a run's lease lives with its process ------------------------------------------------------


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("GPUALLOC_")}


def _cli(broker: RunningBroker, *args: str) -> subprocess.Popen[str]:
    env = {**_clean_env(), "GPUALLOC_BROKER": str(broker.socket)}
    return subprocess.Popen(
        [sys.executable, "-m", "gpualloc", *args], env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def _leases(broker: RunningBroker) -> list[dict]:
    return broker.call("snapshot")["ledger"]["leases"]


@pytest.mark.slow
def test_a_runs_gpus_are_free_the_moment_its_job_ends_and_its_group_keeps_them(
    broker: RunningBroker,
) -> None:
    job = _cli(broker, "run", "-n", "2", "--", "sleep", "0.5")
    try:
        _until(lambda: len(_leases(broker)) == 1, "the job's lease")
    finally:
        finish(job, timeout_s=30)
    _until(lambda: not _leases(broker), "the lease to go", timeout_s=2)

    leader = subprocess.Popen(
        [sys.executable, "-m", "gpualloc", "run", "-n", "1", "--", "sh", "-c", "sleep 3 & exit"],
        env={**_clean_env(), "GPUALLOC_BROKER": str(broker.socket)}, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        leader.wait(timeout=30)  # the job's leader is gone; its background child is not
        time.sleep(1.5)
        assert len(_leases(broker)) == 1, "the lease ended while a process of its job ran"
        _until(lambda: not _leases(broker), "the lease to go with the last process", timeout_s=10)
    finally:
        end(leader, group=True)


@pytest.mark.slow
def test_a_waiter_whose_client_goes_away_leaves_the_queue(broker: RunningBroker) -> None:
    broker.call("alloc", _hold_request("bbbbbbbbbbbb", gpus=4))
    waiter = _cli(broker, "alloc", "--wait", "--hold", "-n", "2")
    try:
        _until(lambda: len(broker.call("snapshot")["ledger"]["queue"]) == 1, "the waiter")
    finally:
        end(waiter)
    _until(lambda: not broker.call("snapshot")["ledger"]["queue"], "the queue to empty", 5)


def test_a_restart_keeps_the_leases_of_live_processes_and_releases_the_dead(
    broker: RunningBroker,
) -> None:
    alive = subprocess.Popen(["sleep", "60"])
    dead = subprocess.Popen(["sleep", "60"])
    try:
        for lease_id, pid in (("cccccccccccc", alive.pid), ("dddddddddddd", dead.pid)):
            request = _hold_request(lease_id)
            request["terms"] = {"source": "alloc", "pid": pid}
            broker.call("alloc", request)
        broker.kill9()
        end(dead)
        broker.start()
        assert [x["id"] for x in _leases(broker)] == ["cccccccccccc"]
        assert "released: its job ended while no broker ran" in broker.log_text()
        end(alive)
        _until(lambda: not _leases(broker), "the live one to go when its process does", 5)
    finally:
        end_all([alive, dead])


# ---- between real users ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def users() -> dict[str, UnixUser]:
    return {name: ensure_user(f"gpualloc-t-{name}") for name in ("alice", "bob", "carol")}


@pytest.fixture(scope="module")
def as_user(users: dict[str, UnixUser]) -> UserCommandLine:
    return UserCommandLine(users["alice"])


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
    broker = RunningBroker(TOPOLOGY).start()
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
            return sorted(x["user"] for x in _leases(broker) if x["user"] != carol.name)

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


STREAM = """
import os, random, sys, time
import gpualloc.api as api
from gpualloc.wire.client import BrokerClient
from pathlib import Path

stop = Path(sys.argv[1])
lost = held = 0
broker = BrokerClient(Path(os.environ["GPUALLOC_BROKER"]))
while not stop.exists():
    try:
        with api.hold(1, wait=True, timeout_s=30) as lease:
            held += 1
            time.sleep(random.uniform(0.0, 0.05))
            ids = [x["id"] for x in broker.call("snapshot", {"full": True})["ledger"]["leases"]]
            if lease.lease.id not in ids:
                lost += 1
                print("lost", lease.lease.id, flush=True)
    except Exception as problem:
        print("error", type(problem).__name__, problem, flush=True)
print("held", held, "lost", lost, flush=True)
"""


@pytest.mark.slow
def test_kill_9_of_the_broker_50_times_loses_no_lease_and_books_no_gpu_twice(
    users: dict[str, UnixUser], as_user: UserCommandLine
) -> None:
    broker = RunningBroker(TOPOLOGY).start()
    env = as_user._environment
    streams = [
        subprocess.Popen(
            [as_user.python, "-c", STREAM, str(broker.directory / "stop")],
            env={**env(user, {}), "GPUALLOC_BROKER": str(broker.socket)},
            user=user.uid,
            group=user.gid,
            extra_groups=[],
            cwd="/",
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for user in (users["alice"], users["bob"])
    ]
    try:
        _until(lambda: broker.ledger()["generation"] > 10, "both users' allocations to flow")
        for _ in range(50):
            time.sleep(0.15)
            broker.kill9()
            ledger = broker.ledger()
            gpus = [g["index"] for lease in ledger["leases"] for g in lease["gpus"]]
            assert len(gpus) == len(set(gpus)), f"a GPU booked twice: {ledger['leases']}"
            broker.start()
        assert broker.starts == 51
    finally:
        (broker.directory / "stop").touch()
        try:
            outputs = [finish(stream, timeout_s=120)[0] for stream in streams]
        finally:
            end_all(streams)
            broker.stop()
    for output in outputs:
        assert "lost" in output and " lost 0" in output, output[-2000:]
        assert "error" not in output, output[-2000:]
        held = int(output.rsplit("held ", 1)[1].split()[0])
        print(f"held {held}")
        assert held >= 50, "too few allocations to have been cut by the kills"
    assert "forged" not in broker.log_text()
    shutil.rmtree(broker.directory, ignore_errors=True)


def test_the_library_holds_through_the_broker(broker: RunningBroker) -> None:
    code = textwrap.dedent(
        """
        import gpualloc.api as api
        with api.hold(2) as held:
            print(held.lease.id, held.gpus, held.environment["CUDA_VISIBLE_DEVICES"])
        """
    )
    env = {**_clean_env(), "GPUALLOC_BROKER": str(broker.socket), "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    lease, rest = result.stdout.split(" ", 1)
    gpus, visible = rest.split(") ")
    assert visible.strip() == ",".join(gpus.strip("(").replace(" ", "").split(","))
    assert f"lease {lease}" in broker.log_text()  # the broker made it, and then released it
    assert not _leases(broker)


def test_every_ledger_command_answers_through_the_broker(broker: RunningBroker) -> None:
    def run(*args: str) -> str:
        job = _cli(broker, *args)
        out, err = finish(job, timeout_s=60)
        assert job.returncode == 0, err
        return out

    lease = json.loads(run("alloc", "-n", "2", "--hold", "--format", "json"))["lease"]["id"]
    status = json.loads(run("status", "--json"))
    assert status["broker"] == str(broker.socket) and status["trust"]["mode"] == "broker"
    assert [x["id"] for x in status["leases"]] == [lease]
    assert json.loads(run("plan", "-n", "2", "--json"))["gpus"]
    assert 'gpualloc_gpus{state="held"} 2' in run("metrics")
    assert json.loads(run("gc", "--json"))["reaped"] == []
    doctor = json.loads(run("doctor", "--json"))
    assert {f["where"] for f in doctor["findings"] if f["check"] == "ledger"} >= {"broker"}
    assert json.loads(run("release", lease, "--json"))["released"][0]["id"] == lease
    assert not _leases(broker)


IMPORTS = """
import os, sys
import gpualloc.launcher.exec as launch
def exec_job(argv, environment, binding):  # stands in for the exec, which would end the process
    raise SystemExit(0)
launch.exec_job = exec_job
sys.argv = ["gpualloc", *sys.argv[1:]]
try:
    from gpualloc.cli.main import run
    run()
except SystemExit:
    pass
finally:
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("typer", "rich", "networkx"))
    models = ("gpualloc.placement", "gpualloc.discovery")
    if sys.argv[1] != "release":  # release reads the leases it gave back, in the ledger's types
        models += ("gpualloc.model.topology", "gpualloc.ledger")
        heavy += sorted(m for m in sys.modules if m.split(".")[0] == "msgspec")
        heavy += ["gpualloc.model.job"] if "gpualloc.model.job" in sys.modules else []
    light = ("gpualloc.ledger", "gpualloc.ledger.liveness")  # an alloc's owner: its /proc facts
    heavy += sorted(m for m in sys.modules if m.startswith(models) and m not in light)
    os.write(2, ("IMPORTED " + " ".join(heavy) + "\\n").encode())
"""


@pytest.mark.parametrize(
    "args",
    [["alloc", "--hold", "-n", "2"], ["release", "--mine"], ["run", "-n", "1", "--", "true"]],
    ids=["alloc", "release", "run"],
)
def test_through_the_broker_run_and_alloc_load_no_msgspec_and_release_no_engine(
    broker: RunningBroker, args: list[str]
) -> None:
    env = {**_clean_env(), "GPUALLOC_BROKER": str(broker.socket)}
    result = subprocess.run(
        [sys.executable, "-c", IMPORTS, *args], env=env, capture_output=True, text=True, timeout=60
    )
    assert "IMPORTED" in result.stderr, result.stderr
    imported = result.stderr.rsplit("IMPORTED", 1)[1].split()
    assert imported == [], imported
    assert result.returncode == 0, result.stderr


def test_slurm_hooks_go_through_the_broker_or_write_its_ledger_when_none_answers(
    tmp_path: Path,
) -> None:
    if os.geteuid() != 0:
        pytest.skip("the Slurm hooks run as root")
    broker = RunningBroker(TOPOLOGY)
    config = tmp_path / "config.toml"
    config.write_text(
        f'[host]\nbroker = "{broker.socket}"\n\n[broker]\nstate_dir = "{broker.state}"\n'
    )
    broker.system_config = config
    env = {**_clean_env(), "GPUALLOC_SYSTEM_CONFIG": str(config), "GPUALLOC_TOPOLOGY": TOPOLOGY}
    job = {"SLURM_JOB_ID": "88", "SLURM_JOB_GPUS": "2,3", "SLURM_JOB_UID": "0"}

    def hook(kind: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "gpualloc", "slurm", kind],
            env={**env, **job}, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert result.returncode == 0
        return result.stderr

    try:
        said = hook("prolog")  # no broker yet: root writes the broker's ledger itself
        assert "does not answer" in said and "recorded GPU 2-3" in said, said
        broker.start()
        (lease,) = _leases(broker)
        assert lease["slurm_job"] == "88" and [g["index"] for g in lease["gpus"]] == [2, 3]
        said = hook("epilog")
        assert "released GPU 2-3" in said and "does not answer" not in said, said
        assert not _leases(broker)
    finally:
        broker.stop()
        shutil.rmtree(broker.directory, ignore_errors=True)


@pytest.mark.slow
def test_a_brokered_job_that_leaves_its_gpus_is_ended_by_its_verifier() -> None:
    if os.geteuid() != 0:
        pytest.skip("the broker's tests run it as root (CI runs as root)")
    from gpualloc.topologies import load_bundled

    broker = RunningBroker(TOPOLOGY)
    host_file = broker.directory / "host.json"
    host_file.write_text(load_bundled(TOPOLOGY).to_json())
    broker.topology = str(host_file)
    broker.start()
    script = broker.directory / "declare.py"
    script.write_text(DECLARE)
    env = {
        **_clean_env(), "GPUALLOC_BROKER": str(broker.socket),
        "GPUALLOC_VERIFY_GRACE": "60", "GPUALLOC_VERIFY_ACTION": "kill",
    }  # fmt: skip
    run = ["run", "--gpus", "0,1", "--"]
    argv = [
        sys.executable,
        "-m",
        "gpualloc",
        *run,
        sys.executable,
        str(script),
        str(host_file),
        "3",
    ]
    job = subprocess.Popen(
        argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert job.stdout is not None and job.stdout.readline().strip()  # it declared itself
        err = stderr_until(job, "verify.action")
        assert "runs on GPU 3, which the lease does not hold (it holds GPU 0-1)" in err, err
        assert "ending it (verify.action = kill)" in err
        job.wait(timeout=30)
        assert job.returncode == -15
        _until(lambda: not _leases(broker), "the ended job's lease to go", 5)
    finally:
        end(job)
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
    broker.call("alloc", _hold_request("eeeeeeeeeeee", gpus=2))
    _until(lambda: (broker.state / "fair-share.json").exists(), "the fair-share file", 5)
    saved = json.loads((broker.state / "fair-share.json").read_text())
    _until(
        lambda: json.loads((broker.state / "fair-share.json").read_text())["usage"].get("0", 0) > 0,
        "root's GPU-seconds to count",
        5,
    )
    assert (broker.state / "fair-share.json").stat().st_mode & 0o777 == 0o644
    assert saved["saved"] > 0


def test_a_waiters_timeout_is_kept_to_and_says_why(broker: RunningBroker) -> None:
    broker.call("alloc", _hold_request("ffffffffffff", gpus=4))
    started = time.monotonic()
    waiter = _cli(broker, "alloc", "--wait", "--timeout", "1.5", "--hold")
    _, err = finish(waiter, timeout_s=30)
    assert waiter.returncode == 124, err
    assert time.monotonic() - started < 5
    assert "no GPUs for this job within 1.5 s (the job needs 1 GPU and" in err
    assert not broker.call("snapshot")["ledger"]["queue"]


def test_a_waiter_that_allows_unhealthy_gpus_is_placed_on_one_when_its_turn_comes(
    tmp_path: Path,
) -> None:
    """--allow-unhealthy through the broker, at once and for a queued turn, which the broker
    places itself (GPU 1 is unhealthy; then the healthy three are held)."""
    if os.geteuid() != 0:
        pytest.skip("the broker's tests run it as root (CI runs as root)")
    from gpualloc.topologies import load_bundled

    data = json.loads(load_bundled(TOPOLOGY).to_json())
    data["faults"] = [{"gpu": 1, "kind": "ecc", "detail": "3 uncorrectable ECC errors"}]
    sick = tmp_path / "sick.json"
    sick.write_text(json.dumps(data))
    sick.chmod(0o644)
    running = RunningBroker(str(sick)).start()
    try:
        named = _cli(running, "alloc", "--gpus", "1", "--hold")
        finish(named, timeout_s=30)
        assert named.returncode == ExitCode.NO_PLACEMENT
        forced = _cli(
            running, "alloc", "--gpus", "1", "--hold", "--allow-unhealthy", "--format", "json"
        )
        out, err = finish(forced, timeout_s=30)
        assert forced.returncode == 0, err
        released = _cli(running, "release", json.loads(out)["lease"]["id"])
        finish(released, timeout_s=30)
        assert released.returncode == 0 and not _leases(running)
        running.call("alloc", _hold_request("ffffffffffff", gpus=3))
        held = {g["index"] for g in _leases(running)[0]["gpus"]}
        assert held == {0, 2, 3}
        strict = _cli(running, "alloc", "--wait", "--timeout", "1", "--hold")
        finish(strict, timeout_s=30)
        assert strict.returncode == 124  # healthy GPUs only: none comes free
        lenient = _cli(
            running, "alloc", "--wait", "--timeout", "20", "--hold", "--allow-unhealthy",
            "--format", "json",
        )  # fmt: skip
        out, err = finish(lenient, timeout_s=30)
        assert lenient.returncode == 0, err
        assert json.loads(out)["placement"]["gpus"] == [1]
    finally:
        running.stop()
        shutil.rmtree(running.directory, ignore_errors=True)


def test_a_member_that_ended_adopts_nothing_through_its_reused_pid() -> None:
    """The watch adopts a child only of a live member with the recorded start time: once a
    member has ended, a process that got its pid (here: recorded with another start time, as
    the member's would be) and that process's children never keep the lease."""
    from gpualloc.broker.watch import ProcessWatch
    from gpualloc.ledger.liveness import process_start_time

    shell = subprocess.Popen(
        ["sh", "-c", "sleep 60 & echo started; wait"], stdout=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        assert shell.stdout is not None and shell.stdout.readline() == "started\n"
        started = process_start_time(shell.pid)
        assert started is not None
        reused, live = ProcessWatch(), ProcessWatch()
        reused.members["aaaaaaaaaaaa"] = {(shell.pid, started - 5.0)}  # the ended member
        live.members["aaaaaaaaaaaa"] = {(shell.pid, started)}
        live.members["bbbbbbbbbbbb"] = {(shell.pid, started)}  # two allocs of one shell
        reused.look()
        live.look()
        assert not reused.alive("aaaaaaaaaaaa"), "a reused pid's child kept the lease"
        os.kill(shell.pid, 9)  # the live member's child outlives it and keeps its lease
        shell.wait(timeout=30)
        live.look()
        for lease_id in ("aaaaaaaaaaaa", "bbbbbbbbbbbb"):
            assert live.alive(lease_id) and len(live.members[lease_id]) == 1, lease_id
    finally:
        end(shell, group=True)


def test_a_group_lives_while_a_member_runs_as_the_watchs_pass_finds_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A lease whose group leader has ended lives while its process group has a member that
    has not ended. The broker asks its stepped pass over ``/proc`` rather than walk it whole
    for each such lease at every reap (the walk's length is other users' to decide): the
    group is alive until a whole pass finds no running member, and no walk runs."""
    import gpualloc.ledger.liveness as liveness
    from gpualloc.broker.watch import ProcessWatch

    def walked(group: int) -> bool:
        raise AssertionError("the broker walked all of /proc for a process group")

    monkeypatch.setattr(liveness, "_live_member", walked)
    leader = subprocess.Popen(
        ["sh", "-c", "sleep 60 >/dev/null & echo $!; read line"], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert leader.stdout is not None
        member = int(leader.stdout.readline())
        watch = ProcessWatch()
        watch.members["aaaaaaaaaaaa"] = {(leader.pid, liveness.process_start_time(leader.pid))}
        watch.watch_group("aaaaaaaaaaaa", leader.pid)
        assert watch.group_member(leader.pid), "a group no pass has looked for yet is alive"
        leader.communicate("\n", timeout=30)  # the leader ends; its group's sleep runs on
        assert liveness.process_alive(member, None)
        watch.look()
        assert liveness.group_alive(leader.pid, watch.group_member)
        os.kill(member, 9)
        deadline = time.monotonic() + 30
        while liveness.process_alive(member, None) and time.monotonic() < deadline:
            time.sleep(0.05)  # reaped by whoever adopted it
        watch.look()
        assert not liveness.group_alive(leader.pid, watch.group_member)
        assert not watch.group_member(leader.pid)
    finally:
        end(leader, group=True)
