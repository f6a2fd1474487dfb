"""``alloc`` and ``release`` alike on both ledgers, the embedded file and a broker's: ``release
--mine`` keeps a running job's lease unless asked, a lease is named by its id or its name, an
``alloc`` whose holder is a subshell or has ended gets no lease, and a refused ``release``
writes nothing; and a user may release only their own leases.

Real processes, each test with its own state directory (conftest's autouse fixture); the broker
runs as root (tests/broker_harness.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpualloc.topologies import load_bundled
from tests import house_rules
from tests.broker_harness import RunningBroker, running_broker
from tests.cli_harness import TIMEOUT_S, gpualloc, gpualloc_argv, shlex_join
from tests.job_scripts import REPORT
from tests.unix_users import as_user, two_test_users


@pytest.fixture
def job(tmp_path: Path) -> Path:
    path = tmp_path / "job.py"
    path.write_text(REPORT)
    return path


# ---- leases, on both ledgers -------------------------------------------------------------------


class Ledger:
    """One of the two ledgers ``release`` must treat alike: the embedded file (``dgx1-v100``
    in the test's state directory) or a broker's (``gpualloc serve`` of ``dgx1-v100``)."""

    def __init__(self, broker: RunningBroker | None) -> None:
        self.broker = broker

    def argv(self, *args: str) -> list[str]:
        if self.broker is None:
            return gpualloc_argv(*args)
        return [sys.executable, "-m", "gpualloc", *args]

    def env(self, **extra: str) -> dict[str, str]:
        env = {**os.environ, **extra}
        if self.broker is not None:
            env["GPUALLOC_BROKER"] = str(self.broker.socket)
        return env

    def __call__(self, *args: str, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.argv(*args), capture_output=True, text=True, timeout=TIMEOUT_S, env=self.env(**env)
        )

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.argv(*args), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env=self.env(),
        )  # fmt: skip

    def lease(self, *args: str) -> str:
        """The id of a new lease ``alloc ARGS`` made."""
        made = self("alloc", *args, "--format", "json")
        assert made.returncode == 0, made.stderr
        return json.loads(made.stdout)["lease"]["id"]

    def leases(self) -> list[str]:
        listed = self("status", "--json")
        assert listed.returncode == 0, listed.stderr
        return sorted(lease["id"] for lease in json.loads(listed.stdout)["leases"])

    def file(self) -> Path:
        directory = Path(os.environ["GPUALLOC_STATE_DIR"]) if self.broker is None else None
        (found,) = [
            path
            for path in (directory or self.broker.state).glob("ledger*.json")  # type: ignore[union-attr]
            if ".good." not in path.name
        ]
        return found


@pytest.fixture(params=["embedded", "broker"])
def ledger(request: pytest.FixtureRequest) -> Iterator[Ledger]:
    if request.param == "embedded":
        yield Ledger(None)
        return
    for broker in running_broker("dgx1-v100"):  # skips where it cannot run as root
        yield Ledger(broker)


def _running(ledger: Ledger, job: Path) -> tuple[subprocess.Popen[str], str]:
    """A ``run`` job that waits for its stdin to close, and its lease's id."""
    running = ledger.popen("run", "-n", "2", "--", sys.executable, str(job), "--wait")
    assert running.stdout is not None
    started = json.loads(running.stdout.readline())
    return running, started["env"]["GPUALLOC_LEASE_ID"]


def test_release_mine_keeps_a_running_jobs_lease_unless_asked_and_says_so(
    ledger: Ledger, job: Path
) -> None:
    """``release --mine`` (the README's partner of ``alloc --hold``) released a running
    ``run`` job's lease too, silently: its GPUs went to the next job while it still ran."""
    running, job_lease = _running(ledger, job)
    holder = subprocess.Popen(["sleep", "600"])
    try:
        held = ledger.lease("-n", "1", "--hold", "--name", "notebook")
        tied = ledger.lease("-n", "1", "--pid", str(holder.pid))
        mine = ledger("release", "--mine", "--json")
        assert mine.returncode == 0, mine.stderr
        data = json.loads(mine.stdout)
        assert sorted(x["id"] for x in data["released"]) == sorted([held, tied])
        assert [x["id"] for x in data["kept"]] == [job_lease] and data["errors"] == []
        assert "kept GPU" in mine.stderr and job_lease in mine.stderr
        assert "its job still runs" in mine.stderr and "--include-running" in mine.stderr
        again = ledger("release", "--mine")
        assert (again.returncode, again.stdout) == (0, "") and job_lease in again.stderr
        assert ledger.leases() == [job_lease]
        assert ledger("release", "--include-running").returncode == 2  # needs --mine
        everything = ledger("release", "--mine", "--include-running", "--json")
        assert [x["id"] for x in json.loads(everything.stdout)["released"]] == [job_lease]
        assert json.loads(everything.stdout)["kept"] == [] and ledger.leases() == []
        assert running.poll() is None  # released, not ended
    finally:
        holder.kill()
        holder.wait()
        running.communicate(timeout=TIMEOUT_S)


def _offered(ledger: Ledger) -> list[str]:
    """What a Tab after ``gpualloc release`` offers (the words the completion scripts take)."""
    asked = ledger("status", _GPUALLOC_COMPLETE_LEASES="1")  # the scripts' question
    return [line.split("\t")[0] for line in asked.stdout.splitlines()]


def test_release_takes_a_leases_name_and_refuses_one_that_names_several(ledger: Ledger) -> None:
    named = ledger.lease("--hold", "--name", "nb")
    assert _offered(ledger) == [named, "nb"]
    released = ledger("release", "nb", "--json")
    assert released.returncode == 0, released.stderr
    assert [x["id"] for x in json.loads(released.stdout)["released"]] == [named]
    twins = sorted(ledger.lease("--hold", "--name", "twin") for _ in range(2))
    assert _offered(ledger) == twins  # not the name: it names two
    refused = ledger("release", "twin")
    house_rules.refused(refused, 13)
    assert "'twin' names 2 leases" in refused.stderr and all(x in refused.stderr for x in twins)
    assert ledger.leases() == twins


def test_alloc_in_a_subshell_its_shell_reads_is_refused_with_the_fix(ledger: Ledger) -> None:
    """``X=$(gpualloc alloc -n 2 ...)`` printed the GPUs and exited 0, and the lease ended with
    the subshell at once: where bash forks one (a redirection or ``||`` inside the ``$(...)``),
    gpualloc's parent is that subshell. Refused now, nothing allocated; ``--pid $$`` holds,
    and so does the README's ``eval "$(...)"``, whose parent is the shell itself."""

    def bash(script: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", "-c", script], capture_output=True, text=True, timeout=60, env=ledger.env()
        )

    alloc = shlex_join(ledger.argv("alloc", "-n", "2"))
    for form in (f"$({alloc} || exit 3)", f"$({alloc} 2>/dev/null; true)", f"$({alloc} | cat)"):
        shell = bash(f'X={form}; echo "rc=$? X=$X"')
        assert shell.stdout.strip().endswith(" X="), (form, shell.stdout)  # no GPU printed
        assert ledger.leases() == [], form
    refused = bash(f"X=$({alloc} || exit 3)")
    house_rules.refused(refused, 3)
    assert "subshell" in refused.stderr and "--pid $$" in refused.stderr, refused.stderr
    both = bash(
        f"X=$({shlex_join(ledger.argv('alloc', '-n', '1', '--pid', '$$'))} || exit 3); "
        f'eval "$({alloc} --format env)"; {shlex_join(ledger.argv("status", "--json"))}'
    )
    assert both.returncode == 0, both.stderr
    assert len(json.loads(both.stdout)["leases"]) == 2  # both live while the shell does
    deadline = time.monotonic() + TIMEOUT_S
    while ledger.leases():  # and end with it (the broker reaps as it notices)
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_an_alloc_whose_pid_ends_while_it_waits_gets_no_lease(ledger: Ledger) -> None:
    """Through the broker, ``alloc --pid P --wait`` whose P ended in the queue was given a
    lease of a dead process when its turn came, printed it and exited 0; the lease was gone
    at once. Refused now, as the embedded ledger refuses it: nothing is left."""
    everything = ledger.lease("-n", "8", "--hold")
    holder = subprocess.Popen(["sleep", "600"])
    waiting = subprocess.Popen(
        ledger.argv("alloc", "-n", "1", "--pid", str(holder.pid), "--wait"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ledger.env(),
    )  # fmt: skip
    try:
        assert waiting.stderr is not None and "waiting" in waiting.stderr.readline()
        holder.kill()
        holder.wait()
        assert ledger("release", everything).returncode == 0
        out, err = waiting.communicate(timeout=TIMEOUT_S)
    finally:
        holder.kill()
        waiting.kill()
        waiting.wait()
    assert waiting.returncode == 2 and out == "", (waiting.returncode, out, err)
    assert f"no process with pid {holder.pid}" in err and "--hold" in err, err
    assert ledger.leases() == []


def test_a_refused_release_leaves_the_ledger_file_as_it_was(ledger: Ledger) -> None:
    """A refused ``release`` wrote the ledger anyway, with the dead leases it reaped."""
    ledger.lease("--hold", "--name", "kept")
    holder = subprocess.Popen(["sleep", "600"])
    ledger.lease("--pid", str(holder.pid))
    holder.kill()
    holder.wait()
    if ledger.broker is not None:  # the broker reaps a lease as soon as its process ends
        deadline = time.monotonic() + TIMEOUT_S
        while len(ledger.broker.ledger()["leases"]) > 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    before, content = ledger.file().stat(), ledger.file().read_bytes()
    for selector in ("zzzz", "no-such-name", "abc"):
        refused = ledger("release", selector)
        assert refused.returncode == 13, refused.stderr
    after = ledger.file().stat()
    assert (after.st_ino, after.st_mtime_ns, after.st_size) == (
        before.st_ino, before.st_mtime_ns, before.st_size
    )  # fmt: skip
    assert ledger.file().read_bytes() == content


# ---- two users -------------------------------------------------------------------------------


def test_a_user_may_release_only_their_own_leases(cli) -> None:
    """Real Unix users (forked and setuid, running the CLI in-process: the interpreter and the
    package may sit in a directory only root can read, so everything is imported and the
    topology copied to the shared directory before the fork)."""
    (uid_a, gid_a), (uid_b, gid_b) = two_test_users()
    shared = Path(tempfile.mkdtemp(prefix="gpualloc-shared-", dir="/tmp"))
    shared.chmod(0o1777)
    try:
        topology = shared / "dgx1-v100.json"
        topology.write_text(load_bundled("dgx1-v100").to_json())
        topology.chmod(0o644)
        for warm_up in (("alloc", "--hold"), ("release", "--mine")):  # imports, as root
            assert cli("--topology", str(topology), *warm_up).exit_code == 0
        env = {**os.environ, "GPUALLOC_STATE_DIR": str(shared)}

        def as_a() -> None:
            code = _cli_exit_code("alloc", "--hold", "--name", "a-job", state=shared)
            assert code == 0

        as_user(uid_a, gid_a, as_a)
        (lease,) = json.loads(gpualloc("status", "--json", env=env).stdout)["leases"]
        assert lease["uid"] == uid_a and lease["user"] == "gpualloc-test-a"

        def as_b() -> None:
            from gpualloc.cli.complete import lease_ids

            os.environ["GPUALLOC_STATE_DIR"] = str(shared)
            assert lease_ids("") == []  # Tab offers a user only what they may release
            assert _cli_exit_code("release", lease["id"], state=shared) == 12  # not permitted
            assert _cli_exit_code("release", "a-job", state=shared) == 12  # by its name too
            assert _cli_exit_code("release", "--mine", state=shared) == 0  # B holds nothing

        as_user(uid_b, gid_b, as_b)
        assert len(json.loads(gpualloc("status", "--json", env=env).stdout)["leases"]) == 1
        assert gpualloc("release", lease["id"], env=env).returncode == 0  # root may
    finally:
        shutil.rmtree(shared, ignore_errors=True)  # a job's lock remover may unlink at once


def _cli_exit_code(*args: str, state: Path) -> int:
    """The exit code of ``gpualloc --topology STATE/dgx1-v100.json ARGS``, run in this (forked)
    process."""
    from gpualloc.cli.main import run

    os.environ["GPUALLOC_STATE_DIR"] = str(state)
    try:
        run(["--topology", str(state / "dgx1-v100.json"), *args])
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    raise AssertionError("run() returned instead of exiting")
