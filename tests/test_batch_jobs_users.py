"""Submitted jobs of real Unix users, through a real broker (``gpualloc serve`` as root) and on
the file ledger of a shared 1777 state directory: a job's record and log are its user's alone
(another user can neither read its log nor cancel it; root cancels it through the host's
ledger), and, through the broker, many users' submissions each run exactly once, with no GPU
held by two jobs at once and every GPU free at the end (gpualloc/batch,
gpualloc/cli/batch_jobs.py, gpualloc/cli/supervisor.py).

Users are made with useradd and removed after (tests/unix_users.py); each has a state home of
its own (``XDG_STATE_HOME``: the users' ``HOME`` is /nonexistent). Every supervisor and job
group a test leaves behind is killed, by pid, when it ends (tests/child_processes.py).
Skipped, with the reason, where the tests do not run as root.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from gpualloc.batch.record import FINAL_STATES, LOG_FILE, RECORD_FILE
from gpualloc.errors import ExitCode
from tests.broker_harness import RunningBroker
from tests.house_rules import refused
from tests.unix_users import UnixUser, UserCommandLine, ensure_user, shared_directory

TOPOLOGY = "nvlink-pairs-4gpu"
GPUS = 4
NAMES = ("alice", "bob", "carol")
ROOT_USER = UnixUser("root", 0, 0)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def users() -> dict[str, UnixUser]:
    return {name: ensure_user(f"gpualloc-t-{name}") for name in NAMES}


@pytest.fixture(scope="module")
def as_user(users: dict[str, UnixUser]) -> UserCommandLine:
    return UserCommandLine(users["alice"])


def _until(condition: Callable[[], bool], what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


class Site:
    """A host, and the users who submit to it, each with a state home of their own: through a
    broker (``broker``), or on the file ledger in a 1777 state directory (``shared``)."""

    def __init__(
        self, as_user: UserCommandLine, users: dict[str, UnixUser], mode: str = "broker"
    ) -> None:
        self.as_user = as_user
        self.homes: dict[str, Path] = {}
        self.broker: RunningBroker | None = None
        if mode == "broker":
            self.broker = RunningBroker(TOPOLOGY).start()
            self.state = self.broker.state
            self.host_env = {"GPUALLOC_BROKER": str(self.broker.socket)}
        else:
            self.state = shared_directory("gpualloc-shared-")
            self.host_env = {"GPUALLOC_STATE_DIR": str(self.state), "GPUALLOC_TOPOLOGY": TOPOLOGY}
        for user in users.values():
            home = Path(tempfile.mkdtemp(prefix="gpualloc-state-home-", dir="/tmp"))
            os.chown(home, user.uid, user.gid)
            home.chmod(0o700)
            self.homes[user.name] = home

    def env(self, user: UnixUser) -> dict[str, str]:
        env = dict(self.host_env)
        if user.name in self.homes:
            env["XDG_STATE_HOME"] = str(self.homes[user.name])
        return env

    def __call__(
        self, user: UnixUser, *args: str, timeout_s: float = 120, **env: str
    ) -> subprocess.CompletedProcess[str]:
        return self.as_user(user, *args, env={**self.env(user), **env}, timeout_s=timeout_s)

    def root(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``gpualloc ARGS`` as root, a client of the broker, with no job records of its own
        (its state home is under the absent ``HOME``)."""
        return self(ROOT_USER, *args)

    def show(self, user: UnixUser, job_id: str) -> dict[str, Any]:
        done = self(user, "show", "--json", job_id)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def until_state(
        self, user: UnixUser, job_id: str, states: set[str] | frozenset[str], timeout_s: float = 60
    ) -> dict[str, Any]:
        seen: list[dict[str, Any]] = []

        def reached() -> bool:
            seen.append(self.show(user, job_id))
            return seen[-1]["state"] in states

        _until(reached, f"job {job_id} to be {sorted(states)} (last: {seen[-1:]})", timeout_s)
        return seen[-1]

    def status(self) -> dict[str, Any]:
        done = self.root("status", "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def history(self) -> list[dict[str, Any]]:
        """The broker's history of ended leases (gpualloc/ledger/history.py)."""
        records = []
        for path in self.state.glob("*.history.jsonl"):
            records += [json.loads(line) for line in path.read_text().splitlines() if line]
        return records

    def records(self, name: str) -> list[dict[str, Any]]:
        """The job records in the state home of the user ``name``, read as root from the
        files themselves."""
        jobs = self.homes[name] / "gpualloc" / "jobs"
        found = []
        for path in jobs.glob(f"*/{RECORD_FILE}"):
            with contextlib.suppress(OSError, ValueError):  # a record being replaced
                found.append(json.loads(path.read_text()))
        return found

    def close(self) -> None:
        """Kill what the users' jobs left running (supervisors by the argv that names their
        job's directory, job groups by the records), stop the broker, remove the homes."""
        import psutil

        try:
            for _ in range(2):  # a supervisor may have started a job meanwhile
                homes = [str(home) for home in self.homes.values()]
                for process in psutil.process_iter(["cmdline"]):
                    argv = process.info["cmdline"] or []
                    if "gpualloc.cli.supervisor" in argv and any(
                        arg.startswith(home) for arg in argv for home in homes
                    ):
                        with contextlib.suppress(psutil.Error):
                            process.kill()
                for name in self.homes:
                    for record in self.records(name):
                        if record.get("job_pgid") and record.get("state") not in FINAL_STATES:
                            with contextlib.suppress(OSError):
                                os.killpg(record["job_pgid"], signal.SIGKILL)
        finally:
            if self.broker is not None:
                self.broker.stop()
                shutil.rmtree(self.broker.directory, ignore_errors=True)
            else:
                shutil.rmtree(self.state, ignore_errors=True)
            for home in self.homes.values():
                shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def site(as_user: UserCommandLine, users: dict[str, UnixUser]) -> Iterator[Site]:
    made = Site(as_user, users)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture(params=["broker", "shared"])
def either_site(
    request: pytest.FixtureRequest, as_user: UserCommandLine, users: dict[str, UnixUser]
) -> Iterator[Site]:
    """Both ledgers: what a job's record keeps its user's holds on the file ledger too."""
    made = Site(as_user, users, request.param)
    try:
        yield made
    finally:
        made.close()


READ_LOG = """
import sys
try:
    print(open(sys.argv[1]).read())
except OSError as exc:
    print("refused", exc.errno)
"""


def test_another_user_can_neither_read_a_jobs_log_nor_cancel_it(
    either_site: Site, users: dict[str, UnixUser]
) -> None:
    site = either_site
    alice, bob = users["alice"], users["bob"]
    secret = f"s3cret-{os.urandom(8).hex()}"
    submitted = site(alice, "submit", "--parsable", "--", "sh", "-c", f"echo {secret}; sleep 60")
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    site.until_state(alice, job_id, {"running"})
    _until(lambda: secret in site(alice, "log", job_id).stdout, "the secret in alice's log", 30)
    directory = site.homes[alice.name] / "gpualloc" / "jobs" / job_id
    # The record's own modes keep the log alice's, whatever her state home's mode
    # (gpualloc/batch/record.py): open it to everyone and bob must still be kept out.
    site.homes[alice.name].chmod(0o755)
    (site.homes[alice.name] / "gpualloc").chmod(0o755)
    modes = [path.stat().st_mode & 0o777 for path in (directory.parent, directory)]
    assert modes == [0o700, 0o700], [oct(mode) for mode in modes]

    own = site(bob, "log", job_id)
    assert own.returncode == ExitCode.NO_LEASE, own.stderr
    assert secret not in own.stdout + own.stderr
    hers = site(bob, "log", job_id, XDG_STATE_HOME=str(site.homes[alice.name]))
    assert hers.returncode != 0, hers.stdout
    refused(hers)
    assert secret not in hers.stdout + hers.stderr
    opened = site.as_user._run(
        bob, [site.as_user.python, "-c", READ_LOG, str(directory / LOG_FILE)], {}
    )
    assert opened.returncode == 0 and opened.stdout.startswith("refused"), opened.stdout

    mine = site(bob, "jobs", "--json")
    assert mine.returncode == 0 and json.loads(mine.stdout) == [], mine.stderr
    every = site(bob, "jobs", "--all", "--json")  # squeue: every user's, from the host's ledger
    assert every.returncode == 0, every.stderr
    (seen,) = [view for view in json.loads(every.stdout) if view["id"] == job_id]
    assert (seen["user"], seen["state"]) == (alice.name, "running")
    assert "command" not in seen and secret not in every.stdout

    cancelled = site(bob, "cancel", job_id)
    refused(cancelled, ExitCode.NOT_PERMITTED)
    assert alice.name in cancelled.stderr, cancelled.stderr
    time.sleep(1)  # a SIGTERM that got through would have ended the job by now (no poll can
    # wait for what must not happen)
    assert site.show(alice, job_id)["state"] == "running"
    (lease,) = site.status()["leases"]
    assert (lease["id"], lease["user"]) == (job_id, alice.name)

    by_root = site.root("cancel", job_id)
    assert by_root.returncode == 0, by_root.stderr
    assert site.until_state(alice, job_id, FINAL_STATES, 60)["state"] == "cancelled"
    _until(lambda: site.status()["leases"] == [], "the job's lease to end", 30)
    assert site.status()["queue"] == []
    _until(lambda: site.history() != [], "the lease's history record", 30)
    (ended,) = site.history()
    assert (ended["lease"], ended["user"], ended["source"]) == (job_id, alice.name, "submit")


def _submit_all(site: Site, user: UnixUser, plan: list[tuple[int, int]]) -> dict[str, int]:
    """``user``'s submissions of the plan's (tasks, GPUs): an ``--array`` where tasks > 1, a
    plain submit else; each job's id and the GPUs it asked for."""
    asked: dict[str, int] = {}
    for tasks, gpus in plan:
        job = ["sh", "-c", 'echo "start $GPUALLOC_JOB_ID $CUDA_VISIBLE_DEVICES"; sleep 0.3']
        array = ["--array", f"0-{tasks - 1}"] if tasks > 1 else []
        done = site(user, "submit", "--json", "-n", str(gpus), *array, "--", *job)
        assert done.returncode == 0, done.stderr
        jobs = json.loads(done.stdout)["jobs"]
        assert len(jobs) == tasks, jobs
        asked.update((each["id"], gpus) for each in jobs)
    return asked


def _plan(jobs: int) -> list[tuple[int, int]]:
    """``jobs`` jobs: two arrays of a third each (one GPU a task, then two), the rest plain
    submits of one or two GPUs in turn."""
    third = jobs // 3
    plain = jobs - 2 * third
    return [(third, 1), (third, 2), *((1, 1 + k % 2) for k in range(plain))]


def test_two_hundred_jobs_of_three_users_each_run_once_and_never_share_a_gpu(
    site: Site, users: dict[str, UnixUser]
) -> None:
    """Three users submit 200 short jobs at once (arrays and plain submits, one GPU or two)
    to one broker of 4 GPUs, so that most of them wait in the queue: every job the submits
    accepted completes (docs/jobs.md: it "waits in the host's queue and runs when its turn
    comes"), its log holds the one start line of one run, the broker's history holds one
    record of each, and neither the jobs' records nor the history have two of them on one
    GPU at once."""
    started = time.monotonic()
    shares = {"alice": 67, "bob": 67, "carol": 66}
    with ThreadPoolExecutor(len(shares)) as pool:
        futures = {
            name: pool.submit(_submit_all, site, users[name], _plan(count))
            for name, count in shares.items()
        }
        asked = {name: future.result() for name, future in futures.items()}
    submitted_s = time.monotonic() - started
    wanted = {  # each job's user and GPUs
        job_id: (users[name].name, gpus)
        for name, jobs in asked.items()
        for job_id, gpus in jobs.items()
    }
    assert len(wanted) == sum(shares.values()) == 200

    states: dict[str, str] = {}

    def all_final() -> bool:
        for name in shares:
            done = site(users[name], "jobs", "--json")
            assert done.returncode == 0, done.stderr
            states.update((view["id"], view["state"]) for view in json.loads(done.stdout))
        return all(states.get(job_id) in FINAL_STATES for job_id in wanted)

    _until(all_final, "every job to end", 300)
    finished_s = time.monotonic() - started
    assert set(states) == set(wanted)
    assert Counter(states.values()) == {"completed": 200}, _failures(site, users, states)

    ran: dict[str, list[int]] = {}  # each job's GPUs, as its CUDA_VISIBLE_DEVICES said
    jobs_held = []  # each job's GPUs over the times its record says it ran
    for name in shares:
        for record in site.records(users[name].name):
            log = Path(record["output"]).read_text()
            lines = [line for line in log.splitlines() if line.startswith("start ")]
            assert len(lines) == 1, (record["id"], log)
            _, job_id, devices = lines[0].split(" ")
            assert job_id == record["id"], log
            ran[job_id] = sorted(map(int, devices.split(",")))
            assert len(ran[job_id]) == wanted[job_id][1], log
            jobs_held.append(
                {"lease": job_id, "gpus": ran[job_id], "start": record["started"],
                 "end": record["ended"]}
            )  # fmt: skip
    assert set(ran) == set(wanted)
    # A record says started once its job holds the lease, ended once its last process has
    # gone: two jobs on one GPU over overlapping times ran on it at once.
    assert _double_bookings(jobs_held) == [], "two jobs ran on one GPU at once"

    _until(lambda: len(site.history()) >= len(wanted), "every lease's history record", 60)
    history = site.history()
    assert Counter(r["lease"] for r in history) == dict.fromkeys(wanted, 1), "ran twice or never"
    for record in history:
        assert (record["source"], record["user"]) == ("submit", wanted[record["lease"]][0])
        assert sorted(record["gpus"]) == ran[record["lease"]], record
    # The host's history says the same: no GPU held by two leases at once.
    assert _double_bookings(history) == [], "the history has two leases on one GPU at once"
    status = site.status()
    assert (status["leases"], status["queue"]) == ([], [])
    print(f"\n200 jobs: submitted in {submitted_s:.1f} s, all ended after {finished_s:.1f} s")


def _double_bookings(history: list[dict[str, Any]]) -> list[tuple[int, str, str, float]]:
    """(GPU, lease, lease, seconds) for every two records (``lease``, ``gpus``, ``start`` and
    ``end``) that held one GPU over overlapping times, and for how long."""
    found = []
    for gpu in range(GPUS):
        held = sorted(
            (_when(r["start"]), _when(r["end"]), r["lease"]) for r in history if gpu in r["gpus"]
        )
        last_end, last = None, None  # the record of the latest end so far
        for start, end, lease in held:
            if last_end is not None and start < last_end:
                found.append((gpu, last, lease, (last_end - start).total_seconds()))
            if last_end is None or end > last_end:
                last_end, last = end, lease
    return found


def _when(text: str) -> datetime:
    """A record's time: the history's ``+00:00`` or a job record's ``Z`` (which Python 3.10's
    ``fromisoformat`` does not read)."""
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _failures(site: Site, users: dict[str, UnixUser], states: dict[str, str]) -> str:
    """Why the jobs that did not complete ended so: how many for each of their records'
    reasons, and the end of one log."""
    reasons: Counter[str] = Counter()
    log = ""
    for user in users.values():
        for record in site.records(user.name):
            if states.get(record["id"]) != "completed":
                reasons[f"{record['state']}: {record['detail']}"] += 1
                with contextlib.suppress(OSError):
                    log = Path(record["output"]).read_text()[-600:]
    return "\n".join([*(f"{n} x {reason}" for reason, n in reasons.most_common()), log])
