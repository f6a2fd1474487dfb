"""Submitted jobs through a real broker: a job keeps its place in the queue and its lease
across a ``kill -9`` and restart of the broker, and the broker ends a job at its time limit
even when its user has killed the job's supervisor (gpualloc/cli/supervisor.py)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpualloc.batch.record import FINAL_STATES
from gpualloc.broker.watch import LOOK_S
from gpualloc.ledger.liveness import process_alive
from tests.broker_harness import (
    RunningBroker,
    broker_leases,
    clean_env,
    running_broker,
    until,
)


@pytest.fixture
def broker() -> Iterator[RunningBroker]:
    yield from running_broker("dgx1-v100")


def client(broker: RunningBroker, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**clean_env(), "GPUALLOC_BROKER": str(broker.socket)}
    return subprocess.run(
        [sys.executable, "-m", "gpualloc", *args], env=env, text=True, capture_output=True,
        timeout=120, check=False,
    )  # fmt: skip


def submit(broker: RunningBroker, *args: str) -> str:
    done = client(broker, "submit", "--parsable", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def record(broker: RunningBroker, job_id: str) -> dict:
    done = client(broker, "show", "--json", job_id)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_kill_9_of_the_broker_mid_queue_and_mid_run_loses_no_job(broker: RunningBroker) -> None:
    running = submit(broker, "-n", "8", "--", "sleep", "4")
    until(lambda: record(broker, running)["state"] == "running", "the first job to start")
    waiting = submit(broker, "-n", "1", "--", "true")
    until(lambda: broker.call("snapshot")["ledger"]["queue"] != [], "the second job to queue")
    broker.kill9()
    broker.start()
    until(lambda: record(broker, waiting)["state"] in FINAL_STATES, "the second job to end", 60)
    assert record(broker, running)["state"] == "completed"
    assert record(broker, waiting)["state"] == "completed"
    until(lambda: broker_leases(broker) == [], "every GPU to be free")
    # The supervisors told the restarted broker how their jobs exited, as root's history keeps.
    (history,) = broker.state.glob("*.history.jsonl")
    ended = {r["lease"]: r for r in map(json.loads, history.read_text().splitlines())}
    assert {ended[running]["exit_status"], ended[waiting]["exit_status"]} == {0}


def test_a_jobs_lease_outlives_its_exit_while_a_process_it_left_runs(
    broker: RunningBroker,
) -> None:
    """A job that leaves a process behind in a session of its own (setsid) has exited, but
    its GPUs are not free until that process has gone; the history keeps the exit status."""
    job_id = submit(broker, "--time", "1:00", "--", "sh", "-c",
                    "setsid sleep 37 & sleep 1.5; exit 0")  # fmt: skip
    until(lambda: record(broker, job_id)["state"] in FINAL_STATES, "the job to end", 60)
    assert record(broker, job_id)["state"] == "completed"
    assert [lease["id"] for lease in broker_leases(broker)] == [job_id]
    left = subprocess.run(["pgrep", "-f", "^sleep 37$"], capture_output=True, text=True)
    for pid in left.stdout.split():
        os.kill(int(pid), signal.SIGKILL)
    until(lambda: broker_leases(broker) == [], "the lease to end with its last process")

    def ended() -> list[dict]:
        return [json.loads(line) for path in broker.state.glob("*.history.jsonl")
                for line in path.read_text().splitlines()]  # fmt: skip

    until(lambda: ended() != [], "the lease's history record")
    assert [(r["lease"], r["exit_status"]) for r in ended()] == [(job_id, 0)]


def test_a_job_whose_supervisor_was_killed_still_ends_at_its_limit(broker: RunningBroker) -> None:
    job_id = submit(broker, "--time", "0:06", "--", "sleep", "120")
    until(lambda: record(broker, job_id)["state"] == "running", "the job to start")
    found = record(broker, job_id)
    # At once: the supervisor bound its lease to the job's group before the job began
    # (Host.adopt), not at the broker's next pass over /proc (LOOK_S).
    os.kill(found["supervisor_pid"], signal.SIGKILL)
    (lease,) = broker_leases(broker)
    assert lease["process_group"] == found["job_pgid"]
    time.sleep(2 * LOOK_S)
    assert len(broker_leases(broker)) == 1  # the job still holds its GPU
    broker.kill9()  # and a broker that restarts knows the job for itself, not by its holder
    broker.start()
    time.sleep(2 * LOOK_S)
    assert len(broker_leases(broker)) == 1
    until(lambda: broker_leases(broker) == [], "the broker to end the job at its limit", 45)
    assert not process_alive(
        found["job_pgid"], None
    )  # ended (a zombie of an init that never reaps)
    assert record(broker, job_id)["state"] == "lost"


def test_at_its_limit_the_job_is_signalled_and_its_supervisor_records_timeout(
    tmp_path: Path,
) -> None:
    """The broker's --signal and SIGKILL go to the job, whose group the supervisor bound the
    lease to, never to the supervisor: it lives to record ``timeout`` (not ``lost``)."""
    system = tmp_path / "system.toml"
    system.write_text('[limits]\nkill_wait = "1s"\n')
    broker = RunningBroker("dgx1-v100", system_config=system).start()
    try:
        job = "trap 'echo warned' USR1; trap '' TERM; while :; do sleep 0.1; done"
        job_id = submit(broker, "--time", "0:03", "--signal", "B:USR1@2", "--", "sh", "-c", job)
        until(lambda: record(broker, job_id)["state"] in FINAL_STATES, "the job to end", 45)
        ended = record(broker, job_id)
        assert (ended["state"], ended["exit_signal"]) == ("timeout", signal.SIGKILL)
        assert "warned" in Path(ended["output"]).read_text()
        until(lambda: broker_leases(broker) == [], "the job's lease to end")
    finally:
        broker.stop()
        shutil.rmtree(broker.directory, ignore_errors=True)
