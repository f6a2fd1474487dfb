"""One state directory shared by real Unix users, as a lab sets it up.

Every test here runs the real command line as real users (made with useradd, removed after),
in a root-owned mode-1777 directory: who creates the files first must not matter, a file
another user planted must give a clear error at once (never a hang), a user who holds the
ledger's lock is named and cannot stop root's Slurm hooks, and nobody can lift the queue's
bounds for themselves. Skipped, with the reason, where the tests do not run as root.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.child_processes import end, end_all, stderr_until
from tests.unix_users import UnixUser, UserCommandLine, ensure_user, shared_directory

TOPOLOGY = "nvlink-pairs-4gpu"
STEM = "ledger@nvlink-pairs-4gpu-1b11075b"
"""The ledger files of that bundled topology (its own scope, never the host's)."""
NAMES = ("alice", "bob", "carol")
QUICK_S = 5.0
"""A refusal takes milliseconds; this bounds the whole command, Python's start-up included."""

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def users() -> dict[str, UnixUser]:
    return {name: ensure_user(f"gpualloc-t-{name}") for name in NAMES}


@pytest.fixture(scope="module")
def system_config_dir() -> Iterator[Path]:
    path = shared_directory("gpualloc-etc-")
    path.chmod(0o755)
    config = path / "config.toml"
    config.write_text("# the test host's system configuration: none of its own\n")
    config.chmod(0o644)  # a named file that does not exist is an error (exit 15)
    yield path
    shutil.rmtree(path)


@pytest.fixture(scope="module")
def as_user(users: dict[str, UnixUser], system_config_dir: Path) -> UserCommandLine:
    return UserCommandLine(users["alice"], system_config=system_config_dir / "config.toml")


@pytest.fixture
def shared() -> Iterator[Path]:
    path = shared_directory("gpualloc-shared-")
    yield path
    shutil.rmtree(path, ignore_errors=True)  # a finished job's lock remover may unlink meanwhile


def _gpualloc(
    as_user: UserCommandLine, shared: Path, topology: str = TOPOLOGY
) -> Callable[..., subprocess.CompletedProcess[str]]:
    def run(user: UnixUser, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return as_user(user, "-t", topology, *args, env={"GPUALLOC_STATE_DIR": str(shared), **env})

    return run


def _lease_id(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["lease"]["id"]


def _until(condition: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _status(run: Callable[..., subprocess.CompletedProcess[str]], user: UnixUser) -> dict:
    result = run(user, "status", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _holders(status: dict) -> dict[str, list[int]]:
    held: dict[str, list[int]] = {}
    for lease in status["leases"]:
        held.setdefault(lease["user"], []).extend(g["index"] for g in lease["gpus"])
    return {user: sorted(gpus) for user, gpus in held.items()}


@pytest.mark.parametrize("order", list(itertools.permutations(NAMES)), ids="-".join)
def test_three_users_alternate_alloc_status_release_and_wait_in_any_order_of_creation(
    order: tuple[str, ...], users: dict[str, UnixUser], as_user: UserCommandLine, shared: Path
) -> None:
    run = _gpualloc(as_user, shared)
    first, second, third = (users[name] for name in order)
    ids = {}
    for user in (first, second, third):  # the first creates every file; the others share them
        ids[user.name] = _lease_id(run(user, "alloc", "-n", "1", "--hold", "--format", "json"))
    for user in (third, first, second):
        assert sorted(_holders(_status(run, user))) == sorted(ids)
    refused = run(second, "release", ids[first.name])
    assert refused.returncode == 12 and first.name in refused.stderr
    for user in (second, third, first):
        assert run(user, "release", ids[user.name]).returncode == 0
    assert _status(run, third)["leases"] == []

    everything = _lease_id(run(first, "alloc", "-n", "4", "--hold", "--format", "json"))
    waiter = as_user.popen(
        third, "-t", TOPOLOGY, "alloc", "--wait", "--timeout", "60", "-n", "2", "--hold",
        "--format", "json", env={"GPUALLOC_STATE_DIR": str(shared)},
    )  # fmt: skip
    try:
        _until(lambda: len(_status(run, second)["queue"]) == 1, "the waiter to join the queue")
        assert run(first, "release", everything).returncode == 0
        out, err = waiter.communicate(timeout=60)
    finally:
        end(waiter)
    assert waiter.returncode == 0, err
    assert _holders(_status(run, second)) == {third.name: json.loads(out)["placement"]["gpus"]}
    for path in shared.iterdir():  # nothing a user could not share was left behind
        assert not path.is_symlink()


def _plant_fifo(path: Path, owner: UnixUser) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    os.chown(path, owner.uid, owner.gid)


def _quick(run: Callable[[], subprocess.CompletedProcess[str]]) -> subprocess.CompletedProcess:
    started = time.monotonic()
    result = run()
    assert time.monotonic() - started < QUICK_S, "it hung on a planted file"
    return result


@pytest.mark.parametrize(
    "planted", ["lock", "ledger", "ledger-symlink", "good-copy", "ledger-mode-0600"]
)
def test_a_planted_file_is_a_clear_error_at_once_for_users_and_replaced_by_root(
    planted: str, users: dict[str, UnixUser], as_user: UserCommandLine, shared: Path
) -> None:
    run = _gpualloc(as_user, shared)
    alice, bob = users["alice"], users["bob"]
    assert run(alice, "alloc", "--gpus", "0", "--hold").returncode == 0
    ledger = shared / f"{STEM}.json"
    if planted == "lock":
        _plant_fifo(shared / f"{STEM}.lock", bob)
    elif planted == "ledger":
        _plant_fifo(ledger, bob)
    elif planted == "ledger-symlink":
        ledger.unlink()
        ledger.symlink_to("/etc/shadow")
        os.chown(ledger, bob.uid, bob.gid, follow_symlinks=False)
    elif planted == "good-copy":  # a FIFO as alice's copy, and the ledger damaged
        _plant_fifo(shared / f"{STEM}.{alice.uid}.good.json", bob)
        ledger.write_text("{")
    else:
        os.chown(ledger, bob.uid, bob.gid)
        ledger.chmod(0o600)
    result = _quick(lambda: run(alice, "alloc", "-n", "1", "--hold"))
    assert result.returncode == 11, result.stderr
    assert result.stderr.count("\n") <= 3 and "Traceback" not in result.stderr
    assert "gpualloc-t-bob" in result.stderr or "no good copy" in result.stderr
    status = _quick(lambda: run(alice, "status"))  # refused as clearly, never shown wrong
    assert status.returncode == 11, status.stderr
    if planted == "good-copy":
        return  # nothing trustworthy is left to recover from: root must look (exit 11 says so)
    by_root = _quick(lambda: run(ensure_root(), "alloc", "-n", "1", "--hold"))
    assert by_root.returncode == 0, by_root.stderr
    assert run(alice, "alloc", "-n", "1", "--hold").returncode == 0  # root repaired it
    assert Path("/etc/shadow").stat().st_uid == 0


def ensure_root() -> UnixUser:
    return UnixUser("root", 0, 0)


def test_a_fifo_planted_as_the_hooks_log_does_not_hang_the_prolog(
    users: dict[str, UnixUser], as_user: UserCommandLine, shared: Path
) -> None:
    run = _gpualloc(as_user, shared)
    _plant_fifo(shared / "slurm-hooks.log", users["bob"])
    job = {"SLURM_JOB_ID": "41", "SLURM_JOB_GPUS": "1", "SLURM_JOB_UID": str(users["carol"].uid)}
    result = _quick(lambda: run(ensure_root(), "slurm", "prolog", **job))
    assert result.returncode == 0 and "recorded GPU 1" in result.stderr
    log = shared / "slurm-hooks.log"
    assert log.is_file() and log.stat().st_uid == 0 and "recorded GPU 1" in log.read_text()
    assert _holders(_status(run, users["alice"])) == {users["carol"].name: [1]}


def test_a_user_holding_the_lock_is_named_and_root_hooks_still_record_the_job(
    users: dict[str, UnixUser], as_user: UserCommandLine, shared: Path
) -> None:
    run = _gpualloc(as_user, shared)
    alice, bob, carol = users["alice"], users["bob"], users["carol"]
    assert run(alice, "status").returncode == 0
    assert run(alice, "alloc", "--gpus", "0", "--hold").returncode == 0
    lock = shared / f"{STEM}.lock"
    holder = subprocess.Popen(
        ["flock", str(lock), "sleep", "120"],
        user=bob.uid, group=bob.gid, extra_groups=[], start_new_session=True,
    )  # fmt: skip
    try:
        from gpualloc.ledger.liveness import lock_held

        _until(lambda: lock_held(lock), "bob to hold the lock")
        status = _quick(lambda: run(alice, "status"))
        assert status.returncode == 0 and "gpualloc-t-bob" in status.stderr
        started = time.monotonic()
        blocked = run(alice, "alloc", "-n", "1", "--hold", GPUALLOC_LOCK_TIMEOUT="1")
        assert time.monotonic() - started < QUICK_S
        assert blocked.returncode == 16, blocked.stderr
        assert "gpualloc-t-bob" in blocked.stderr and "flock" in blocked.stderr

        job = {"SLURM_JOB_ID": "77", "SLURM_JOB_GPUS": "2,3", "SLURM_JOB_UID": str(carol.uid)}
        prolog = run(ensure_root(), "slurm", "prolog", **job)
        assert prolog.returncode == 0 and "root's journal" in prolog.stderr, prolog.stderr
        journal = shared / f"{STEM}.root-journal.json"
        assert journal.stat().st_uid == 0 and journal.stat().st_mode & 0o777 == 0o644
        # Seen at once, by everyone, though nobody could write the ledger yet.
        assert _holders(_status(run, alice)) == {alice.name: [0], carol.name: [2, 3]}
    finally:
        end(holder, group=True)  # flock and the sleep that inherited the lock
    placed = run(alice, "alloc", "-n", "1", "--hold", "--format", "json")
    assert json.loads(placed.stdout)["placement"]["gpus"] == [1], placed.stderr
    epilog = run(ensure_root(), "slurm", "epilog", SLURM_JOB_ID="77")
    assert epilog.returncode == 0 and "released GPU 2-3" in epilog.stderr
    assert not journal.exists()  # root folded it into the ledger
    assert _holders(_status(run, bob)) == {alice.name: [0, 1]}


def _system_config(directory: Path, text: str) -> None:
    path = directory / "config.toml"
    path.write_text(text)
    path.chmod(0o644)


def test_the_queue_bounds_are_the_administrators_not_the_users(
    users: dict[str, UnixUser], as_user: UserCommandLine, shared: Path, system_config_dir: Path
) -> None:
    """A denial of service: one user's '--wait -n 4 --max-bypass 0 --priority high'
    must not make everybody else's 1-GPU job exit 10 while GPUs are free."""
    run = _gpualloc(as_user, shared)
    alice, bob, carol = users["alice"], users["bob"], users["carol"]
    _system_config(system_config_dir, "")
    assert run(bob, "alloc", "--gpus", "0", "--hold").returncode == 0
    greedy = ("alloc", "--wait", "--timeout", "60", "-n", "4", "--hold")
    for extra in (("--max-bypass", "0"), ("--priority", "high")):
        refused = run(alice, *greedy, *extra)
        assert refused.returncode == 12, refused.stderr
        assert "queue.privileged" in refused.stderr
    variable = run(alice, *greedy, GPUALLOC_MAX_BYPASS="0")
    assert variable.returncode == 12 and "GPUALLOC_MAX_BYPASS" in variable.stderr

    env = {"GPUALLOC_STATE_DIR": str(shared)}
    waiter = as_user.popen(alice, "-t", TOPOLOGY, *greedy, env=env)
    try:
        _until(lambda: len(_status(run, carol)["queue"]) == 1, "alice's job to wait")
        backfill = run(carol, "alloc", "-n", "1", "--hold")  # passes the blocked 4-GPU job
        assert backfill.returncode == 0, backfill.stderr
    finally:
        end(waiter, term_s=30)  # SIGTERM: it leaves the queue

    _system_config(
        system_config_dir, '[queue]\nprivileged = ["@nobody-here", "gpualloc-t-alice"]\n'
        "max_waiting = 1\n",
    )  # fmt: skip
    waiters = [as_user.popen(alice, "-t", TOPOLOGY, *greedy, "--max-bypass", "0", env=env)]
    try:
        _until(lambda: len(_status(run, carol)["queue"]) == 1, "privileged alice to wait")
        second = run(carol, "alloc", "--wait", "--timeout", "1", "-n", "4", "--hold")
        assert second.returncode == 124  # carol may wait (one job) ...
        waiters.append(as_user.popen(carol, "-t", TOPOLOGY, *greedy, env=env))
        _until(lambda: len(_status(run, bob)["queue"]) == 2, "carol's job to wait")
        third = run(carol, *greedy)  # ... but not two at once
        assert third.returncode == 12 and "queue.max_waiting" in third.stderr
    finally:
        end_all(waiters, term_s=30)  # SIGTERM: each leaves the queue
    _system_config(system_config_dir, "")
    own = system_config_dir / "bob" / "gpualloc"
    own.mkdir(parents=True)
    (own / "config.toml").write_text('[queue]\nprivileged = ["gpualloc-t-bob"]\n')
    lifted = as_user(bob, "config", "show", env={"XDG_CONFIG_HOME": str(own.parent)})
    assert lifted.returncode == 15 and "only in the system configuration" in lifted.stderr


def test_a_forged_good_copy_never_wins_silently(
    users: dict[str, UnixUser], as_user: UserCommandLine, shared: Path
) -> None:
    run = _gpualloc(as_user, shared)
    alice, bob = users["alice"], users["bob"]
    assert run(alice, "alloc", "--gpus", "0", "--hold").returncode == 0
    assert run(alice, "alloc", "--gpus", "1", "--hold").returncode == 0
    ledger = shared / f"{STEM}.json"
    written = json.loads(ledger.read_text())
    assert list(written)[:2] == ["writer_uid", "generation"]  # survives a torn write
    forged = {**written, "generation": 999, "writer_uid": bob.uid, "leases": []}
    forged["generation_end"] = 999  # a forger writes a whole ledger (its trailer last)
    copy = shared / f"{STEM}.{bob.uid}.good.json"
    copy.write_text(json.dumps(forged))
    os.chown(copy, bob.uid, bob.gid)

    # A torn write of alice's: its first bytes name her copy, which wins over the forgery.
    text = ledger.read_text()
    ledger.write_text(text[: len(text) // 2])
    status = run(alice, "status", "--json")
    assert status.returncode == 0 and "forged" not in status.stderr  # the quiet recovery note
    assert _holders(json.loads(status.stdout)) == {alice.name: [0, 1]}
    assert run(alice, "alloc", "--gpus", "2", "--hold").returncode == 0

    # A copy under alice's name that bob owns is never read.
    impostor = shared / f"{STEM}.{alice.uid}.good.json"
    impostor.unlink()
    impostor.write_text(
        json.dumps({**forged, "writer_uid": alice.uid, "generation": 5000, "generation_end": 5000})
    )
    os.chown(impostor, bob.uid, bob.gid)
    ledger.write_text("{")  # nothing names a copy now: the newest trusted one, loudly
    status = run(alice, "status", "--json")
    assert status.returncode == 0
    assert "gpualloc: warning: " in status.stderr and "gpualloc-t-bob" in status.stderr
    assert "forged" in status.stderr and "WARNING" not in status.stderr  # not 'warning: WARNING:'


# ---- verified launch and idle holders, between users ---------------------------------------------


def _host_file(shared: Path, **declared: list) -> Path:
    """The bundled topology as a file in the shared directory, with ``declared`` processes or
    utilisation: every user reads it, the test rewrites it as NVML's lists would change."""
    from gpualloc.topologies import load_bundled

    path = shared / "host.json"
    draft = shared / "host.json.new"  # replaced whole, as the verifier may be reading it
    draft.write_text(json.dumps({**json.loads(load_bundled(TOPOLOGY).to_json()), **declared}))
    draft.chmod(0o644)
    draft.replace(path)
    return path


def test_a_job_off_its_gpus_is_seen_by_other_users_and_its_own_verifier(
    users: dict[str, UnixUser], as_user: UserCommandLine, shared: Path
) -> None:
    """alice's job also opens GPU 3; bob runs a process on alice's GPU 0. bob's status reads
    alice's process tree through /proc, and alice's verifier (hers, not root's) tells her job."""
    alice, bob = users["alice"], users["bob"]
    host = _host_file(shared)
    env = {"GPUALLOC_STATE_DIR": str(shared), "GPUALLOC_VERIFY_GRACE": "60"}
    job = as_user.popen(
        alice, "-t", str(host), "run", "--gpus", "0,1", "--", "sh", "-c", "echo $$; exec sleep 60",
        env=env,
    )  # fmt: skip
    stranger = subprocess.Popen(["sleep", "60"], user=bob.uid, group=bob.gid, extra_groups=[])
    try:
        assert job.stdout is not None
        pid = int(job.stdout.readline())
        _host_file(
            shared,
            processes=[
                {"gpu": 0, "pid": pid, "name": "sleep", "user": alice.name},
                {"gpu": 3, "pid": pid, "name": "sleep", "user": alice.name},
                {"gpu": 0, "pid": stranger.pid, "name": "sleep", "user": bob.name},
            ],
        )
        said = stderr_until(job, "verify.action")
        assert f"pid {pid} (sleep, {alice.name}) runs on GPU 3, which the lease does not" in said
        run = _gpualloc(as_user, shared, str(host))
        status = _status(run, bob)
        (lease,) = status["leases"]
        assert lease["user"] == alice.name and [p["gpu"] for p in lease["misplaced"]] == [3]
        assert [p["pid"] for p in status["gpus"][0]["intruders"]] == [stranger.pid]
        checked = run(alice, "doctor")
        assert checked.returncode == 17 and "2 problems found" in checked.stdout
    finally:
        end_all([stranger, job])


def test_an_idle_hold_is_noticed_and_released_by_another_users_gc(
    users: dict[str, UnixUser], as_user: UserCommandLine, shared: Path, system_config_dir: Path
) -> None:
    from msgspec.structs import replace

    from gpualloc.discovery.recorded import load_topology_file
    from gpualloc.host.local import LocalHost
    from gpualloc.ledger.schema import LeaseActivity

    alice, bob = users["alice"], users["bob"]
    host = _host_file(shared, utilization=[{"gpu": g, "percent": 0} for g in range(4)])
    told = shared / "told"
    _system_config(
        system_config_dir,
        '[idle]\nexpire_holds = "4h"\nnotice = "30m"\n'
        f'notify = "echo $GPUALLOC_EVENT $GPUALLOC_USER $(id -un) >> {told}"\n',
    )
    run = _gpualloc(as_user, shared, str(host))

    def backdate(**activity: datetime) -> None:
        """As looks by gc over the past hours would have recorded (root writes the ledger)."""
        ledger = LocalHost.open(load_topology_file(host), state_dir=shared)
        with ledger.transaction() as txn:
            (lease,) = txn.ledger.leases
            txn.replace(replace(lease, activity=LeaseActivity(**activity)))

    try:
        mine = _lease_id(run(alice, "alloc", "--gpus", "0,1", "--hold", "--format", "json"))
        now = datetime.now(timezone.utc)
        backdate(observed_at=now, idle_since=now - timedelta(hours=3, minutes=50))
        noticed = run(bob, "gc")
        assert noticed.returncode == 0, noticed.stderr
        assert f"notice: GPU 0-1 held by {alice.name}" in noticed.stdout
        assert f"NOTICE: lease {mine} ({alice.name})" in run(alice, "status").stdout
        backdate(observed_at=now, idle_since=now - timedelta(hours=5), expires_at=now)
        released = run(bob, "gc", "--json")
        assert json.loads(released.stdout)["idle"][0]["event"] == "expired"
        assert _status(run, alice)["leases"] == []
        assert told.read_text().splitlines() == [
            f"notice {alice.name} {bob.name}",
            f"expired {alice.name} {bob.name}",
        ]
    finally:
        _system_config(system_config_dir, "")


def test_run_skips_a_path_directory_the_user_cannot_search(
    users: dict[str, UnixUser], as_user: UserCommandLine, shared: Path
) -> None:
    """'run' as a user whose PATH starts with a directory that user cannot
    read (root's PATH kept by runuser) died with a PermissionError traceback; a shell skips it."""
    private = shared / "root-only"
    private.mkdir(mode=0o700)  # root's, in a world-searchable directory
    run = _gpualloc(as_user, shared)
    result = run(users["alice"], "run", "--", "true", PATH=f"{private}:/usr/bin:/bin")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
