"""A lease's time limit (``--time``): written as Slurm's ``--time`` or with units, granted at
the door under the system configuration's ``limits.*`` (exit 12 above a maximum), and kept:
a ``--hold`` lease is released at its limit, a job gets SIGTERM and, ``limits.kill_wait``
later, SIGKILL; on the file ledger by a watch of the job's user, through a broker by the
broker itself, as root (sbatch(1) ``--time``, slurm.conf(5) ``KillWait``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from gpualloc.errors import ExitCode
from gpualloc.host.time_rules import TimeRules
from gpualloc.time_limits import format_time_limit, parse_signal, parse_time_limit
from tests.broker_harness import RunningBroker
from tests.cli_harness import TIMEOUT_S, gpualloc_argv, status
from tests.house_rules import refused

SLURM_FORMS = [
    ("30", 30 * 60.0),  # a bare number is minutes, as in Slurm
    ("30:15", 30 * 60 + 15.0),
    ("1:30:00", 5400.0),
    ("2-12", (2 * 24 + 12) * 3600.0),
    ("2-12:30", (2 * 24 + 12) * 3600 + 30 * 60.0),
    ("2-12:30:15", (2 * 24 + 12) * 3600 + 30 * 60 + 15.0),
]
UNIT_FORMS = [("2h", 7200.0), ("90m", 5400.0), ("1h30m", 5400.0), ("45s", 45.0), ("1.5d", 129600.0)]


@pytest.mark.parametrize(("text", "seconds"), SLURM_FORMS + UNIT_FORMS)
def test_a_limit_reads_in_slurms_forms_and_with_units(text: str, seconds: float) -> None:
    assert parse_time_limit(text) == seconds
    assert parse_time_limit(format_time_limit(seconds)) == seconds  # squeue's form reads back


@pytest.mark.parametrize("text", ["0", "none", "UNLIMITED", "infinite", "0:00"])
def test_zero_unlimited_and_none_ask_for_no_limit(text: str) -> None:
    assert parse_time_limit(text) is None
    assert format_time_limit(None) == "UNLIMITED"


@pytest.mark.parametrize(
    ("text", "said"),
    [("abc", "not a time limit"), ("1:2:3:4", "not a time limit"), ("-5", "not a time limit"),
     ("2-", "not a time limit"), ("400d", "longer than a year"), ("9000-00", "longer than a year"),
     ("1.5", "whole minutes"), ("30.0", "whole minutes")],
)  # fmt: skip
def test_what_is_no_limit_is_one_usage_error(cli, text: str, said: str) -> None:
    result = cli("--topology", "dgx1-v100", "alloc", "--hold", "--time", text)
    assert said in refused(result, ExitCode.USAGE)
    assert status()["leases"] == []


@pytest.mark.parametrize(
    ("text", "read"),
    [("USR1", (10, 60.0, False)), ("SIGUSR2@120", (12, 120.0, False)), ("10@0", (10, 0.0, False)),
     ("B:USR1@30", (10, 30.0, True)), ("R:TERM", (15, 60.0, False))],
)  # fmt: skip
def test_signal_reads_as_slurms(text: str, read: tuple[int, float, bool]) -> None:
    assert parse_signal(text) == read


@pytest.mark.parametrize(
    ("text", "said"),
    [("FOO", "'FOO' is not a signal"), ("99", "is not a signal"), ("X:USR1", "'X' is not R or B"),
     ("USR1@70000", "from 0 to 65535"), ("USR1@-1", "from 0 to 65535")],
)  # fmt: skip
def test_a_signal_that_is_none_is_one_usage_error(cli, text: str, said: str) -> None:
    result = cli("--topology", "dgx1-v100", "alloc", "--hold", "--time", "1h", "--signal", text)
    assert said in refused(result, ExitCode.USAGE)


def test_a_signal_needs_a_process_to_go_to(cli) -> None:
    result = cli("--topology", "dgx1-v100", "alloc", "--hold", "--time", "1h", "--signal", "USR1")
    assert "a --hold lease has none" in refused(result, ExitCode.USAGE)


def test_a_signal_needs_a_time_limit(cli) -> None:
    result = cli("--topology", "dgx1-v100", "alloc", "--pid", str(os.getpid()), "--signal", "USR1")
    assert "has none" in refused(result, ExitCode.USAGE)
    assert status()["leases"] == []


def _system_file(text: str) -> Path:
    path = Path(os.environ["GPUALLOC_SYSTEM_CONFIG"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _limits(topology: str = "dgx1-v100") -> list[tuple[bool, float | None]]:
    return [(lease["hold"], lease.get("time_limit_s")) for lease in status(topology)["leases"]]


def test_the_system_file_sets_the_default_and_refuses_past_its_maxima(cli) -> None:
    path = _system_file('[limits]\ndefault_time = "30"\nmax_time = "2h"\nmax_hold = "1h"\n')
    alloc = ("--topology", "dgx1-v100", "alloc", "-n", "1", "--format", "env")
    assert cli(*alloc, "--hold").exit_code == 0  # the default: 30 minutes
    assert cli(*alloc, "--hold", "--time", "45m").exit_code == 0
    assert _limits() == [(True, 1800.0), (True, 2700.0)]
    first = status()["leases"][0]
    ends = datetime.fromisoformat(first["ends"]) - datetime.fromisoformat(first["created"])
    assert ends.total_seconds() == 1800.0  # status --json says when
    over = cli(*alloc, "--hold", "--time", "3h")
    assert f"1:00:00, limits.max_hold in {path}" in refused(over, ExitCode.NOT_PERMITTED)
    assert "--time 1:00:00 or less" in over.stderr
    assert "--time 0 (no limit)" in refused(
        cli(*alloc, "--hold", "--time", "0"), ExitCode.NOT_PERMITTED
    )
    run_over = cli("--topology", "dgx1-v100", "run", "-n", "1", "--time", "2-00", "--", "true")
    assert "limits.max_time" in refused(run_over, ExitCode.NOT_PERMITTED)
    assert len(_limits()) == 2  # nothing was taken by a refusal


def test_a_user_file_cannot_lift_the_limits(cli, tmp_path: Path) -> None:
    user = tmp_path / "config" / "gpualloc" / "config.toml"
    user.parent.mkdir(parents=True)
    user.write_text('[limits]\nmax_time = "none"\n')
    assert "limits.max_time" in refused(
        cli("--topology", "dgx1-v100", "config", "show"), ExitCode.CONFIG
    )


def test_a_hold_with_no_limit_asked_gets_the_hosts_longest() -> None:
    rules = TimeRules(max_s=7200.0, max_hold_s=3600.0)
    assert rules.granted(None, hold=True) == 3600.0
    assert rules.granted(None, hold=False) == 7200.0
    assert TimeRules(default_s=600.0, max_s=300.0).granted(None, hold=False) == 300.0
    assert TimeRules().granted(None, hold=True) is None
    assert TimeRules().granted(0.0, hold=False) is None  # --time 0: none, where none is allowed


def test_a_users_own_table_then_their_groups_replace_the_hosts_limits(cli) -> None:
    """Key by key: a user's ``[limits.users.NAME]``, else the longest of their groups'
    ``[limits.groups.NAME]`` (here root's primary group, and one that does not exist)."""
    import grp
    import pwd

    me = pwd.getpwuid(os.geteuid())
    group = grp.getgrgid(me.pw_gid).gr_name
    path = _system_file(
        f'[limits]\nmax_time = "1h"\nmax_hold = "1h"\n[limits.users.{me.pw_name}]\n'
        f'max_time = "3h"\n[limits.groups.{group}]\nmax_hold = "10m"\n'
        '[limits.groups.gpualloc-no-such-group]\nmax_hold = "5h"\n'
    )
    alloc = ("--topology", "dgx1-v100", "alloc", "-n", "1", "--format", "env")
    assert cli(*alloc, "--pid", str(os.getpid()), "--time", "2h").exit_code == 0  # own table
    over = cli(*alloc, "--hold", "--time", "20m")
    assert f"limits.groups.{group}.max_hold in {path}" in refused(over, ExitCode.NOT_PERMITTED)
    rules = TimeRules(max_hold_s=60.0, groups={group: {"max_hold": 600.0}, "x": {}})
    assert rules.for_uid(os.geteuid()).max_hold_s == 600.0
    unlimited = TimeRules(max_s=60.0, groups={group: {"max_time": None}})
    assert unlimited.for_uid(os.geteuid()).max_s is None  # none: the longest of all


@pytest.mark.parametrize(
    ("table", "said"),
    [("[limits.users.alice]\nmax_gpus = 3\n", "max_gpus is not one of"),
     ('[limits.users]\nalice = "1h"\n', "must be a table"),
     ('[limits.groups.lab]\nmax_time = "soon"\n', "not a time limit")],
)  # fmt: skip
def test_a_bad_user_or_group_table_is_a_config_error(cli, table: str, said: str) -> None:
    _system_file(table)
    assert said in refused(cli("--topology", "dgx1-v100", "config", "show"), ExitCode.CONFIG)


def test_a_bare_number_in_the_system_file_is_refused_as_ambiguous(cli) -> None:
    _system_file("[limits]\nmax_time = 30\n")
    assert "in quotes" in refused(cli("--topology", "dgx1-v100", "config", "show"), ExitCode.CONFIG)


def test_a_limited_lease_says_when_it_ends(cli) -> None:
    alloc = ("--topology", "dgx1-v100", "alloc", "--hold", "-n", "1", "--format", "env")
    lease = next(x for x in cli(*alloc, "--time", "90m").stdout.split() if "LEASE_ID" in x)
    shown = cli("--topology", "dgx1-v100", "status").stdout
    assert re.search(r"0s, 1h (29|30)m left", shown), shown  # as squeue's TIME_LEFT
    released = cli("--topology", "dgx1-v100", "release", lease.split("=")[1])
    assert re.search(r"until \d\d:\d\d \(its time limit, in 1h (29|30)m\)", released.stdout)


def test_a_hold_is_released_at_its_limit(cli) -> None:
    alloc = ("--topology", "dgx1-v100", "alloc", "--hold", "-n", "2", "--format", "env")
    assert cli(*alloc, "--time", "1s").exit_code == 0
    assert [hold for hold, _ in _limits()] == [True]
    time.sleep(1.2)
    assert _limits() == []  # reaped by the next look
    assert cli("--topology", "dgx1-v100", "alloc", "--hold", "-n", "8").exit_code == 0


IGNORES_TERM = "trap 'echo TERM >&2' TERM; while :; do sleep 0.1; done"


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        gpualloc_argv("run", "-n", "1", *args), capture_output=True, text=True,
        timeout=TIMEOUT_S, env=env, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_a_job_on_the_file_ledger_is_ended_at_its_limit() -> None:
    """SIGTERM at the limit (the job's exit is the signal's), the job told on its stderr."""
    started = time.monotonic()
    ended = _run("--time", "1s", "--", "sleep", "30")
    assert ended.returncode == -15 or ended.returncode == 128 + 15, ended
    assert time.monotonic() - started < 20
    assert "time limit (0:01) ran out: SIGTERM now" in ended.stderr
    assert status()["leases"] == []


def test_a_job_that_ignores_sigterm_is_killed_after_the_kill_wait() -> None:
    _system_file('[limits]\nkill_wait = "1s"\n')
    ended = _run("--time", "1s", "--", "bash", "-c", IGNORES_TERM)
    assert ended.returncode in (-9, 128 + 9), ended
    assert "TERM" in ended.stderr and "SIGKILL in 1 s" in ended.stderr
    assert status()["leases"] == []


WAITS_FOR_USR1 = "trap 'echo USR1 >&2; exit 7' USR1; while :; do sleep 0.1; done"


def test_signal_reaches_the_job_before_its_limit() -> None:
    ended = _run("--time", "30s", "--signal", "USR1@29", "--", "bash", "-c", WAITS_FOR_USR1)
    assert ended.returncode == 7 and "USR1" in ended.stderr, ended


def test_the_process_an_alloc_lease_lives_with_is_ended_at_its_limit(cli) -> None:
    """``alloc --pid``: the file ledger's watch ends that process, as the broker would."""
    _system_file('[limits]\nkill_wait = "1s"\n')
    with subprocess.Popen(["bash", "-c", IGNORES_TERM], stderr=subprocess.PIPE, text=True) as job:
        try:
            alloc = ("--topology", "dgx1-v100", "alloc", "-n", "1", "--format", "env")
            assert cli(*alloc, "--pid", str(job.pid), "--time", "1s").exit_code == 0
            assert job.wait(timeout=20) == -9
            assert job.stderr is not None and "TERM" in job.stderr.read()
        finally:
            job.kill()
    assert status()["leases"] == []


def _gone(pid: int, within_s: float) -> bool:
    """Whether ``pid`` has ended (or is a zombie) within ``within_s``."""
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        try:
            if Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z":
                return True
        except (OSError, IndexError):
            return True
        time.sleep(0.1)
    return False


def test_a_lease_released_before_its_limit_leaves_its_process_alone(cli) -> None:
    with subprocess.Popen(["sleep", "30"]) as job:
        try:
            alloc = ("--topology", "dgx1-v100", "alloc", "-n", "1", "--format", "env")
            made = cli(*alloc, "--pid", str(job.pid), "--time", "2s")
            lease = next(x for x in made.stdout.split() if "LEASE_ID" in x).split("=")[1]
            assert cli("--topology", "dgx1-v100", "release", lease).exit_code == 0
            assert not _gone(job.pid, 4.0), "the watch ended a process its lease had left"
        finally:
            job.kill()


def test_children_a_job_leaves_behind_are_ended_at_its_limit(tmp_path: Path) -> None:
    """The job's first process exits, its child keeps the lease (its process group): the
    watch follows the lease, not the first process."""
    child = tmp_path / "child.pid"
    script = f"sleep 30 >/dev/null 2>&1 & echo $! > {child}; exit 0"
    ran = subprocess.run(
        gpualloc_argv("run", "-n", "1", "--time", "2s", "--", "sh", "-c", script),
        capture_output=True, text=True, timeout=TIMEOUT_S, start_new_session=True,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    pid = int(child.read_text())
    assert not _gone(pid, 0.5) and status()["leases"]  # the child holds the lease
    assert _gone(pid, 10.0), "the child outlived the job's time limit"


def test_a_job_that_ends_in_time_is_not_signalled() -> None:
    ended = _run("--time", "30s", "--", "true")
    assert ended.returncode == 0 and "time limit" not in ended.stderr, ended


def test_the_broker_signals_no_group_whose_number_another_process_took() -> None:
    """A job's process and group ended and their number reused: the broker, as root, leaves
    the newcomer alone (a lease still in the ledger names them until the reaper's next look)."""
    from datetime import timedelta, timezone

    from gpualloc.broker.overdue import Overdue
    from gpualloc.ledger.schema import Lease, LeasedGpu

    stranger = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        started = datetime.now(timezone.utc) - timedelta(hours=1)
        lease = Lease(
            id="a" * 12, gpus=(LeasedGpu(index=0),), uid=os.geteuid(), user="old",
            pid=stranger.pid, pid_start_time=1.0, process_group=stranger.pid,
            created=started, source="run", time_limit_s=60.0,
        )  # fmt: skip
        assert Overdue().look([lease], 0.0, lambda _: [(stranger.pid, 1.0)]) == []
        assert stranger.poll() is None  # not signalled
    finally:
        stranger.kill()
        stranger.wait()


# ---- through a broker ----------------------------------------------------------------------


@pytest.fixture
def limited_broker(tmp_path: Path) -> RunningBroker:
    if os.geteuid() != 0:
        pytest.skip("the broker's tests run it as root (CI runs as root)")
    config = tmp_path / "broker-system.toml"
    config.write_text('[limits]\nkill_wait = "1s"\nmax_hold = "1h"\n')
    config.chmod(0o644)
    broker = RunningBroker("dgx1-v100", system_config=config).start()
    yield broker
    broker.stop()
    shutil.rmtree(broker.directory, ignore_errors=True)


def _through(broker: RunningBroker) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "GPUALLOC_TOPOLOGY"}
    return env | {"GPUALLOC_BROKER": str(broker.socket)}


def test_the_broker_ends_a_job_at_its_limit_and_kills_one_that_ignores_sigterm(
    limited_broker: RunningBroker,
) -> None:
    """The broker signals as root, so the job's user has nothing to kill to escape the limit
    (no watch of theirs runs: the client forks none through a broker)."""
    env = _through(limited_broker)
    argv = ["run", "-n", "1", "--time", "1s", "--", "bash", "-c", IGNORES_TERM]
    ended = subprocess.run(
        [*gpualloc_argv(*argv)[:3], *argv], capture_output=True, text=True, timeout=TIMEOUT_S,
        env=env, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert ended.returncode in (-9, 128 + 9), ended
    assert "SIGKILL in" not in ended.stderr  # no client-side watch spoke
    log = limited_broker.log_text()
    assert "time limit (0:01) ran out: SIGTERM" in log and "SIGKILL" in log, log[-2000:]
    deadline = time.monotonic() + 10
    while limited_broker.call("snapshot")["ledger"]["leases"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert limited_broker.call("snapshot")["ledger"]["leases"] == []


def test_the_broker_sends_the_signal_before_the_limit(limited_broker: RunningBroker) -> None:
    argv = ["run", "-n", "1", "--time", "30s", "--signal", "B:USR1@29", "--", "bash", "-c"]
    ended = subprocess.run(
        [*gpualloc_argv()[:3], *argv, WAITS_FOR_USR1], capture_output=True, text=True,
        timeout=TIMEOUT_S, env=_through(limited_broker), stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert ended.returncode == 7 and "USR1" in ended.stderr, ended
    assert "SIGUSR1, 29 s before" in limited_broker.log_text()


def test_the_broker_ends_what_the_job_left_whatever_its_group(
    limited_broker: RunningBroker, tmp_path: Path
) -> None:
    """A job started from a script leads no process group: the broker still ends the child
    it started, found by its watch's passes over /proc, at the limit, not only its first
    process (the child survived that, holding the lease)."""
    child = tmp_path / "child.pid"
    script = f"sleep 30 & echo $! > {child}; wait"
    argv = ["run", "-n", "1", "--time", "2s", "--", "sh", "-c", script]
    with subprocess.Popen(
        [*gpualloc_argv()[:3], *argv], env=_through(limited_broker), stdin=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    ) as job:  # fmt: skip
        deadline = time.monotonic() + 30
        while not child.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        pid = int(child.read_text())
        assert _gone(pid, 15.0), limited_broker.log_text()[-2000:]
        job.wait(timeout=30)


BINDS_A_DECOY = """
import os, signal, sys, time
from pathlib import Path
from gpualloc.wire.client import BrokerClient

client = BrokerClient(Path(sys.argv[1]))
terms = {"source": "submit", "pid": os.getpid(), "time_limit_s": 2}
options = {"policy": "mapa", "count": 1, "sensitive": False}
client.call("alloc", {"lease_id": "abababababab", "options": options, "terms": terms})
decoy = os.fork()
if decoy == 0:
    os.setsid()
    time.sleep(60)
    os._exit(0)
time.sleep(0.2)
client.call("adopt", {"lease": "abababababab", "pid": decoy})
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("bound", flush=True)
while True:
    time.sleep(1)
"""
"""A holder that binds its lease to a throwaway child of its own (``adopt``), then ignores
SIGTERM and works on: the broker must not spare it once the child is gone."""


def test_binding_a_lease_to_a_decoy_child_buys_its_holder_no_time(
    limited_broker: RunningBroker,
) -> None:
    with subprocess.Popen(
        [sys.executable, "-c", BINDS_A_DECOY, str(limited_broker.socket)],
        stdout=subprocess.PIPE, text=True, env=_through(limited_broker),
    ) as holder:  # fmt: skip
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "bound\n"
            (lease,) = limited_broker.call("snapshot")["ledger"]["leases"]
            assert lease["process_group"] != holder.pid  # bound to the decoy
            holder.wait(timeout=20)  # the decoy's SIGTERM at 2 s, then the holder's SIGKILL
        finally:
            holder.kill()
    assert holder.returncode == -signal.SIGKILL
    assert limited_broker.call("snapshot")["ledger"]["leases"] == []


def test_the_brokers_own_system_file_grants_the_limits(limited_broker: RunningBroker) -> None:
    env = _through(limited_broker)
    argv = [*gpualloc_argv("alloc")[:3], "alloc", "--hold", "-n", "1", "--format", "json"]
    over = subprocess.run([*argv, "--time", "2h"], capture_output=True, text=True, env=env)
    assert "limits.max_hold" in refused(over, ExitCode.NOT_PERMITTED)
    held = subprocess.run(argv, capture_output=True, text=True, env=env)  # gets max_hold
    assert held.returncode == 0, held.stderr
    (lease,) = limited_broker.call("snapshot")["ledger"]["leases"]
    assert lease["time_limit_s"] == 3600.0 and lease["id"] == json.loads(held.stdout)["lease"]["id"]
