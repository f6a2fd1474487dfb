"""``run``, ``alloc``, ``release``, ``status`` and ``gc`` end to end, in real subprocesses.

Every test has its own state directory (``GPUALLOC_STATE_DIR`` under tmp_path, set by the
autouse fixture in conftest) and works on a bundled topology. Tests synchronise on events the
jobs report (a line on stdout, an exit), never on sleeps.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from msgspec.structs import replace

from gpualloc.model import NumaNode
from gpualloc.model.cpuset import parse_cpulist
from gpualloc.topologies import load_bundled
from tests import house_rules
from tests.broker_harness import RunningBroker, running_broker
from tests.child_processes import end, end_all, running
from tests.cli_harness import TIMEOUT_S, gpualloc, gpualloc_argv, status
from tests.unix_users import as_user, two_test_users

JOB = """\
import json, os, sys
print(json.dumps({
    "pid": os.getpid(),
    "env": {k: v for k, v in os.environ.items() if k.startswith(("CUDA_", "GPUALLOC_"))},
    "affinity": sorted(os.sched_getaffinity(0)),
}), flush=True)
if "--wait" in sys.argv:
    sys.stdin.read()
"""


@pytest.fixture
def job(tmp_path: Path) -> Path:
    path = tmp_path / "job.py"
    path.write_text(JOB)
    return path


# ---- run ---------------------------------------------------------------------------------------


def test_run_execs_the_job_on_the_gpus_plan_chooses_and_frees_them_at_exit(job: Path) -> None:
    planned = json.loads(gpualloc("plan", "-n", "2", "--sensitive", "--json").stdout)["gpus"]
    with running(
        gpualloc_argv("run", "-n", "2", "--sensitive", "--", sys.executable, str(job), "--wait"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        seen = json.loads(process.stdout.readline())
        env = seen["env"]
        assert env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, planned))
        assert env["GPUALLOC_GPUS"] == env["CUDA_VISIBLE_DEVICES"]
        assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert re.fullmatch(r"[0-9a-f]{12}", env["GPUALLOC_LEASE_ID"])
        assert seen["pid"] == process.pid  # exec: the job *is* the gpualloc process

        now = status()
        (lease,) = now["leases"]
        assert lease["id"] == env["GPUALLOC_LEASE_ID"]
        assert [g["index"] for g in lease["gpus"]] == planned
        assert lease["pid"] == process.pid and lease["source"] == "run" and lease["lock"]
        assert lease["command"] == [sys.executable, str(job), "--wait"]
        assert lease["user"] and lease["scores"]["effective_gbps"] > 0
        assert [g["state"] for g in now["gpus"] if g["index"] in planned] == ["held", "held"]
        assert now["free"] == sorted(set(range(8)) - set(planned))

        process.stdin.close()
        assert process.wait(TIMEOUT_S) == 0
        assert f"lease {env['GPUALLOC_LEASE_ID']}: GPU" in process.stderr.read()
    assert status()["free"] == list(range(8))


def test_the_jobs_exit_status_and_signals_pass_straight_through() -> None:
    assert gpualloc("run", "--", sys.executable, "-c", "raise SystemExit(7)").returncode == 7
    killed = gpualloc("run", "-q", "--", "sh", "-c", "kill -TERM $$")
    assert killed.returncode == -signal.SIGTERM  # no wrapper process turned it into 143
    assert killed.stderr == ""


def test_the_job_does_not_inherit_pythons_ignored_sigpipe() -> None:
    """Python ignores SIGPIPE for itself and ignored signals survive exec: a job in
    'job | head' would never die of SIGPIPE unless gpualloc resets it."""
    shown = gpualloc("run", "--", "grep", "SigIgn", "/proc/self/status")
    ignored = int(shown.stdout.split()[1], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1))
    assert not ignored & (1 << (signal.SIGXFSZ - 1))


def test_an_unknown_or_unexecutable_command_exits_like_a_shell_and_leaves_no_lease(
    tmp_path: Path,
) -> None:
    missing = gpualloc("run", "--", "gpualloc-no-such-command")
    assert missing.returncode == 127
    assert "gpualloc-no-such-command: command not found" in missing.stderr
    plain = tmp_path / "data.txt"
    plain.write_text("not a program")
    assert gpualloc("run", "--", str(plain)).returncode == 126
    # Executable bit set, but not a format the kernel can run: exec itself fails, after the
    # lease was written; the lease must be given back.
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"\x00\x01\x02 not an executable")
    garbage.chmod(0o755)
    failed = gpualloc("run", "--", str(garbage))
    assert failed.returncode == 126, failed.stderr
    assert "Exec format error" in failed.stderr
    assert status()["leases"] == []


def test_an_empty_command_word_is_a_usage_error(cli) -> None:
    """``run -- ''`` was exit 127, "command not found", as if a program had that name."""
    for args in (["--", ""], ["--dry-run", "--", "", "x"], ["--wait", "--", ""]):
        result = cli("--topology", "dgx1-v100", "run", *args)
        assert result.exit_code == 2, result.stderr
        assert result.stderr.startswith("error: the command's program is an empty word")
    assert status()["leases"] == []


def test_dry_run_shows_everything_and_allocates_nothing(tmp_path: Path) -> None:
    text = gpualloc("run", "-n", "2", "--dry-run", "--", "python", "train.py")
    assert text.returncode == 0, text.stderr
    assert "would run on GPU 0,3" in text.stdout
    assert "CUDA_VISIBLE_DEVICES=0,3" in text.stdout
    assert "on its own host: numactl --cpunodebind=0 --membind=0 --" in text.stdout
    assert "argv: python train.py" in text.stdout  # a recorded topology binds nothing
    data = json.loads(gpualloc("run", "-n", "2", "--dry-run", "--json", "--", "true").stdout)
    assert data["placement"]["gpus"] == [0, 3]
    assert data["environment"]["GPUALLOC_LEASE_ID"] is None
    assert data["numa"]["method"] == "none" and data["argv"] == ["true"]
    assert gpualloc("run", "--dry-run", "--", "no-such-command").returncode == 127
    assert not (tmp_path / "state").exists()  # not even the state directory was created


def test_explicit_gpus_and_usage_errors() -> None:
    got = gpualloc("run", "--gpus", "6,2", "--", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES")
    assert got.stdout == "6,2\n"
    assert gpualloc("run", "-n", "3", "--gpus", "1,2", "--", "true").returncode == 2
    assert gpualloc("run", "--numa", "sideways", "--", "true").returncode == 2
    assert gpualloc("run", "-n", "9", "--", "true").returncode == 9  # never fits 8 GPUs


@pytest.mark.slow
def test_64_concurrent_runs_on_8_gpus_never_share_one() -> None:
    """The race every small GPU picker loses: 64 jobs start at once. Exactly 8 win, each on its
    own GPU; the 56 others get the busy code; nothing is lost from the ledger."""
    processes = [
        subprocess.Popen(
            gpualloc_argv("run", "-n", "1", "-q", "--", "sleep", "600"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(64)
    ]
    try:
        losers = _wait_for_exits(processes, count=56)
        for loser in losers:
            assert loser.returncode == 10, loser.stderr.read()
        winners = [p for p in processes if p not in losers]
        assert len(winners) == 8 and all(p.poll() is None for p in winners)
        assert "held by" in losers[0].stderr.read()
        leases = status()["leases"]
        assert sorted(lease["pid"] for lease in leases) == sorted(p.pid for p in winners)
        held = [g["index"] for lease in leases for g in lease["gpus"]]
        assert sorted(held) == list(range(8))
    finally:
        end_all(processes)
    assert status()["free"] == list(range(8))


def _wait_for_exits(processes: list[subprocess.Popen], count: int) -> list[subprocess.Popen]:
    """The first ``count`` processes to exit (fails after TIMEOUT_S)."""
    import time

    deadline = time.monotonic() + TIMEOUT_S
    exited: list[subprocess.Popen] = []
    while len(exited) < count:
        assert time.monotonic() < deadline, f"only {len(exited)} of {count} exited"
        exited += [p for p in processes if p not in exited and p.poll() is not None]
        time.sleep(0.05)
    return exited


def test_a_killed_job_gives_its_gpus_back() -> None:
    with running(
        gpualloc_argv("run", "-n", "4", "-q", "--", "sh", "-c", "echo ready; exec sleep 600"),
        stdout=subprocess.PIPE,
        text=True,
    ) as process:
        assert process.stdout.readline() == "ready\n"
        assert len(status()["free"]) == 4
        end(process)  # SIGKILL: no handler, no cleanup of its own
    assert status()["free"] == list(range(8))
    collected = gpualloc("gc")
    assert collected.stdout.startswith("freed GPU")  # gc, like every writer, reaps it
    assert gpualloc("gc").stdout == "nothing to collect: every lease is alive\n"


def test_children_that_outlive_the_job_keep_its_gpus_through_the_lease_lock() -> None:
    """A launcher that exits while its workers run (torchrun, a shell with '&') keeps the GPUs:
    the workers inherited the lease lock. Killing the last of them frees the GPUs."""
    started = gpualloc("run", "-n", "2", "--", "sh", "-c", "sleep 600 >/dev/null 2>&1 & echo $!")
    assert started.returncode == 0
    worker = int(started.stdout)
    try:
        (lease,) = status()["leases"]
        assert not psutil.pid_exists(lease["pid"])  # the launcher (sh) is gone ...
        assert len(status()["free"]) == 6  # ... and the worker's inherited lock holds the GPUs
    finally:
        os.kill(worker, signal.SIGKILL)
    _wait_gone(worker)
    assert status()["free"] == list(range(8))


def _wait_gone(pid: int) -> None:
    """Wait until ``pid`` (not our child: reparented to init) has exited."""
    with contextlib.suppress(psutil.NoSuchProcess):
        psutil.Process(pid).wait(TIMEOUT_S)


# ---- foreign processes ------------------------------------------------------------------------


@pytest.fixture
def host_with_foreign_process(tmp_path: Path) -> str:
    topology = load_bundled("dgx1-v100")
    data = topology.to_json_dict()
    data["processes"] = [{"gpu": 0, "pid": 999999, "name": "python", "user": "carol"}]
    path = tmp_path / "busy-dgx1.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_gpus_used_outside_gpualloc_are_busy_unless_ignored(host_with_foreign_process: str) -> None:
    topology = host_with_foreign_process
    refused = gpualloc("run", "--gpus", "0", "--", "true", topology=topology)
    assert refused.returncode == 10
    assert "GPU 0 runs pid 999999 (python, carol), not through gpualloc" in refused.stderr
    ok = gpualloc("run", "--ignore-foreign", "--gpus", "0", "--", "true", topology=topology)
    assert ok.returncode == 0
    assert gpualloc("run", "-n", "8", "--", "true", topology=topology).returncode == 10
    seen = status(topology)
    assert seen["gpus"][0]["state"] == "foreign"
    assert seen["gpus"][0]["processes"][0]["user"] == "carol"
    text = gpualloc("status", topology=topology).stdout
    assert "foreign" in text and "pid 999999 (python, carol)" in text


# ---- alloc, release, status ---------------------------------------------------------------------


def test_alloc_lives_as_long_as_its_process_and_prints_env_for_eval() -> None:
    holder = subprocess.Popen(["sleep", "600"])
    try:
        data = json.loads(gpualloc("alloc", "-n", "2", "--pid", str(holder.pid), "--format",
                                   "json").stdout)  # fmt: skip
        lease = data["lease"]
        assert lease["pid"] == holder.pid and lease["source"] == "alloc"
        assert data["environment"]["CUDA_VISIBLE_DEVICES"] == ",".join(
            str(g["index"]) for g in lease["gpus"]
        )
        assert len(status()["free"]) == 6
    finally:
        end(holder)
    assert status()["free"] == list(range(8))

    shell = (
        f'eval "$({shlex_join(gpualloc_argv("alloc", "-n", "1", "--pid", "$$"))} --format env)"'
        ' && echo "$CUDA_VISIBLE_DEVICES $CUDA_DEVICE_ORDER $GPUALLOC_LEASE_ID"'
    )
    printed = subprocess.run(
        ["sh", "-c", shell], capture_output=True, text=True, check=True, timeout=120
    )
    visible, order, lease_id = printed.stdout.split()
    assert order == "PCI_BUS_ID" and visible.isdigit() and len(lease_id) == 12


def shlex_join(argv: list[str]) -> str:
    # "$$" must reach the shell unquoted; everything else is quoted.
    import shlex

    return " ".join(word if word == "$$" else shlex.quote(word) for word in argv)


def test_hold_until_release_by_id_prefix_or_mine() -> None:
    first = gpualloc("alloc", "-n", "2", "--hold", "--name", "notebook", "--format", "json")
    lease_id = json.loads(first.stdout)["lease"]["id"]
    second = json.loads(gpualloc("alloc", "--hold", "--format", "json").stdout)["lease"]["id"]
    text = gpualloc("status").stdout
    assert "notebook" in text and lease_id in text and "hold" in text
    released = gpualloc("release", lease_id[:6])
    assert released.returncode == 0 and released.stdout.startswith("released GPU")
    assert gpualloc("release", lease_id).returncode == 13  # gone now
    assert gpualloc("release", "zzzz").returncode == 13
    assert gpualloc("release").returncode == 2  # nothing named
    mine = gpualloc("release", "--mine", "--json")
    assert [x["id"] for x in json.loads(mine.stdout)["released"]] == [second]
    assert gpualloc("release", "--mine").stdout == "you hold no lease\n"


def test_status_watch_redraws_until_interrupted() -> None:
    assert gpualloc("alloc", "--hold", "--name", "watched").returncode == 0
    with running(
        gpualloc_argv("status", "--watch", "--interval", "0.2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        footers = 0
        while footers < 2:  # two complete views: it redraws
            line = process.stdout.readline()
            assert line, process.stderr.read()
            footers += line.startswith("7 of 8 GPUs free;")
        process.send_signal(signal.SIGINT)
        assert process.wait(TIMEOUT_S) == 0  # Ctrl-C is how a watch ends: not an error
        assert "Traceback" not in process.stderr.read()


def test_alloc_refuses_a_dead_pid_and_conflicting_lifetimes() -> None:
    dead = subprocess.Popen(["true"])
    end(dead)  # ended or killed: a pid nothing runs as
    refused = gpualloc("alloc", "--pid", str(dead.pid))
    assert refused.returncode == 2 and "no process with pid" in refused.stderr
    assert gpualloc("alloc", "--pid", "1", "--hold").returncode == 2
    assert gpualloc("alloc", "--format", "yaml").returncode == 2
    assert status()["leases"] == []


def test_leases_of_a_recorded_topology_are_kept_apart_from_the_hosts(tmp_path: Path) -> None:
    assert gpualloc("alloc", "--hold").returncode == 0
    files = sorted(p.name for p in (tmp_path / "state").iterdir())
    assert not (tmp_path / "state" / "ledger.json").exists()
    assert any(re.fullmatch(r"ledger@dgx1-v100-[0-9a-f]{8}\.json", name) for name in files)
    assert status("dgx1-p100")["leases"] == []  # another topology, another ledger


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


# ---- NUMA binding on a topology that describes this machine ---------------------------------


@pytest.fixture
def this_machine(tmp_path: Path) -> tuple[str, list[int]]:
    """A 2-GPU topology recorded 'here': both GPUs on NUMA node 0 of this machine."""
    node0 = Path("/sys/devices/system/node/node0/cpulist")
    if not node0.exists():
        pytest.skip("no NUMA information in sysfs")
    cpus = parse_cpulist(node0.read_text())
    topology = load_bundled("nvlink-pairs-4gpu")
    gpus = [replace(g, numa_node=0, cpu_affinity=cpus) for g in topology.gpus]
    here = replace(
        topology,
        gpus=gpus,
        numa_nodes=[NumaNode(id=0, cpus=cpus)],
        provenance=replace(topology.provenance, source="nvml", hostname=socket.gethostname()),
    )
    path = tmp_path / "this-machine.json"
    path.write_text(here.to_json())
    allowed = sorted(set(cpus) & os.sched_getaffinity(0))
    return str(path), allowed


@pytest.mark.skipif(shutil.which("numactl") is None, reason="numactl is not installed")
def test_a_job_on_this_machine_runs_under_numactl(
    this_machine: tuple[str, list[int]], job: Path
) -> None:
    topology, allowed = this_machine
    dry = json.loads(gpualloc("run", "--ignore-foreign", "--dry-run", "--json", "--", "true",
                              topology=topology).stdout)  # fmt: skip
    assert dry["argv"] == ["numactl", "--cpunodebind=0", "--membind=0", "--", "true"]
    ran = gpualloc("run", "--ignore-foreign", "--", sys.executable, str(job), topology=topology)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["affinity"] == allowed
    assert "CPUs of NUMA node 0" in ran.stderr
    # This machine's own ledger, not a recorded topology's.
    assert Path(os.environ["GPUALLOC_STATE_DIR"], "ledger.json").exists()


def test_without_numactl_the_affinity_is_set_and_the_user_told(
    this_machine: tuple[str, list[int]], job: Path, tmp_path: Path
) -> None:
    topology, allowed = this_machine
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python").symlink_to(sys.executable)
    env = {**os.environ, "PATH": str(bare)}
    ran = gpualloc("run", "--ignore-foreign", "--", "python", str(job), topology=topology, env=env)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["affinity"] == allowed
    assert "numactl is not installed, so memory is not bound" in ran.stderr


def test_numa_none_and_gpu_processes_warning(this_machine: tuple[str, list[int]]) -> None:
    topology, _ = this_machine
    dry = gpualloc("run", "--numa", "none", "--dry-run", "--json", "--", "true", topology=topology)
    assert json.loads(dry.stdout)["argv"] == ["true"]
    # No NVML and no nvidia-smi on this machine: gpualloc says it cannot see foreign use.
    if shutil.which("nvidia-smi") is None:
        assert "GPUs used outside gpualloc are not detected" in dry.stderr


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
