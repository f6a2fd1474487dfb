"""A brokered lease lives with its job's processes, and through the broker's restarts.

- A ``run``'s GPUs are free the moment its job ends, and kept while a process of its group runs;
  a waiter whose client goes away leaves the queue.
- The broker's process watch adopts nothing through the reused pid of a member that ended, and
  finds a group's running members in its stepped pass over ``/proc``.
- A restart, ``kill -9`` included (50 of them under two users' allocations), loses no lease of
  a live process, books no GPU twice, and releases the leases of the dead.

The broker runs as root (tests/broker_harness.py); users are real (tests/unix_users.py). How
long a lease of the embedded ledger lives is ``test_lease_lifetime.py``'s.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tests.broker_harness import (
    RunningBroker,
    broker_leases,
    clean_env,
    hold_request,
    running_broker,
    through_broker,
    until,
)
from tests.child_processes import end, end_all, finish
from tests.unix_users import UnixUser, UserCommandLine

TOPOLOGY = "nvlink-pairs-4gpu"


@pytest.fixture
def broker() -> Iterator[RunningBroker]:
    yield from running_broker(TOPOLOGY)


# ---- a run's lease lives with its process --------------------------------------------------------


@pytest.mark.slow
def test_a_runs_gpus_are_free_the_moment_its_job_ends_and_its_group_keeps_them(
    broker: RunningBroker,
) -> None:
    job = through_broker(broker, "run", "-n", "2", "--", "sleep", "0.5")
    try:
        until(lambda: len(broker_leases(broker)) == 1, "the job's lease")
    finally:
        finish(job, timeout_s=30)
    until(lambda: not broker_leases(broker), "the lease to go", timeout_s=2)

    leader = subprocess.Popen(
        [sys.executable, "-m", "gpualloc", "run", "-n", "1", "--", "sh", "-c", "sleep 3 & exit"],
        env={**clean_env(), "GPUALLOC_BROKER": str(broker.socket)}, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        leader.wait(timeout=30)  # the job's leader is gone; its background child is not
        time.sleep(1.5)
        assert len(broker_leases(broker)) == 1, "the lease ended while a process of its job ran"
        until(
            lambda: not broker_leases(broker), "the lease to go with the last process", timeout_s=10
        )
    finally:
        end(leader, group=True)


@pytest.mark.slow
def test_a_waiter_whose_client_goes_away_leaves_the_queue(broker: RunningBroker) -> None:
    broker.call("alloc", hold_request("bbbbbbbbbbbb", gpus=4))
    waiter = through_broker(broker, "alloc", "--wait", "--hold", "-n", "2")
    try:
        until(lambda: len(broker.call("snapshot")["ledger"]["queue"]) == 1, "the waiter")
    finally:
        end(waiter)
    until(lambda: not broker.call("snapshot")["ledger"]["queue"], "the queue to empty", 5)


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


# ---- restarts ------------------------------------------------------------------------------------


def test_a_restart_keeps_the_leases_of_live_processes_and_releases_the_dead(
    broker: RunningBroker,
) -> None:
    alive = subprocess.Popen(["sleep", "60"])
    dead = subprocess.Popen(["sleep", "60"])
    try:
        for lease_id, pid in (("cccccccccccc", alive.pid), ("dddddddddddd", dead.pid)):
            request = hold_request(lease_id)
            request["terms"] = {"source": "alloc", "pid": pid}
            broker.call("alloc", request)
        broker.kill9()
        end(dead)
        broker.start()
        assert [x["id"] for x in broker_leases(broker)] == ["cccccccccccc"]
        assert "released: its job ended while no broker ran" in broker.log_text()
        end(alive)
        until(lambda: not broker_leases(broker), "the live one to go when its process does", 5)
    finally:
        end_all([alive, dead])


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
        until(lambda: broker.ledger()["generation"] > 10, "both users' allocations to flow")
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
