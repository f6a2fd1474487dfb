"""Who may do what on a shared host: attacks by real Unix users on one another, against a
broker-mode host and against the cooperative shared-file mode; and no way around the broker
(broker mode is the root-owned directory of the default socket, never a fall-back to the file
ledger; clients talk only to a server run by root or themselves; ``serve`` listens only in a
directory no other user may change).

Each attack test runs twice: ``broker`` (``gpualloc serve`` owns the ledger; users reach it only
through its socket), where the attack must fail, and ``shared`` (the README's 1777 directory),
where it still works: that run is a strict xfail, so this file also proves that the test can
fail, and that the cooperative mode is as forgeable as ``status`` and ``doctor`` say.

Users are made with useradd and removed after (tests/unix_users.py); the broker runs as root.
Skipped, with the reason, where the tests do not run as root.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gpualloc.wire.address import BROKER_DIRECTORY
from tests.broker_harness import RunningBroker
from tests.child_processes import end
from tests.unix_users import UnixUser, UserCommandLine, ensure_user, shared_directory

TOPOLOGY = "nvlink-pairs-4gpu"
STEM = "ledger@nvlink-pairs-4gpu-1b11075b"
NAMES = ("alice", "bob", "carol")
QUICK_S = 5.0

pytestmark = pytest.mark.slow
MODES = [
    "broker",
    pytest.param("shared", marks=pytest.mark.xfail(strict=True, reason="cooperative: forgeable")),
]


@pytest.fixture(scope="module")
def users() -> dict[str, UnixUser]:
    return {name: ensure_user(f"gpualloc-t-{name}") for name in NAMES}


@pytest.fixture(scope="module")
def as_user(users: dict[str, UnixUser]) -> UserCommandLine:
    return UserCommandLine(users["alice"])


class Host:
    """One host in one mode: how users run gpualloc there, and where its files are."""

    def __init__(self, mode: str, as_user: UserCommandLine, directory: Path) -> None:
        self.mode = mode
        self.as_user = as_user
        self.broker: RunningBroker | None = None
        if mode == "broker":
            self.broker = RunningBroker(TOPOLOGY).start()
            self.state = self.broker.state
            self.env = {"GPUALLOC_BROKER": str(self.broker.socket)}
            self.args: tuple[str, ...] = ()
        else:
            self.state = directory
            self.env = {"GPUALLOC_STATE_DIR": str(directory), "GPUALLOC_LOCK_TIMEOUT": "3"}
            self.args = ("-t", TOPOLOGY)

    def __call__(self, user: UnixUser, *args: str, **env: str) -> subprocess.CompletedProcess:
        return self.as_user(user, *self.args, *args, env={**self.env, **env})

    def popen(self, user: UnixUser, *args: str) -> subprocess.Popen[str]:
        return self.as_user.popen(user, *self.args, *args, env=self.env)

    def root(self, *args: str, **env: str) -> subprocess.CompletedProcess:
        extra = {} if self.broker else {"GPUALLOC_TOPOLOGY": TOPOLOGY}
        return self.as_user(UnixUser("root", 0, 0), *args, env={**self.env, **extra, **env})

    def python(self, user: UnixUser, code: str, *args: str) -> subprocess.CompletedProcess:
        """Python ``code`` run as ``user`` (the hostile part of an attack)."""
        return self.as_user._run(user, [self.as_user.python, "-c", code, *args], {})

    @property
    def ledger(self) -> Path:
        return self.state / f"{STEM}.json"

    def names(self, users: dict[str, UnixUser]) -> list[Path]:
        """Every name gpualloc keeps in the state directory, and users' predictable ones."""
        found = [
            self.ledger,
            self.state / f"{STEM}.lock",
            self.state / f"{STEM}.0.good.json",
            self.state / f"{STEM}.root-journal.json",
            self.state / f"{STEM}.root-journal.lock",
            self.state / "slurm-hooks.log",
        ]
        found += [self.state / f"{STEM}.{user.uid}.good.json" for user in users.values()]
        return found

    def status(self, user: UnixUser) -> dict:
        result = self(user, "status", "--json")
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    def close(self) -> None:
        if self.broker is not None:
            self.broker.stop()
            shutil.rmtree(self.broker.directory, ignore_errors=True)


@contextmanager
def _host(mode: str, as_user: UserCommandLine) -> Iterator[Host]:
    directory = shared_directory("gpualloc-shared-")
    made = Host(mode, as_user, directory)
    if made.mode == "shared":  # the first command creates the files, as on a fresh host
        assert made(ensure_user("gpualloc-t-carol"), "status").returncode == 0
    try:
        yield made
    finally:
        made.close()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(params=MODES)
def host(request: pytest.FixtureRequest, as_user: UserCommandLine) -> Iterator[Host]:
    with _host(request.param, as_user) as made:
        yield made


@pytest.fixture(params=["broker", "shared"])
def either_host(request: pytest.FixtureRequest, as_user: UserCommandLine) -> Iterator[Host]:
    """Both ledgers, for what holds in the cooperative one too (no file is forged)."""
    with _host(request.param, as_user) as made:
        yield made


def _until(condition: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _holders(status: dict) -> dict[str, list[int]]:
    held: dict[str, list[int]] = {}
    for lease in status["leases"]:
        held.setdefault(lease["user"], []).extend(g["index"] for g in lease["gpus"])
    return {user: sorted(gpus) for user, gpus in held.items()}


def _lease_of(status: dict, user: UnixUser) -> dict:
    (lease,) = [x for x in status["leases"] if x["user"] == user.name]
    return lease


def _running(host: Host, user: UnixUser, gpus: int = 2) -> subprocess.Popen[str]:
    job = host.popen(user, "run", "-n", str(gpus), "--", "sleep", "120")
    try:
        _until(lambda: user.name in _holders(host.status(user)), f"{user.name}'s job to start")
    except BaseException:
        end(job)
        raise
    return job


REWRITE = """
import json, sys
path, victim, to_uid = sys.argv[1], sys.argv[2], sys.argv[3]
try:
    data = json.load(open(path))
    if to_uid == "-":
        data["leases"] = [x for x in data["leases"] if x["user"] != victim]
    else:
        for lease in data["leases"]:
            if lease["user"] == victim:
                lease["uid"], lease["user"] = int(to_uid), sys.argv[4]
    open(path, "w").write(json.dumps(data))
    print("written")
except OSError as exc:
    print("refused", exc.errno)
"""


def test_deleting_another_users_live_lease_from_the_ledger_takes_no_gpus(
    host: Host, users: dict[str, UnixUser]
) -> None:
    alice, bob = users["alice"], users["bob"]
    job = _running(host, alice)
    try:
        attack = host.python(bob, REWRITE, str(host.ledger), alice.name, "-")
        assert attack.returncode == 0, attack.stderr
        taken = host(bob, "alloc", "-n", "4", "--hold")
        assert taken.returncode == 10, "bob took the GPUs of alice's running job"
        assert _holders(host.status(bob)).get(alice.name), "alice's lease is gone"
        assert "refused" in attack.stdout
    finally:
        end(job)


def test_rewriting_a_lease_to_ones_own_uid_does_not_let_one_release_it(
    host: Host, users: dict[str, UnixUser]
) -> None:
    alice, bob = users["alice"], users["bob"]
    job = _running(host, alice)
    try:
        lease = _lease_of(host.status(alice), alice)["id"]
        host.python(bob, REWRITE, str(host.ledger), alice.name, str(bob.uid), bob.name)
        released = host(bob, "release", lease)
        assert released.returncode == 12, released.stderr
        assert _lease_of(host.status(alice), alice)["id"] == lease
    finally:
        end(job)


PLANT = """
import os, sys
made = []
for name in sys.argv[1:]:
    try:
        os.mkdir(name)
        made.append(name)
    except OSError:
        pass
print(len(made))
"""


def test_directories_planted_at_state_names_neither_skip_a_slurm_job_nor_lock_a_user_out(
    host: Host, users: dict[str, UnixUser]
) -> None:
    alice, bob, carol = users["alice"], users["bob"], users["carol"]
    for path in host.names(users):  # whatever the first command made: bob strikes before it
        if path.is_file() and host.mode == "shared" and path.name != f"{STEM}.json":
            path.unlink()
    planted = host.python(bob, PLANT, *map(str, host.names(users)))
    assert planted.returncode == 0, planted.stderr
    job = {"SLURM_JOB_ID": "71", "SLURM_JOB_GPUS": "0,1", "SLURM_JOB_UID": str(carol.uid)}
    prolog = host.root("slurm", "prolog", **job)
    assert prolog.returncode == 0  # a Prolog never fails the node, whatever happens
    assert _holders(host.status(alice)).get(carol.name) == [0, 1], prolog.stderr
    mine = host(alice, "alloc", "-n", "1", "--hold")
    assert mine.returncode == 0, f"alice is locked out: {mine.stderr}"
    assert planted.stdout.strip() == "0", "bob could create files in the state directory"


def test_a_squatter_cannot_take_a_slurm_jobs_gpus(
    either_host: Host, users: dict[str, UnixUser]
) -> None:
    """Bob held GPUs 2,3 before Slurm gave them to carol's job. On b2653dd
    the Prolog recorded nothing, and once bob released them alice was given them while the job
    ran. Slurm is authoritative now: the job's lease records 2,3, bob's lease is marked and he
    is told, and 2,3 stay the job's."""
    host = either_host
    alice, bob, carol = users["alice"], users["bob"], users["carol"]
    held = host(bob, "alloc", "--hold", "--gpus", "2,3", "--format", "json")
    assert held.returncode == 0, held.stderr
    squatter = json.loads(held.stdout)["lease"]["id"]
    job = {"SLURM_JOB_ID": "72", "SLURM_JOB_GPUS": "2,3", "SLURM_JOB_UID": str(carol.uid)}
    prolog = host.root("slurm", "prolog", **job)
    assert prolog.returncode == 0 and "marked conflicting" in prolog.stderr, prolog.stderr
    told = host(bob, "status")
    assert f"CONFLICT: lease {squatter} of {bob.name}" in told.stdout + told.stderr
    assert host(bob, "release", squatter).returncode == 0
    taken = host(alice, "alloc", "--hold", "--gpus", "2,3")
    assert taken.returncode == 10, taken.stderr
    rest = host(alice, "alloc", "--hold", "-n", "2", "--format", "json")
    assert rest.returncode == 0, rest.stderr
    assert not {2, 3} & {g["index"] for g in json.loads(rest.stdout)["lease"]["gpus"]}
    assert _holders(host.status(alice)).get(carol.name) == [2, 3]


FLOCK = """
import fcntl, os, sys, time
try:
    fd = os.open(sys.argv[1], os.O_RDONLY | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    print("held", flush=True)
except OSError as exc:
    print("refused", exc.errno, flush=True)
    sys.exit(0)
time.sleep(60)
"""


def test_holding_the_ledger_lock_stalls_nobody(host: Host, users: dict[str, UnixUser]) -> None:
    alice, bob = users["alice"], users["bob"]
    holder = subprocess.Popen(
        [host.as_user.python, "-c", FLOCK, str(host.state / f"{STEM}.lock")],
        user=bob.uid, group=bob.gid, extra_groups=[], stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        said = holder.stdout.readline() if holder.stdout else ""
        started = time.monotonic()
        allocated = host(alice, "alloc", "-n", "1", "--hold")
        released = host(alice, "release", "--mine")
        assert allocated.returncode == 0 and released.returncode == 0, allocated.stderr
        assert time.monotonic() - started < 2 * QUICK_S, "alice was stalled"
        assert said.startswith("refused"), f"bob holds the lock: {said}"
    finally:
        end(holder)


def test_a_lease_cannot_be_bound_to_another_users_process(
    host: Host, users: dict[str, UnixUser]
) -> None:
    alice, bob = users["alice"], users["bob"]
    sleeper = subprocess.Popen(["sleep", "120"], user=alice.uid, group=alice.gid, extra_groups=[])
    try:
        bound = host(bob, "alloc", "-n", "1", "--pid", str(sleeper.pid))
        assert bound.returncode == 12, "bob bound a lease to alice's process"
        assert "belongs to" in bound.stderr and "Traceback" not in bound.stderr
    finally:
        end(sleeper)


def test_status_and_doctor_say_who_keeps_the_ledger(host: Host, users: dict[str, UnixUser]) -> None:
    alice, bob = users["alice"], users["bob"]
    for user in (alice, bob):
        assert host(user, "alloc", "-n", "1", "--hold").returncode == 0
    status = host(alice, "status")
    doctor = host(alice, "doctor", "--json")
    trust = host.status(alice)["trust"]["mode"]
    findings = {
        f["where"]: f for f in json.loads(doctor.stdout)["findings"] if f["check"] == "ledger"
    }
    assert trust == "broker", status.stdout
    assert "can forge" not in status.stdout
    assert findings["broker"]["severity"] == "ok"
    assert all(f["severity"] == "ok" for f in findings.values()), findings


def test_the_cooperative_mode_says_its_leases_can_be_forged(
    users: dict[str, UnixUser], as_user: UserCommandLine
) -> None:
    directory = shared_directory("gpualloc-shared-")
    try:
        host = Host("shared", as_user, directory)
        for user in (users["alice"], users["bob"]):
            assert host(user, "alloc", "-n", "1", "--hold").returncode == 0
        status = host(users["alice"], "status")
        assert "can forge" in status.stdout and "Multi-user host" in status.stdout
        doctor = json.loads(host(users["alice"], "doctor", "--json").stdout)
        (ledger,) = [f for f in doctor["findings"] if f["check"] == "ledger"]
        assert ledger["where"] == "cooperative" and "forge" in ledger["detail"]
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.parametrize("mode", ["broker", "shared"])
def test_the_owner_of_a_shareable_lease_evicts_another_users_shared_job(
    mode: str, users: dict[str, UnixUser], as_user: UserCommandLine
) -> None:
    """In both modes: alice shares her GPU, bob's shared job runs beside it, carol may not
    evict it, alice may, and bob's own watcher (alice cannot signal bob's processes; it reads
    the ledger, which every user may read) ends his job, and then itself."""
    directory = shared_directory("gpualloc-shared-")
    host = Host(mode, as_user, directory)
    alice, bob, carol = (users[name] for name in NAMES)
    try:
        mine = json.loads(
            host(alice, "alloc", "--hold", "--shareable", "--mem", "8G", "--format", "json").stdout
        )["lease"]["id"]
        job = host.popen(
            bob, "run", "--share", "--mem", "4G", "--", "sh", "-c",
            "trap 'echo evicted; exit 7' TERM; echo started; while :; do sleep 0.05; done",
        )  # fmt: skip
        try:
            assert job.stdout is not None and job.stdout.readline().strip() == "started"
            (share,) = [x for x in host.status(carol)["leases"] if x["share"]]
            assert share["user"] == bob.name
            refused = host(carol, "release", "--evict-shared", share["id"])
            assert refused.returncode == 12, refused.stderr
            assert f"belongs to {bob.name} and runs beside {alice.name}'s lease" in refused.stderr
            evicted = host(alice, "release", "--evict-shared", mine, "--grace", "5s")
            assert evicted.returncode == 0, evicted.stderr
            assert f"shared by {bob.name}" in evicted.stdout
            out, _ = job.communicate(timeout=60)
        finally:
            end(job)
        assert job.returncode == 7 and out.strip() == "evicted"
        assert [x["id"] for x in host.status(bob)["leases"]] == [mine]
        _until(lambda: not _processes_of(bob), "bob's watcher to exit after his job", 10)
    finally:
        host.close()
        shutil.rmtree(directory, ignore_errors=True)


def _processes_of(user: UnixUser) -> list[int]:
    import psutil

    return [p.pid for p in psutil.process_iter(["uids"]) if p.info["uids"].real == user.uid]


TWICE = """
import json, socket, sys
request = {"count": 3, "sensitive": True, "policy": "drb", "pattern": "file:twice",
           "edges": [[0, 1], [1, 0], [0, 2]]}
line = {"v": 1, "op": "alloc", "args": {"lease_id": "aaaaaaaaaaaa", "options": request,
                                        "terms": {"source": "alloc", "hold": True}}}
with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
    connection.settimeout(30)
    connection.connect(sys.argv[1])
    connection.sendall(json.dumps(line).encode() + b"\\n")
    print(connection.makefile().readline())
"""


def test_a_pattern_naming_a_pair_twice_is_refused_and_the_worker_serves_the_next(
    users: dict[str, UnixUser], as_user: UserCommandLine
) -> None:
    """One request of any user killed the broker's placement worker for its lifetime: a
    pattern naming a pair of its three ranks twice raised an AssertionError in the order
    search, the worker ended and every later search ran in the loop. It is refused at the
    door (exit 2), and the worker searches the next request."""
    with _host("broker", as_user) as host:
        assert host.broker is not None
        worker = host.broker.worker()
        sent = host.python(users["alice"], TWICE, str(host.broker.socket))
        assert sent.returncode == 0, sent.stderr
        error = json.loads(sent.stdout)["error"]
        assert error["code"] == 2, error
        assert "edge #1 (1, 0) names ranks 0 and 1 again" in error["message"], error
        placed = host(users["alice"], "alloc", "--hold", "-n", "3", "--policy", "drb")
        assert placed.returncode == 0, placed.stderr
        assert host.broker.worker() == worker
        log = host.broker.log_text()
        assert "placement worker" not in log and "internal error" not in log, log


LONG_JOB = """
import json, subprocess, sys
status = subprocess.run(
    [sys.executable, "-m", "gpualloc", *json.loads(sys.argv[1]), "status", "--json"],
    capture_output=True, text=True, check=True,
)
print(json.dumps({"argv": sys.argv[2:], "status": json.loads(status.stdout)}))
"""


def test_a_job_with_a_long_command_line_runs_whole_and_its_lease_keeps_it_cut(
    either_host: Host, users: dict[str, UnixUser]
) -> None:
    """On 4d2ba32 a job with more than 64 KiB of argv could not run through the broker (exit
    18, "a request is at most 65536 bytes"), though it ran on the file ledger: the client sent
    the whole command, of which the lease keeps only the first words. Now the client sends
    the command as the lease keeps it: the job gets all its argv, both ledgers keep the same
    cut (:func:`gpualloc.model.printable.lease_command`)."""
    from gpualloc.model.printable import lease_command

    host, alice = either_host, users["alice"]
    words = [letter * 100_000 for letter in "abcdef"]  # 600 kB (one argument: 128 KiB at most)
    job = [host.as_user.python, "-c", LONG_JOB, json.dumps(host.args), *words]
    ran = host(alice, "run", "-n", "1", "--", *job)
    assert ran.returncode == 0, ran.stderr[-2000:]
    seen = json.loads(ran.stdout)
    assert seen["argv"] == words, "the job did not get its whole argv"
    lease = _lease_of(seen["status"], alice)
    assert lease["command"] == list(lease_command(job))
    assert sum(map(len, lease["command"])) == 4096 and lease["command"][-1][0] == "a"


# ---- no way around the broker ---------------------------------------------------------------


@pytest.fixture
def bobs_directory(users: dict[str, UnixUser]) -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="gpualloc-bob-"))
    directory.chmod(0o755)
    os.chown(directory, users["bob"].uid, users["bob"].gid)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def test_serve_refuses_a_socket_directory_another_user_owns(bobs_directory: Path) -> None:
    """Root's broker in bob's directory: bob could replace its socket with his own."""
    done = subprocess.run(
        [sys.executable, "-m", "gpualloc", "--topology", "dgx1-v100", "serve",
         "--socket", str(bobs_directory / "broker.sock"),
         "--state-dir", str(bobs_directory.parent / f"{bobs_directory.name}-state")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 18, done.stderr
    assert "could replace the socket" in done.stderr
    assert not (bobs_directory / "broker.sock").exists()


def test_serve_keeps_a_file_that_is_not_a_socket(tmp_path: Path) -> None:
    """``serve --socket FILE`` refuses a regular file there and leaves it be."""
    keep = tmp_path / "notes.txt"
    keep.write_text("mine")
    done = subprocess.run(
        [sys.executable, "-m", "gpualloc", "--topology", "dgx1-v100", "serve",
         "--socket", str(keep), "--state-dir", str(tmp_path / "state")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 18 and "is not a socket" in done.stderr
    assert keep.read_text() == "mine"


def test_a_client_sends_nothing_to_a_server_another_user_runs(
    users: dict[str, UnixUser], bobs_directory: Path
) -> None:
    """Bob serves a socket of his own and points alice at it: her gpualloc refuses it (exit
    18) before sending a byte."""
    alice, bob = users["alice"], users["bob"]
    path = bobs_directory / "fake.sock"
    # The listener is a process of bob's: the kernel names him to alice's client.
    script = (
        "import socket, sys, time\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.bind(sys.argv[1]); "
        "s.listen(4)\nimport os; os.chmod(sys.argv[1], 0o666)\n"
        "print('ready', flush=True)\n"
        "c, _ = s.accept(); c.settimeout(5)\n"
        "try:\n    data = c.recv(65536)\nexcept OSError:\n    data = b''\n"
        "print(repr(data), flush=True)\n"
    )
    as_user = UserCommandLine(alice)
    server = subprocess.Popen(
        [as_user.python, "-c", script, str(path)], stdout=subprocess.PIPE, text=True,
        user=bob.uid, group=bob.gid, extra_groups=[], cwd="/",
    )  # fmt: skip
    try:
        assert server.stdout is not None
        assert server.stdout.readline().strip() == "ready"
        asked = as_user(alice, "alloc", "--hold", "-n", "1", env={"GPUALLOC_BROKER": str(path)})
        assert asked.returncode == 18, asked.stderr
        assert "not by root" in asked.stderr
        received, _ = server.communicate(timeout=30)
    finally:
        end(server)
    assert received.strip().endswith("b''"), received  # not one byte of the request


@pytest.mark.skipif(os.path.lexists(BROKER_DIRECTORY), reason=f"{BROKER_DIRECTORY} is in use")
def test_a_host_in_broker_mode_never_falls_back_to_the_file_ledger(
    users: dict[str, UnixUser],
) -> None:
    """The broker's directory stands, its socket is gone (a broker that stopped cleanly):
    every client says the broker does not answer (exit 18) and writes no file ledger."""
    alice = users["alice"]
    state = Path(tempfile.mkdtemp(prefix="gpualloc-fallback-"))
    state.chmod(0o1777)
    Path(BROKER_DIRECTORY).mkdir(mode=0o755)
    try:
        as_user = UserCommandLine(alice)
        env = {"GPUALLOC_STATE_DIR": str(state)}
        asked = as_user(alice, "alloc", "--hold", "-n", "1", env=env)  # this host's ledger
        assert asked.returncode == 18, asked.stderr
        assert "does not answer" in asked.stderr and BROKER_DIRECTORY in asked.stderr
        assert list(state.iterdir()) == []
    finally:
        shutil.rmtree(BROKER_DIRECTORY, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)


def test_a_directory_another_user_made_there_is_no_mark(users: dict[str, UnixUser]) -> None:
    from gpualloc.wire.address import broker_socket

    if os.path.lexists(BROKER_DIRECTORY):
        pytest.skip(f"{BROKER_DIRECTORY} is in use")
    Path(BROKER_DIRECTORY).mkdir(mode=0o755)
    try:
        assert broker_socket(None) is not None
        os.chown(BROKER_DIRECTORY, users["bob"].uid, users["bob"].gid)
        assert broker_socket(None) is None
    finally:
        shutil.rmtree(BROKER_DIRECTORY, ignore_errors=True)


def test_doctor_checks_who_owns_the_brokers_files(users: dict[str, UnixUser]) -> None:
    """Modes alone do not say who may change a file: a ledger another user owns is a problem
    even at 0644."""
    broker = RunningBroker("dgx1-v100").start()
    try:
        broker.call("hello")
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUALLOC_")}
        env["GPUALLOC_BROKER"] = str(broker.socket)
        argv = [sys.executable, "-m", "gpualloc", "doctor"]
        fine = subprocess.run(
            argv, capture_output=True, text=True, env=env, check=False, timeout=120
        )
        assert "socket directory" in fine.stdout and "belongs to uid" not in fine.stdout
        os.chown(broker.state, users["alice"].uid, users["alice"].gid)
        planted = subprocess.run(
            argv, capture_output=True, text=True, env=env, check=False, timeout=120
        )
        assert planted.returncode != 0
        assert f"belongs to uid {users['alice'].uid}, not the broker's 0" in planted.stdout
    finally:
        os.chown(broker.state, 0, 0)
        broker.stop()
        shutil.rmtree(broker.directory, ignore_errors=True)
