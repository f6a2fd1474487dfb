"""Submitted jobs on the embedded file ledger: ``submit`` returns at once, the supervisor
runs the job detached, and ``jobs``, ``log``, ``cancel`` and ``show`` read its record
(gpualloc/batch)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from msgspec.structs import replace

from gpualloc.batch.record import FINAL_STATES
from gpualloc.batch.script import read_directives
from gpualloc.cli.submission import array_tasks
from gpualloc.errors import ExitCode, RequestError
from tests.child_processes import live_members
from tests.cli_harness import gpualloc, status


def submit(*args: str) -> str:
    done = gpualloc("submit", "--parsable", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def job(job_id: str) -> dict:
    done = gpualloc("show", "--json", job_id)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def until_state(job_id: str, states: set[str], timeout_s: float = 60) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        record = job(job_id)
        if record["state"] in states:
            return record
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} never reached {states}: {record}")


def test_a_submitted_job_runs_detached_and_its_log_holds_its_output() -> None:
    job_id = submit("-n", "2", "--name", "hello", "--", "sh", "-c",
                    'echo "on $CUDA_VISIBLE_DEVICES as $GPUALLOC_JOB_ID"; exit 3')  # fmt: skip
    record = until_state(job_id, FINAL_STATES)
    assert record["state"] == "failed" and record["exit_code"] == 3
    assert record["name"] == "hello" and record["gpus"].startswith("GPU ")
    log = gpualloc("log", job_id)
    assert log.returncode == 0
    assert f"as {job_id}" in log.stdout and "on " in log.stdout
    shown = gpualloc("show", job_id).stdout.splitlines()
    command = """sh -c 'echo "on $CUDA_VISIBLE_DEVICES as $GPUALLOC_JOB_ID"; exit 3'"""
    assert f"command = {command}" in shown  # as a shell reads it, not a Python tuple
    (options,) = [line for line in shown if line.startswith("options = ")]
    assert 'count=2 name="hello"' in options and "None" not in options
    listed = gpualloc("jobs")
    assert job_id in listed.stdout and "failed" in listed.stdout
    assert status()["leases"] == []  # the lease ended with the job
    (history,) = Path(os.environ["GPUALLOC_STATE_DIR"]).glob("*.history.jsonl")
    (ended,) = [json.loads(line) for line in history.read_text().splitlines()]
    assert (ended["lease"], ended["source"], ended["exit_status"]) == (job_id, "submit", 3)


def test_the_job_survives_the_hang_up_of_the_session_that_submitted_it(tmp_path: Path) -> None:
    marker = tmp_path / "done"
    session = subprocess.Popen(
        [sys.executable, "-m", "gpualloc", "--topology", "dgx1-v100", "submit", "--parsable",
         "--", "sh", "-c", f"sleep 2; touch {marker}"],
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    out, _ = session.communicate(timeout=60)
    record = until_state(out.strip(), {"running"})
    supervisor = record["supervisor_pid"]
    # A session of its own, which it does not lead (the first child of the double fork did,
    # and is gone), so no terminal's hang-up reaches it and it can never acquire a terminal.
    assert os.getsid(supervisor) not in (supervisor, session.pid, os.getsid(0))
    with contextlib.suppress(ProcessLookupError):
        os.killpg(session.pid, signal.SIGHUP)
    os.kill(supervisor, signal.SIGHUP)  # as a terminal's hang-up would reach a session leader
    record = until_state(record["id"], FINAL_STATES)
    assert record["state"] == "completed" and marker.exists()


def test_cancel_ends_a_job_that_ignores_sigterm_after_the_grace(tmp_path: Path) -> None:
    system = Path(os.environ["GPUALLOC_SYSTEM_CONFIG"])
    system.parent.mkdir(parents=True, exist_ok=True)
    system.write_text("[limits]\nkill_wait = 1\n")
    job_id = submit("--", "sh", "-c", "trap '' TERM; echo started; sleep 60")
    until_state(job_id, {"running"})
    time.sleep(0.5)
    assert len(status()["leases"]) == 1
    assert gpualloc("cancel", job_id).returncode == 0
    record = until_state(job_id, FINAL_STATES, timeout_s=30)
    assert record["state"] == "cancelled" and record["exit_signal"] == signal.SIGKILL
    assert status()["leases"] == []


def test_cancel_ends_a_lost_jobs_process_group_itself() -> None:
    system = Path(os.environ["GPUALLOC_SYSTEM_CONFIG"])
    system.parent.mkdir(parents=True, exist_ok=True)
    system.write_text("[limits]\nkill_wait = 1\n")
    job_id = submit("--", "sh", "-c", "trap '' TERM; echo started; sleep 60")
    record = until_state(job_id, {"running"})
    os.kill(record["supervisor_pid"], signal.SIGKILL)
    assert until_state(job_id, {"lost"})["job_pgid"] == record["job_pgid"]
    done = gpualloc("cancel", job_id)
    assert done.returncode == 0 and "SIGKILL" in done.stderr, done.stderr
    assert job(job_id)["state"] == "cancelled"
    deadline = time.monotonic() + 10
    while (status()["leases"] or live_members(record["job_pgid"])) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert live_members(record["job_pgid"]) == [] and status()["leases"] == []


def test_a_job_cancelled_before_its_supervisor_began_never_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before its supervisor has recorded its pid no signal can reach it: cancel leaves a
    mark, which the supervisor reads once it has."""
    from gpualloc.batch import spawn
    from gpualloc.cli.parser import parse_command
    from gpualloc.cli.submission import submit as submit_job

    ran = tmp_path / "ran"
    held: list[tuple[Path, Path]] = []
    values = parse_command(["submit", "--", "sh", "-c", f"touch {ran}"]).values
    values.pop("parsable"), values.pop("as_json")
    with monkeypatch.context() as patched:
        patched.setattr(spawn, "start_supervisor", lambda *where: held.append(where))
        (record,) = submit_job(values, topology="dgx1-v100").records
    assert gpualloc("cancel", record.id).returncode == 0
    spawn.start_supervisor(*held[0])  # it begins only now
    assert until_state(record.id, FINAL_STATES)["state"] == "cancelled"
    assert not ran.exists()


def test_a_pending_job_cancelled_leaves_the_queue() -> None:
    holder = submit("-n", "8", "--", "sleep", "30")
    until_state(holder, {"running"})
    waiting = submit("-n", "1", "--time", "10", "--", "true")
    deadline = time.monotonic() + 30
    while not status()["queue"] and time.monotonic() < deadline:
        time.sleep(0.2)
    pending = job(waiting)
    assert pending["reason"] in ("Resources", "Priority")
    assert pending["time_limit_s"] == 600  # granted at submission, shown while it waits
    assert gpualloc("cancel", waiting, holder).returncode == 0
    assert until_state(waiting, FINAL_STATES)["state"] == "cancelled"
    assert until_state(holder, FINAL_STATES)["state"] == "cancelled"
    assert status()["queue"] == [] and status()["leases"] == []


def test_jobs_start_says_when_and_where_a_pending_job_is_expected_to_start() -> None:
    holder = submit("-n", "6", "--time", "10", "--", "sleep", "60")
    running = until_state(holder, {"running"})
    big = submit("-n", "8", "--time", "5", "--name", "big", "--", "true")
    deadline = time.monotonic() + 30
    while not status()["queue"] and time.monotonic() < deadline:
        time.sleep(0.2)
    done = gpualloc("jobs", "--start", "--json")
    assert done.returncode == 0, done.stderr
    (pending,) = json.loads(done.stdout)
    assert pending["id"] == big and pending["expected_gpus"] == list(range(8))
    expected = datetime.fromisoformat(pending["expected_start"])
    started = datetime.fromisoformat(running["started"].replace("Z", "+00:00"))
    assert abs((expected - started).total_seconds() - 600) < 5  # when the holder's 10 min end
    table = gpualloc("jobs", "--start").stdout
    assert "START_TIME" in table and "0-7" in table
    (waiting,) = status()["queue"]  # status says the same
    assert (waiting["expected_start"], waiting["expected_gpus"]) == (
        pending["expected_start"], list(range(8)))  # fmt: skip
    assert gpualloc("cancel", holder, big).returncode == 0


def test_a_job_past_its_time_limit_ends_as_timeout() -> None:
    job_id = submit("--time", "0:02", "--", "sleep", "60")
    record = until_state(job_id, FINAL_STATES, timeout_s=60)
    assert record["state"] == "timeout" and record["reason"] == "TimeLimit"


def test_a_dependency_that_can_never_be_met_cancels_the_job() -> None:
    failing = submit("--", "false")
    after = submit("--dependency", f"afterok:{failing}", "--", "true")
    also = submit("--dependency", f"afternotok:{failing[:6]}", "--", "true")
    assert until_state(after, FINAL_STATES)["reason"] == "DependencyNeverSatisfied"
    assert until_state(also, FINAL_STATES)["state"] == "completed"
    (row,) = [line for line in gpualloc("jobs").stdout.splitlines() if after in line]
    assert row.split()[2:] == ["cancelled", "0:00", "UNLIMITED", "(DependencyNeverSatisfied)"]


def test_an_array_runs_each_task_once_within_its_limit(tmp_path: Path) -> None:
    out = tmp_path / "task-%a.out"
    echo = 'echo "task $GPUALLOC_ARRAY_TASK_ID of $GPUALLOC_ARRAY_JOB_ID"'
    done = gpualloc("submit", "--json", "--array", "0-3%2", "--output", str(out), "--",
                    "sh", "-c", echo)  # fmt: skip
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert len(answer["jobs"]) == 4
    for each in answer["jobs"]:
        until_state(each["id"], FINAL_STATES)
    for task in range(4):
        text = (tmp_path / f"task-{task}.out").read_text()
        assert f"task {task} of {answer['id']}" in text


def test_an_arrays_id_names_every_task_in_cancel_and_in_a_dependency() -> None:
    last_fails = 'sleep 0.5; test "$GPUALLOC_ARRAY_TASK_ID" != 2'
    failing = submit("--array", "0-2", "--", "sh", "-c", last_fails)
    after = submit("--dependency", f"afterok:{failing}", "--", "true")
    assert until_state(after, FINAL_STATES)["reason"] == "DependencyNeverSatisfied"
    sleeping = submit("--array", "0-2", "--", "sleep", "60")
    until_state(f"{sleeping}_2", {"running"})
    assert gpualloc("cancel", sleeping).returncode == 0
    for task in range(3):
        assert until_state(f"{sleeping}_{task}", FINAL_STATES)["state"] == "cancelled"


def test_an_id_that_names_no_job_of_yours_exits_13() -> None:
    done = gpualloc("log", "0123456789ab")
    assert done.returncode == ExitCode.NO_LEASE and "no job" in done.stderr


def test_jobs_all_shows_other_users_jobs_from_the_ledger_and_its_history() -> None:
    from gpualloc.cli.all_jobs import host_jobs, row_of
    from gpualloc.config import Config
    from gpualloc.host.local import LocalHost
    from gpualloc.host.open import open_host
    from gpualloc.topologies import load_bundled
    from tests.leases import held_lease

    host = open_host(lambda: load_bundled("dgx1-v100"), Config.load(), named=True)
    assert isinstance(host, LocalHost)
    alice = {"uid": 4242, "user": "alice", "source": "submit"}
    running = held_lease(4, 5, name="sweep", time_limit_s=3600.0, **alice)
    failed, cancelled = held_lease(0, name="bad", **alice), held_lease(1, name="cut", **alice)
    mine, not_a_job = held_lease(2, source="submit"), held_lease(3, **{**alice, "source": "alloc"})
    with host.ledger_store().transaction() as txn:
        for lease in (running, failed, cancelled, mine, not_a_job):
            txn.add(lease)
    host.exited(failed.id, 3)
    host.exited(cancelled.id, -signal.SIGTERM, cancelled=True)
    host.exited(mine.id, 0)
    since = datetime.now(timezone.utc) - timedelta(hours=1)
    seen = {view["id"]: view for view in host_jobs(host, since, known=[mine.id])}
    assert set(seen) == {running.id, failed.id, cancelled.id}
    assert all(view["user"] == "alice" and "command" not in view for view in seen.values())
    now = datetime.now(timezone.utc)
    assert row_of(seen[running.id], now)[2:] == ["sweep", "running", "0:00", "1:00:00", "GPU 4-5"]
    assert row_of(seen[failed.id], now)[3::3] == ["failed", "GPU 0 exit 3"]
    assert row_of(seen[cancelled.id], now)[3::3] == ["cancelled", "GPU 1 SIGTERM"]
    later = datetime.now(timezone.utc) + timedelta(minutes=1)
    assert [view["id"] for view in host_jobs(host, later, known=[])] == [running.id]


def test_jobs_ended_a_month_ago_and_spent_array_slots_are_removed() -> None:
    from gpualloc.batch.record import (
        JobRecord,
        jobs_directory,
        make_job_directory,
        own_records,
        remove_old_jobs,
        write_record,
    )

    now = datetime.now(timezone.utc)
    month = timedelta(days=31)

    def made(job_id: str, **fields: object) -> None:
        values: dict = {
            "name": "j",
            "user": "u",
            "uid": os.geteuid(),
            "command": ("true",),
            "cwd": "/",
            "output": "/dev/null",
            "submitted": now - 2 * month,
        }
        record = JobRecord(id=job_id, **{**values, **fields})
        write_record(record, make_job_directory(job_id))

    made("a" * 12, state="completed", ended=now - month)
    made("b" * 12, state="failed", ended=now - timedelta(days=1))
    made("c" * 12, state="running", supervisor_pid=os.getpid(), array_id="c" * 12, array_task=0)
    made("d" * 12, state="completed", ended=now, array_id="d" * 12, array_task=0)
    for array in ("c" * 12, "d" * 12):
        (jobs_directory() / f".array-{array}.slot0").touch()
    assert remove_old_jobs() == ["a" * 12]
    assert sorted(r.id for r in own_records()) == ["b" * 12, "c" * 12, "d" * 12]
    assert [p.name for p in jobs_directory().glob(".array-*")] == [f".array-{'c' * 12}.slot0"]


def test_a_lost_jobs_time_stops_at_its_supervisors_last_word() -> None:
    from gpualloc.batch.record import JobRecord, make_job_directory, write_record

    started = datetime.now(timezone.utc) - timedelta(hours=1)
    record = JobRecord(id="a1" * 6, name="gone", user="u", uid=os.geteuid(), command=("true",),
                       cwd="/", output="/dev/null", submitted=started, started=started,
                       state="running", supervisor_pid=2**22 - 1)  # fmt: skip
    write_record(record, make_job_directory(record.id))
    last = started.timestamp() + 300  # it last wrote its record five minutes in
    os.utime(record.directory / "job.json", (last, last))
    (row,) = [line.split() for line in gpualloc("jobs").stdout.splitlines() if record.id in line]
    assert row[1:4] == ["gone", "lost", "5:00"]  # not an hour and counting


def test_a_prefix_names_a_whole_array_only_where_it_names_nothing_else() -> None:
    from gpualloc.batch.record import JobRecord, find_records, make_job_directory, write_record
    from gpualloc.errors import NoSuchJob

    now = datetime.now(timezone.utc)
    for job_id, array, task in (("abcd00000000", "abcd00000000", 0),
                                ("abcd00000001", "abcd00000000", 1),
                                ("9999aaaaaaaa", "9999aaaaaaaa", 0),
                                ("abcd99999999", "9999aaaaaaaa", 1)):  # fmt: skip
        record = JobRecord(id=job_id, name="j", user="u", uid=os.geteuid(), command=("true",),
                           cwd="/", output="/dev/null", submitted=now, array_id=array,
                           array_task=task)  # fmt: skip
        write_record(record, make_job_directory(job_id))
    assert len(find_records("abcd00000000")) == 2  # the array's own id: every task
    assert len(find_records("9999")) == 2
    with pytest.raises(NoSuchJob, match="names 3 jobs"):
        find_records("abcd")  # one array's tasks and another's: which, is not for us to guess


def test_a_lost_job_that_still_runs_is_kept_and_a_reused_group_is_never_signalled() -> None:
    """A lost job's processes are known by its boot, user and start, not its group's number
    alone: one still running keeps its record however old, and a group that took the number
    since (started before the job) is neither the job's to keep nor cancel's to signal."""
    from gpualloc.batch.record import (
        JobRecord,
        make_job_directory,
        own_records,
        remove_old_jobs,
        write_record,
    )
    from gpualloc.boot import boot_id
    from gpualloc.ledger.liveness import process_start_time

    old = datetime.now(timezone.utc) - timedelta(days=40)
    with subprocess.Popen(["sleep", "60"], start_new_session=True) as group:
        try:
            started = process_start_time(group.pid)
            assert started is not None
            for job_id, job_start in (("e" * 12, started), ("f" * 12, started + 60)):
                record = JobRecord(
                    id=job_id, name="j", user="u", uid=os.geteuid(), command=("true",), cwd="/",
                    output="/dev/null", submitted=old, state="running", supervisor_pid=2**22 - 1,
                    job_pgid=group.pid, job_start=job_start, boot_id=boot_id(),
                )  # fmt: skip
                write_record(record, make_job_directory(job_id))
                os.utime(record.directory / "job.json", (old.timestamp(), old.timestamp()))
            assert remove_old_jobs() == ["f" * 12]  # its group's process predates it
            assert [r.id for r in own_records()] == ["e" * 12]
            write_record(replace(record, id="f" * 12), make_job_directory("f" * 12))
            done = gpualloc("cancel", "f" * 12)
            assert done.returncode == 0 and "ended already (lost)" in done.stderr, done.stderr
            assert group.poll() is None  # not the job's: left alone
        finally:
            group.kill()


def test_submit_refuses_what_it_can_before_writing_anything() -> None:
    assert gpualloc("submit", "--", "no-such-program-x").returncode == ExitCode.COMMAND_NOT_FOUND
    assert gpualloc("submit", "--time", "soon", "--", "true").returncode == ExitCode.USAGE
    bad = gpualloc("submit", "--dependency", "afterok:ffffffffffff", "--", "true")
    assert bad.returncode == ExitCode.NO_LEASE
    inside = gpualloc("submit", "--", "true", env={**os.environ, "SLURM_JOB_ID": "4242"})
    assert inside.returncode == ExitCode.USAGE and "inside Slurm job 4242" in inside.stderr
    assert gpualloc("jobs", "--json").stdout.strip() == "[]"


def test_sbatch_lines_are_read_and_the_rest_ignored_by_name(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text(
        "#!/bin/bash\n#SBATCH --job-name=sweep -t 10\n#SBATCH --gres=gpu:a100:4 --partition gpu\n"
        "#SBATCH --nodes=1\n#GPUALLOC --sensitive --policy drb\n\necho run\n#SBATCH --time=99\n"
    )
    found = read_directives(script)
    assert found.options == ["--name", "sweep", "--time", "10", "-n", "4",
                             "--sensitive", "--policy", "drb"]  # fmt: skip
    assert found.ignored == ["--partition=gpu"]
    script.write_text("#!/bin/sh\n#SBATCH --nodes=2\n")
    with pytest.raises(RequestError, match="one host"):
        read_directives(script)


def test_a_batch_script_is_run_by_its_bare_name_and_need_not_be_executable(
    tmp_path: Path,
) -> None:
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\n#SBATCH --job-name=plain\necho ran as $GPUALLOC_JOB_NAME\n")
    script.chmod(0o644)  # as sbatch takes it: a file, not a program
    done = gpualloc("submit", "--parsable", "train.sh", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    record = until_state(done.stdout.strip(), FINAL_STATES)
    assert record["state"] == "completed"
    assert "ran as plain" in gpualloc("log", record["id"]).stdout
    script.write_text("#!/bin/sh\necho no directives: a program\n")  # run as run runs one
    assert gpualloc("submit", "train.sh", cwd=tmp_path).returncode == ExitCode.COMMAND_NOT_FOUND


def test_array_specs_read_as_slurm_writes_them() -> None:
    assert array_tasks("0-3%2") == ([0, 1, 2, 3], 2)
    assert array_tasks("1,3,5-7") == ([1, 3, 5, 6, 7], None)
    assert array_tasks("0-10:5") == ([0, 5, 10], None)
    for bad in ("3-1", "a", "0-1%0", "0-9999"):
        with pytest.raises(RequestError):
            array_tasks(bad)
