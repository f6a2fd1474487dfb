"""The :class:`~gpualloc.host.protocol.Host` contract, run against both implementations.

Every case runs twice, on the same bundled host (dgx1-v100, 8 GPUs): once on a
:class:`~gpualloc.host.local.LocalHost` (the embedded ledger in a temporary state directory)
and once on a :class:`~gpualloc.host.brokered.BrokeredHost` (a real ``gpualloc serve``, as the
Kubernetes device plugin runs one suite against each of its resource managers). Both are opened
as a command opens its host (:func:`~gpualloc.host.open.open_host`), and each case says what a
caller may count on from either: the placements (the placement engine's own answer for the
ledger as it stands), and for a refusal the error's class, message, hint and exit code.

A difference is a fault of the implementation that differs, not of the contract: the snapshot
served when a brokered host opened, an error's supporting lines, the words for a pid with no
process and a waiter's first status each differed once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpualloc import errors
from gpualloc.config import Config
from gpualloc.host.brokered import BrokeredHost
from gpualloc.host.lease_terms import LeaseTerms
from gpualloc.host.local import LocalHost
from gpualloc.host.open import open_host
from gpualloc.host.protocol import Host
from gpualloc.host.queue_policy import WaitOptions
from gpualloc.ledger.occupancy import Occupancy
from gpualloc.ledger.schema import Lease, Ledger
from gpualloc.model.job import JobOptions
from gpualloc.model.job_fields import JobFields
from gpualloc.placement.choose import choose
from gpualloc.placement.options import want_of
from gpualloc.placement.want import Want
from gpualloc.topologies import load_bundled
from gpualloc.wire import address
from tests.broker_harness import RunningBroker

TOPOLOGY = "dgx1-v100"
KINDS = ("local", "brokered")


class Side:
    """One implementation of the contract: how to open its host, as a command opens it."""

    def __init__(self, kind: str, state: Path | None = None) -> None:
        self.kind = kind
        self.opened: list[Host] = []
        self.state = state
        """The broker's state directory (None: the embedded ledger's, the host's own)."""

    def open(self, **options: Any) -> Host:
        """The host, as a new command opens it (each call: another client)."""
        host = open_host(lambda: load_bundled(TOPOLOGY), Config.load(), named=False, **options)
        self.opened.append(host)
        return host

    def close(self) -> None:
        for host in self.opened:
            client = getattr(host, "client", None)
            if client is not None:
                client.close()


@pytest.fixture(params=KINDS)
def side(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Side]:
    kind: str = request.param
    # No broker of this machine's own is ever asked: the local side has none.
    monkeypatch.setattr(address, "BROKER_DIRECTORY", str(tmp_path / "no-broker-here"))
    if kind == "local":
        local = Side(kind)
        yield local
        local.close()
        return
    if os.geteuid() != 0:
        pytest.skip("the broker's tests run it as root (CI runs as root)")
    broker = RunningBroker(TOPOLOGY).start()
    monkeypatch.setenv("GPUALLOC_BROKER", str(broker.socket))
    brokered = Side(kind, broker.state)
    try:
        yield brokered
    finally:
        brokered.close()
        broker.stop()
        shutil.rmtree(broker.directory, ignore_errors=True)


@pytest.fixture
def host(side: Side) -> Host:
    opened = side.open()
    assert isinstance(opened, {"local": LocalHost, "brokered": BrokeredHost}[side.kind])
    return opened


# ---- the cases' vocabulary ---------------------------------------------------------------


def want(count: int | None = None, **options: Any) -> Want:
    """A job as the command line and the library build it (``run -n COUNT --OPTION ...``;
    ``gpus``: ``--gpus``)."""
    return want_of(JobOptions(count=count, **options), Config.load())


def hold(name: str | None = None) -> LeaseTerms:
    return LeaseTerms(source="alloc", hold=True, name=name)


def engine_choice(wanted: Want, held: Iterable[Lease] = ()) -> tuple[int, ...]:
    """What the placement engine chooses for ``wanted`` with ``held`` leased (no ledger)."""
    topology = load_bundled(TOPOLOGY)
    occupancy = Occupancy.build(topology, Ledger(host="contract", leases=list(held)))
    return choose(topology, occupancy, wanted).gpus


def refusal(error: BaseException) -> tuple[str, str, str | None, int]:
    assert isinstance(error, errors.GpuallocError), repr(error)
    return type(error).__name__, error.message, error.hint, int(error.exit_code)


def refused(call: Callable[[], object]) -> tuple[str, str, str | None, int]:
    with pytest.raises(errors.GpuallocError) as caught:
        call()
    return refusal(caught.value)


def pwd_name() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name


def held_gpus(host: Host) -> dict[str, tuple[int, ...]]:
    """The leases a fresh look at the ledger shows, by id."""
    return {lease.id: lease.indices for lease in host.snapshot().ledger.leases}


# ---- allocate and release ----------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"count": 1},
        {"count": 2},
        {"count": 3, "pattern": "all"},
        {"count": 4, "pattern": "tree", "sensitive": False},
        {"count": 3, "policy": "drb"},
        {"count": 2, "exclude": "0-3"},
        {"count": 2, "require": "5"},
        {"gpus": (2, 6)},
        {"count": 8},
    ],
    ids=lambda options: ",".join(f"{k}={v}" for k, v in options.items()),
)
def test_an_allocation_is_the_engines_choice(host: Host, options: dict[str, Any]) -> None:
    job = want(**options)
    made = host.allocate(job, hold("contract"))
    assert made.lease.indices == made.placement.gpus == engine_choice(job)
    assert (made.lease.source, made.lease.hold, made.lease.name) == ("alloc", True, "contract")
    policy = "explicit" if job.explicit is not None else job.policy
    assert (made.lease.uid, made.placement.policy) == (os.geteuid(), policy)


def test_a_pattern_file_reaches_the_host_as_it_was_read(host: Host, tmp_path: Path) -> None:
    pattern = tmp_path / "chain.json"
    pattern.write_text("[[0, 1], [1, 2], [2, 3]]")
    job = want(4, pattern=str(pattern))
    assert host.allocate(job, hold()).lease.indices == engine_choice(job)


@pytest.mark.parametrize(
    "options",
    [{"count": 2}, {"count": 3, "pattern": "all"}, {"gpus": (2, 6)}],
    ids=lambda options: ",".join(f"{k}={v}" for k, v in options.items()),
)
@pytest.mark.parametrize("uuid", [False, True], ids=["indices", "uuid"])
def test_a_started_job_is_granted_what_its_launch_needs(
    side: Side, options: dict[str, Any], uuid: bool
) -> None:
    """``Host.start`` (``run``, ``alloc``): the engine's choice, and the job's variables, NUMA
    nodes and devices in words as :func:`~gpualloc.host.grant.grant_of` makes them on the
    topology; a host opened as ``run`` opens it (``full=False``) answers it too."""
    from gpualloc.host.grant import Grant, grant_of
    from gpualloc.host.terms import Allocation

    host = side.open(full=False)
    job: JobFields = {"policy": "mapa", **options}  # type: ignore[typeddict-item]
    config = Config.load()
    grant = host.start(job, hold("started"), config=config, uuid=uuid)
    wanted = want_of(JobOptions(**job), config)
    (lease,) = side.open().snapshot().ledger.leases
    assert lease.id == grant.lease_id and lease.indices == engine_choice(wanted)
    placement = choose(load_bundled(TOPOLOGY), Occupancy.build(load_bundled(TOPOLOGY),
                       Ledger(host="contract")), wanted)  # fmt: skip
    expected = grant_of(
        load_bundled(TOPOLOGY), Allocation(lease, placement), wanted, uuid=uuid, this_host=False
    )

    def launched(given: Grant) -> tuple[object, ...]:
        share = given.share and (given.share.mode, given.share.background, given.share.sm_percent)
        return (given.lease_id, given.variables, given.held, given.numa_nodes, given.this_host,
                given.notes, share)  # fmt: skip

    assert launched(grant) == launched(expected)
    assert expected.variables["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, lease.indices)) or uuid
    assert grant.views()[0]["id"] == lease.id
    assert grant.views()[1]["gpus"] == list(lease.indices)


def test_a_started_job_is_refused_before_any_gpu_is_taken(side: Side) -> None:
    """A ``--shareable`` job's ``--mem`` beyond every GPU's memory: exit 9 from either host,
    and no lease."""
    host = side.open(full=False)
    job: JobFields = {"count": 1, "policy": "mapa", "shareable": True, "mem": "64G"}
    terms = LeaseTerms(source="alloc", hold=True, shareable=True, memory_bytes=64 * 2**30)
    name, message, _, code = refused(lambda: host.start(job, terms, config=Config.load()))
    assert (name, code) == ("NoFeasiblePlacement", 9) and "--mem 64 GiB" in message, message
    assert held_gpus(side.open()) == {}


def test_allocations_one_after_another_place_around_the_leases(host: Host) -> None:
    held: list[Lease] = []
    for gpus in (2, 3, 1, 2):
        job = want(gpus)
        made = host.allocate(job, hold())
        assert made.lease.indices == engine_choice(job, held), held
        held.append(made.lease)
    assert sorted(g for lease in held for g in lease.indices) == list(range(8))


def test_a_release_frees_the_gpus_for_the_next_job(side: Side, host: Host) -> None:
    first = host.allocate(want(4), hold())
    second = host.allocate(want(4), hold())
    result = host.release_leases([first.lease.id])
    assert [lease.id for lease in result.released] == [first.lease.id]
    assert (result.problems, result.kept) == ([], [])
    again = host.allocate(want(4), hold())
    assert again.lease.indices == first.lease.indices
    assert held_gpus(side.open()) == {
        second.lease.id: second.lease.indices,
        again.lease.id: again.lease.indices,
    }


def test_a_release_receipt_says_what_was_given_back(side: Side, host: Host) -> None:
    """``release_receipt`` (what ``release`` prints): the lease in words and as ``--json``
    shows it, from either host, and an unknown id as the error the command says."""
    from gpualloc.json_views import lease_json
    from gpualloc.ledger.occupancy import describe_lease

    made = host.allocate(want(2), hold("receipt"))
    receipt = side.open(full=False).release_receipt([made.lease.id, "0123456789ab"])
    ((words, view),) = receipt.released
    assert json.loads(json.dumps(view)) == json.loads(json.dumps(lease_json(made.lease)))
    assert words == describe_lease(made.lease) and made.lease.id in words
    assert receipt.kept == [] and [refusal(p) for p in receipt.problems] == [UNKNOWN]
    assert held_gpus(side.open()) == {}


def test_release_by_name_and_by_prefix(host: Host) -> None:
    named = host.allocate(want(1), hold("mine"))
    other = host.allocate(want(1), hold())
    result = host.release_leases(["mine", other.lease.id[:6]])
    assert sorted(lease.id for lease in result.released) == sorted([named.lease.id, other.lease.id])


def test_release_mine_leaves_no_lease(side: Side, host: Host) -> None:
    for _ in range(3):
        host.allocate(want(1), hold())
    result = host.release_leases([], mine=True)
    assert len(result.released) == 3 and result.problems == []
    assert held_gpus(side.open()) == {}


def test_a_lease_bound_to_this_process_is_its(host: Host) -> None:
    made = host.allocate(want(1), LeaseTerms(source="alloc", pid=os.getpid()))
    assert (made.lease.pid, made.lease.hold) == (os.getpid(), False)
    assert made.lease.pid_start_time is not None


def test_an_announced_lease_is_confirmed(side: Side, host: Host) -> None:
    made = host.allocate(want(1), LeaseTerms(source="alloc", hold=True, announce=True))
    assert not made.lease.announced
    host.confirm(made.lease.id)
    (lease,) = side.open().snapshot().ledger.leases
    assert lease.announced


def test_an_exited_jobs_lease_ends_and_its_history_keeps_the_status(side: Side, host: Host) -> None:
    from gpualloc.ledger.history import read_history
    from gpualloc.ledger.statedir import StateDirectory

    with subprocess.Popen(["sleep", "60"]) as supervisor:  # a holder with no other process
        try:
            made = host.allocate(want(2), LeaseTerms(source="submit", pid=supervisor.pid))
            host.exited(made.lease.id, -9)
            assert held_gpus(side.open()) == {}
            host.exited(made.lease.id, 0)  # told twice (a retry): the first word stands
        finally:
            supervisor.kill()
    if side.state is None:
        assert isinstance(host, LocalHost)
        directory = host.ledger_store().directory
    else:
        (path,) = side.state.glob("*.history.jsonl")
        scope = path.name.removesuffix(".history.jsonl").partition("@")[2]
        directory = StateDirectory(side.state, scope or None)
    (record,) = read_history(directory)
    assert (record["lease"], record["exit_status"]) == (made.lease.id, -9)
    assert (record["state"], record["source"]) == ("ended", "submit")


# ---- wait and queue ----------------------------------------------------------------------


def test_a_wait_on_free_gpus_starts_at_once(host: Host) -> None:
    job = want(2)
    made = host.allocate(job, hold(), wait=WaitOptions(timeout_s=10, poll_s=0.05))
    assert made.lease.indices == engine_choice(job)


def test_a_wait_starts_when_the_gpus_are_released(side: Side, host: Host) -> None:
    everything = host.allocate(want(8), hold())
    other = side.open()  # another command releases them
    releaser = threading.Timer(0.5, lambda: other.release_leases([everything.lease.id]))
    releaser.start()
    try:
        started = time.monotonic()
        made = host.allocate(want(2), hold(), wait=WaitOptions(timeout_s=20, poll_s=0.05))
    finally:
        releaser.join()
    assert made.lease.indices == engine_choice(want(2))
    assert time.monotonic() - started < 10


WAIT_REASON = "the job needs 1 GPU and 0 usable ones are free now"


def test_a_wait_runs_out(host: Host) -> None:
    host.allocate(want(8), hold())
    wait = WaitOptions(timeout_s=0.3, poll_s=0.05)
    assert refused(lambda: host.allocate(want(1), hold(), wait=wait)) == (
        "WaitTimedOut",
        f"no GPUs for this job within 0.3 s ({WAIT_REASON})",
        "raise --timeout, or see 'gpualloc status'",
        int(errors.ExitCode.TIMEOUT),
    )


def test_a_waiter_hears_where_it_stands(host: Host) -> None:
    host.allocate(want(8), hold("all"))
    heard: list[Any] = []
    wait = WaitOptions(timeout_s=0.3, poll_s=0.05)
    with pytest.raises(errors.WaitTimedOut):
        host.allocate(want(1), hold(), wait=wait, report=heard.append)
    assert heard, "no status reached the waiter"
    first = heard[0]
    assert (first.position, first.queue_length, first.reason) == (1, 1, WAIT_REASON)
    assert first.holders == f"held by {pwd_name()}: 0-7"


def test_a_wait_that_runs_out_leaves_the_queue(side: Side, host: Host) -> None:
    host.allocate(want(8), hold())
    with pytest.raises(errors.WaitTimedOut) as caught:
        host.allocate(want(1), hold(), wait=WaitOptions(timeout_s=0.2, poll_s=0.05))
    assert caught.value.exit_code == errors.ExitCode.TIMEOUT
    assert side.open().snapshot().ledger.queue == []


def test_a_job_that_never_fits_is_not_queued(side: Side, host: Host) -> None:
    wait = WaitOptions(timeout_s=5, poll_s=0.05)
    found = refused(lambda: host.allocate(want(9), hold(), wait=wait))
    assert found[0] == "NoFeasiblePlacement" and found[3] == int(errors.ExitCode.NO_PLACEMENT)
    assert side.open().snapshot().ledger.queue == []


# ---- status: what a fresh look shows -----------------------------------------------------


def test_the_snapshot_shows_the_leases_made_since_the_host_was_opened(host: Host) -> None:
    made = host.allocate(want(2), hold())
    assert held_gpus(host) == {made.lease.id: made.lease.indices}


def test_a_snapshot_and_its_occupancy(side: Side, host: Host) -> None:
    made = host.allocate(want(3), hold("busy"))
    looked = side.open()
    txn = looked.snapshot()
    (lease,) = txn.ledger.leases
    assert (lease.id, lease.indices, lease.name, lease.user) == (
        made.lease.id,
        made.lease.indices,
        "busy",
        made.lease.user,
    )
    occupancy = looked.occupancy(txn.ledger)
    assert occupancy.free == frozenset(range(8)) - frozenset(made.lease.indices)
    assert looked.topology == load_bundled(TOPOLOGY)
    assert (looked.this_host, looked.faults, looked.health_notes) == (False, [], [])
    assert looked.processes.processes == [] and looked.processes.source == "topology"


# ---- plan: what-ifs on the host's view ----------------------------------------------------


def plan(host: Host, wanted: Want, busy: frozenset[int] | None = None) -> tuple[int, ...]:
    """What ``plan`` asks of a host (``cli/plan.py``): its ledger now, or with ``busy``, a
    what-if of those GPUs taken and every other free (the ledger not counted)."""
    from gpualloc.model.request import HostState
    from gpualloc.placement.decide import decision_context
    from gpualloc.placement.policies.registry import get_policy

    if busy is None:
        state = host.occupancy(host.snapshot().ledger).host_state()
    else:
        idle = host.occupancy(Ledger(host="what-if"))
        wanted_state = HostState.with_busy(host.topology.gpu_count, busy)
        state = HostState(free=wanted_state.free & idle.free, running=wanted_state.running)
    context = decision_context(host.topology, wanted.request, state)
    return get_policy(wanted.policy).place(context).gpus


def test_plan_now_sees_the_leases(side: Side, host: Host) -> None:
    made = host.allocate(want(4), hold())
    job = want(2)
    assert plan(side.open(), job) == engine_choice(job, [made.lease])


def test_plan_what_if_ignores_the_ledger(side: Side, host: Host) -> None:
    host.allocate(want(4), hold())
    job = want(2)
    looked = side.open()
    assert plan(looked, job, busy=frozenset()) == engine_choice(job)
    from gpualloc.api import plan as api_plan

    assert (
        plan(looked, job, busy=frozenset({0, 1}))
        == api_plan(load_bundled(TOPOLOGY), 2, busy={0, 1}).gpus
    )


# ---- refusals ----------------------------------------------------------------------------


def test_too_many_gpus(host: Host) -> None:
    assert refused(lambda: host.allocate(want(9), hold())) == (
        "NoFeasiblePlacement",
        "the job asks for 9 GPUs but 8 of 8 GPUs are usable (8 free)",
        "ask for at most 8 GPUs (-n)",
        int(errors.ExitCode.NO_PLACEMENT),
    )


def test_a_threshold_no_placement_meets(host: Host) -> None:
    """Refused at once, with or without ``--wait`` (it would wait forever)."""
    expected = (
        "NoFeasiblePlacement",
        "even with every GPU free, the best placement now (GPU 0,3) predicts 58.925 GB/s, "
        "below --min-bandwidth 10000",
        "this job would wait forever: lower the threshold",
        int(errors.ExitCode.NO_PLACEMENT),
    )
    job = want(2, min_bandwidth=10000)
    assert refused(lambda: host.allocate(job, hold())) == expected
    assert refused(lambda: host.allocate(job, hold(), wait=WaitOptions(timeout_s=5))) == expected


def test_every_gpu_excluded(host: Host) -> None:
    assert refused(lambda: host.allocate(want(2, exclude="0-7"), hold())) == (
        "NoFeasiblePlacement",
        "the job asks for 2 GPUs but 0 of 8 GPUs are usable (8 free, 8 of them excluded)",
        "no GPU of this host may be given to the job: 'gpualloc status' says why",
        int(errors.ExitCode.NO_PLACEMENT),
    )


BUSY = (
    "GpusBusy",
    "the job needs 2 GPUs and 1 usable one is free now: GPU 7",
    "wait for them ('gpualloc status' shows the host), or ask for fewer GPUs",
    int(errors.ExitCode.BUSY),
)


def test_gpus_taken_now(host: Host) -> None:
    host.allocate(want(7), hold("big"))
    assert refused(lambda: host.allocate(want(2), hold())) == BUSY


def test_gpus_taken_now_say_who_holds_them(host: Host) -> None:
    big = host.allocate(want(7), hold("big"))
    with pytest.raises(errors.GpusBusy) as caught:
        host.allocate(want(2), hold())
    (line,) = caught.value.details
    assert line.startswith(f"GPU 0-6 held by {pwd_name()} for ")
    assert line.endswith(f"lease {big.lease.id} (big), until released")


def test_explicit_gpus_taken_now(host: Host) -> None:
    host.allocate(want(gpus=(0, 1)), hold())
    assert refused(lambda: host.allocate(want(gpus=(1, 2)), hold())) == (
        "GpusBusy",
        "GPU 1 of --gpus 1,2 is not free",
        "'gpualloc status' shows the host; choose other GPUs or leave out --gpus",
        int(errors.ExitCode.BUSY),
    )


@pytest.mark.parametrize(
    "options", [{"count": 2, "require": "9"}, {"count": 2, "exclude": "9"}, {"gpus": (3, 9)}]
)
def test_a_gpu_the_host_does_not_have(host: Host, options: dict[str, Any]) -> None:
    assert refused(lambda: host.allocate(want(**options), hold())) == (
        "RequestError",
        "GPU 9 does not exist on this host (8 GPUs: 0..7)",
        "'gpualloc topo show' lists the GPUs",
        int(errors.ExitCode.USAGE),
    )


def test_a_host_without_mig_devices(host: Host) -> None:
    found = refused(lambda: host.allocate(want(mig="1g.10gb"), hold()))
    assert found[:2] == ("NoFeasiblePlacement", "this host has no MIG device")
    assert found[3] == int(errors.ExitCode.NO_PLACEMENT)


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        (
            "rign",
            (
                "unknown pattern 'rign': not one of ring, all, tree, star and not a file",
                "did you mean ring?",
            ),
        ),
        ("[[0, 1], [1, 0], [1, 2]]", ("names ranks 0 and 1 again", None)),
    ],
    ids=["unknown-name", "a-pair-twice"],
)
def test_a_bad_pattern(
    host: Host, tmp_path: Path, pattern: str, expected: tuple[str, str | None]
) -> None:
    """Refused at the front door, before the host is asked (whichever it is), and nothing is
    held."""
    if pattern.startswith("["):
        path = tmp_path / "pattern.json"
        path.write_text(pattern)
        pattern = str(path)
    name, message, hint, code = refused(lambda: host.allocate(want(3, pattern=pattern), hold()))
    assert (name, code) == ("PatternError", int(errors.ExitCode.USAGE))
    assert expected[0] in message and (expected[1] is None or hint == expected[1])
    assert host.release_leases([], mine=True).released == []


def test_a_pid_that_is_no_process(host: Host) -> None:
    gone = 2**22 + 1  # above the kernel's largest pid_max: no process has it
    assert refused(lambda: host.allocate(want(1), LeaseTerms(source="alloc", pid=gone))) == (
        "RequestError",
        f"no process with pid {gone}: the lease would end at once",
        "give --pid of a process that runs while the GPUs are used, or --hold",
        int(errors.ExitCode.USAGE),
    )


UNKNOWN = (
    "NoSuchLease",
    "no lease 0123456789ab",
    "'gpualloc status' lists the leases and their names; it may have ended",
    int(errors.ExitCode.NO_LEASE),
)


def test_an_unknown_lease(side: Side, host: Host) -> None:
    kept = host.allocate(want(1), hold())
    result = host.release_leases(["0123456789ab"])
    assert result.released == []
    assert [refusal(problem) for problem in result.problems] == [UNKNOWN]
    assert [refusal(p) for p in host.evict(["0123456789ab"]).problems] == [UNKNOWN]
    host.release("0123456789ab")  # quietly: a lease that went already
    host.confirm("0123456789ab")
    assert held_gpus(side.open()) == {kept.lease.id: kept.lease.indices}


def test_a_name_that_names_two_leases(host: Host) -> None:
    first = host.allocate(want(1), hold("twin"))
    second = host.allocate(want(1), hold("twin"))
    result = host.release_leases(["twin"])
    assert result.released == []
    (problem,) = result.problems
    assert refusal(problem) == (
        "NoSuchLease",
        f"'twin' names 2 leases: {first.lease.id} (twin, {pwd_name()}), "
        f"{second.lease.id} (twin, {pwd_name()})",
        problem.hint,
        int(errors.ExitCode.NO_LEASE),
    )


def test_garbage_collection_of_a_clean_ledger(host: Host) -> None:
    host.allocate(want(1), hold())
    report = host.collect_garbage()
    assert (report.reaped, report.dropped_waiters, report.expiries) == ([], [], [])
    assert (report.removed_lock_files, report.removed_temporary_files) == ([], [])
