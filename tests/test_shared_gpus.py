"""Shared GPUs: ``--shareable`` leases, ``run --share`` best fit by memory
and by count, MPS or time slices, status, and eviction by the watcher, on bundled topologies.

dgx1-v100 has eight 32 GiB GPUs. Eviction between real Unix users is tested in
``test_shared_ledger.py``; fractions of a GPU, FGD and the request mix it weighs, and
``simulate --sharing`` in ``test_shared_gpu_fractions.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from msgspec.structs import replace

from gpualloc.errors import ExitCode, GpusBusy, NoFeasiblePlacement
from gpualloc.ledger.occupancy import Occupancy
from gpualloc.ledger.schema import Lease, LeasedGpu, Ledger
from gpualloc.model.mig import GIB
from gpualloc.model.share import LeasedShare, ShareRequest
from gpualloc.model.topology import GpuProcess
from gpualloc.placement.sharing.fit import choose_share
from gpualloc.topologies import load_bundled
from tests.child_processes import end, finish
from tests.cli_harness import TIMEOUT_S, gpualloc, gpualloc_argv, status
from tests.leases import lease_on

V100 = ("--topology", "dgx1-v100")


def shareable_lease(gpu: int, memory: int | None = None) -> Lease:
    return lease_on(gpu, shareable=True, memory_bytes=memory)


def shared_lease(gpu: int, tag: str) -> Lease:
    return lease_on(gpu, tag, share=LeasedShare(fraction=0.25))


def hold(cli, *args: str) -> dict:
    """``alloc --hold ARGS --format json`` on dgx1-v100 -> its JSON."""
    result = cli(*V100, "alloc", "--hold", "--format", "json", *args)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def planned(cli, *args: str) -> dict:
    """``run --share --dry-run --json ARGS -- true`` -> its JSON (fails on an error)."""
    result = cli(*V100, "run", "--share", "--dry-run", "--json", *args, "--", "true")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def gpu_of(plan: dict) -> int:
    return int(plan["environment"]["CUDA_VISIBLE_DEVICES"])


# ---- placement ---------------------------------------------------------------------------------


def test_a_shared_job_goes_to_the_shareable_lease_with_the_least_room_left(cli) -> None:
    big = hold(cli, "--shareable", "--mem", "24G", "--gpus", "5")  # 8 GiB left
    hold(cli, "--shareable", "--mem", "8G", "--gpus", "2")  # 24 GiB left
    hold(cli, "--gpus", "4")  # not shareable: never shared
    assert big["lease"]["shareable"] and big["lease"]["memory_bytes"] == 24 * GIB
    assert gpu_of(planned(cli, "--mem", "6G")) == 5  # best fit
    assert gpu_of(planned(cli, "--mem", "12G")) == 2  # too big for GPU 5
    assert gpu_of(planned(cli)) == 5  # no memory asked: still packs onto a GPU in use
    # Nothing in use has 30 GiB: a free GPU, never GPU 4.
    assert gpu_of(planned(cli, "--mem", "30G")) not in (2, 4, 5)
    explained = cli(*V100, "run", "--share", "--mem", "6G", "--dry-run", "--", "true").stdout
    assert "would run shared (time-sliced) on GPU 5 (held" in explained
    assert "best fit" in explained


def test_the_limit_of_shared_jobs_per_gpu_and_whole_gpu_requests() -> None:
    topology = load_bundled("dgx1-v100")
    ledger = Ledger(host="h")
    occupancy = Occupancy.build(topology, ledger, max_shared_jobs=2)
    first = choose_share(topology, occupancy, ShareRequest(gpu=3), 2)
    assert first.candidate.gpu == 3 and first.candidate.state == "free"
    # Two shared jobs on GPU 3: a third must go elsewhere, and --gpus 3 is busy (exit 10).
    ledger.leases += [shared_lease(3, "a"), shared_lease(3, "b")]
    occupancy = Occupancy.build(topology, ledger, max_shared_jobs=2)
    assert occupancy.state(3) == "shared" and 3 in occupancy.busy  # whole requests skip it
    assert choose_share(topology, occupancy, ShareRequest(), 2).candidate.gpu != 3
    with pytest.raises(GpusBusy) as busy:
        choose_share(topology, occupancy, ShareRequest(gpu=3), 2)
    assert "running 2 shared jobs already" in busy.value.message
    with pytest.raises(NoFeasiblePlacement, match="no shared jobs"):
        choose_share(topology, occupancy, ShareRequest(), 0)


def test_measured_memory_counts_when_it_exceeds_the_declared(tmp_path: Path) -> None:
    topology = load_bundled("dgx1-v100")
    ledger = Ledger(host="h", leases=[shareable_lease(0, memory=4 * GIB)])
    busy_process = GpuProcess(gpu=0, pid=4242, used_memory_bytes=28 * GIB)
    measured = Occupancy.build(topology, ledger, [busy_process])
    fits = ShareRequest(memory_bytes=3 * GIB, gpu=0)
    assert choose_share(topology, measured, fits, 4).candidate.free_bytes == 4 * GIB
    with pytest.raises(GpusBusy, match="too little memory on GPU 0"):
        choose_share(topology, measured, ShareRequest(memory_bytes=5 * GIB, gpu=0), 4)
    # NVML's figure for the whole GPU wins over the processes' sum.
    nvml = Occupancy.build(topology, ledger, [busy_process], memory_used={0: 2 * GIB})
    assert choose_share(topology, nvml, fits, 4).candidate.free_bytes == 28 * GIB


def test_requests_no_gpu_could_take_exit_9_and_busy_ones_exit_10(cli) -> None:
    too_big = cli(*V100, "run", "--share", "--mem", "40G", "--", "true")
    assert too_big.exit_code == ExitCode.NO_PLACEMENT
    assert "more than any GPU here has (32 GiB)" in too_big.stderr
    for gpu in range(8):
        hold(cli, "--gpus", str(gpu), *(["--shareable", "--mem", "30G"] if gpu == 6 else []))
    full = cli(*V100, "run", "--share", "--mem", "4G", "--", "true")
    assert full.exit_code == ExitCode.BUSY
    assert "too little memory on GPU 6 (held, 0 shared jobs, 2 GiB free)" in full.stderr
    assert "Traceback" not in full.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--background"], "--background applies to a shared job"),
        (["--sm-share", "30"], "--sm-share applies to a shared job"),
        (["--share", "--shareable"], "--share and --shareable"),
        (["--share", "-n", "2"], "-n does not apply to a shared job"),
        (["--share", "--gpus", "1,2"], "--gpus does not apply to a shared job"),
        (["--share", "--mig", "1g.5gb"], "--share applies to whole GPUs"),
        (["--share", "--mem", "lots"], "is not a memory size"),
    ],
)
def test_usage_errors_are_one_line_exit_2(cli, args: list[str], message: str) -> None:
    result = cli(*V100, "run", *args, "--", "true")
    assert result.exit_code == ExitCode.USAGE, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr


def test_inside_a_slurm_job_gpus_outside_it_are_never_shared() -> None:
    topology = load_bundled("dgx1-v100")
    ledger = Ledger(host="h", leases=[shared_lease(3, "a")])
    outside = frozenset(range(8)) - {0}
    occupancy = Occupancy.build(topology, ledger, outside=outside)
    assert choose_share(topology, occupancy, ShareRequest(), 4).candidate.gpu == 0
    with pytest.raises(NoFeasiblePlacement, match="GPU 3 cannot be shared"):
        choose_share(topology, occupancy, ShareRequest(gpu=3), 4)


# ---- running ------------------------------------------------------------------------------------

SHARED_JOB = """\
import json, os, sys
print(json.dumps({k: v for k, v in os.environ.items() if k.startswith(("CUDA_", "GPUALLOC_"))}),
      flush=True)
print(os.nice(0), flush=True)
sys.stdin.read()
"""


def _start(tmp_path: Path, *options: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    job = tmp_path / "shared_job.py"
    job.write_text(SHARED_JOB)
    return subprocess.Popen(
        gpualloc_argv("run", "--share", *options, "--", sys.executable, str(job)),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def test_a_shared_job_runs_is_listed_and_its_share_ends_with_it(tmp_path: Path) -> None:
    owner = gpualloc("alloc", "--hold", "--shareable", "--mem", "16G", "--gpus", "1")
    assert owner.returncode == 0, owner.stderr
    job = _start(tmp_path, "--mem", "8G", "--background")
    try:
        env = json.loads(job.stdout.readline())
        niceness = int(job.stdout.readline())
        assert env["CUDA_VISIBLE_DEVICES"] == "1" and env["GPUALLOC_SHARE"] == "time-sliced"
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env and niceness >= 10
        host = status()
        (share,) = [x for x in host["leases"] if x["share"]]
        assert share["id"] == env["GPUALLOC_LEASE_ID"] and share["memory_bytes"] == 8 * GIB
        assert share["share"]["fraction"] == 0.25 and share["share"]["background"]
        gpu1 = host["gpus"][1]
        assert gpu1["state"] == "held" and gpu1["shareable"]
        assert gpu1["shared_jobs"] == [share["id"]] and gpu1["memory_free_bytes"] == 8 * GIB
        assert gpu1["shared_fraction"] == 0.25
        table = gpualloc("status").stdout
        assert "Shared jobs" in table and "25%, 8 GiB, time-sliced, background" in table
        assert "[shareable: 1 shared job, 25% of it]" in table
    finally:
        finish(job, input="", timeout_s=TIMEOUT_S)  # its input closed: it ends
    assert job.returncode == 0
    assert [x for x in status()["leases"] if x["share"]] == []


def test_under_mps_the_job_gets_its_sm_share(tmp_path: Path) -> None:
    pipes = tmp_path / "mps"
    pipes.mkdir()
    os.mkfifo(pipes / "control")  # what nvidia-cuda-mps-control -d creates
    job = _start(tmp_path, "--sm-share", "30", env={"CUDA_MPS_PIPE_DIRECTORY": str(pipes)})
    try:
        env = json.loads(job.stdout.readline())
    finally:
        _, err = finish(job, input="", timeout_s=TIMEOUT_S)
    assert env["GPUALLOC_SHARE"] == "mps" and env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert "shared (mps)" in err and "warning" not in err
    # Without the daemon: time slices, and a warning that --sm-share does nothing.
    alone = _start(tmp_path, "--sm-share", "30", env={"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)})
    try:
        env = json.loads(alone.stdout.readline())
    finally:
        _, err = finish(alone, input="", timeout_s=TIMEOUT_S)
    assert env["GPUALLOC_SHARE"] == "time-sliced"
    assert "does not cap this one at its --sm-share" in err


EVICTABLE = "trap 'echo evicted; exit 7' TERM; echo started; while :; do sleep 0.05; done"


def test_the_owner_evicts_shared_jobs_and_keeps_the_lease() -> None:
    owner = gpualloc("alloc", "--hold", "--shareable", "--gpus", "2", "--format", "json")
    lease = json.loads(owner.stdout)["lease"]["id"]
    job = subprocess.Popen(
        gpualloc_argv("run", "--share", "--gpus", "2", "--", "sh", "-c", EVICTABLE),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the job leads its process group, as from a shell
    )
    try:
        assert job.stdout.readline().strip() == "started"
        started = time.monotonic()
        evicted = gpualloc("release", "--evict-shared", lease, "--grace", "5s")
        assert evicted.returncode == 0, evicted.stderr
        assert evicted.stdout.startswith("evicted GPU 2 shared by")
        out, _ = job.communicate(timeout=TIMEOUT_S)
    finally:
        end(job, group=True)
    assert job.returncode == 7 and out.strip() == "evicted"
    assert time.monotonic() - started < 5  # SIGTERM, not the grace period's SIGKILL
    host = status()
    assert [x["id"] for x in host["leases"]] == [lease]  # the owner's lease stays
    again = gpualloc("release", "--evict-shared", lease)
    assert again.returncode == 0 and "no shared job runs beside it" in again.stdout
    not_shareable = gpualloc("alloc", "--hold", "--gpus", "3", "--format", "json")
    plain = json.loads(not_shareable.stdout)["lease"]["id"]
    refused = gpualloc("release", "--evict-shared", plain)
    assert refused.returncode == ExitCode.USAGE and "is not shareable" in refused.stderr


def test_a_job_that_ignores_sigterm_is_killed_after_the_grace() -> None:
    owner = gpualloc("alloc", "--hold", "--shareable", "--gpus", "0", "--format", "json")
    lease = json.loads(owner.stdout)["lease"]["id"]
    stubborn = "trap '' TERM; echo started; while :; do sleep 0.05; done"
    job = subprocess.Popen(
        gpualloc_argv("run", "--share", "--", "sh", "-c", stubborn),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert job.stdout.readline().strip() == "started"
        evicted = gpualloc("release", "--evict-shared", "--mine", "--grace", "1s")
        assert evicted.returncode == 0, evicted.stderr
        job.communicate(timeout=TIMEOUT_S)
    finally:
        end(job, group=True)
    assert job.returncode == -signal.SIGKILL
    assert [x["id"] for x in status()["leases"]] == [lease]


def test_the_ledger_refuses_a_share_on_a_lease_that_does_not_share() -> None:
    from gpualloc.errors import LedgerError
    from gpualloc.ledger.store import LedgerTransaction

    txn = LedgerTransaction(Ledger(host="h", leases=[lease_on(0)]))
    with pytest.raises(LedgerError, match="which is not shared"):
        txn.add(shared_lease(0, "a"))
    txn = LedgerTransaction(Ledger(host="h", leases=[shared_lease(1, "a")]))
    with pytest.raises(LedgerError, match="runs shared job"):
        txn.add(replace(shareable_lease(1), id="ffff00000001"))
    txn.add(shared_lease(1, "b"))  # shares sit beside shares
    with pytest.raises(ValueError, match="exactly one whole GPU"):
        replace(shared_lease(1, "c"), gpus=(LeasedGpu(index=1), LeasedGpu(index=2)))


def test_on_a_live_host_nvml_memory_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake NVML of a DGX-1: GPU 3 has 30 GiB in use by a process gpualloc cannot see,
    GPU 2 runs a process outside gpualloc, GPU 6 cannot report its memory. A shared job asking
    4 GiB goes neither to GPU 3 (2 GiB free) nor to GPU 2 (nobody shared it); GPU 6 counts
    only what is declared (32 GiB free)."""
    from gpualloc.discovery import nvml as nvml_source
    from gpualloc.discovery.live import live_processes
    from tests.fake_nvml import FakeNvml

    topology = load_bundled("dgx1-v100")
    fake = FakeNvml.from_topology(topology)
    fake.gpus[3].memory_used_bytes = 30 * GIB
    fake.gpus[2].processes = [(os.getpid(), 512 * 2**20)]
    fake.gpus[6].unsupported.add("nvmlDeviceGetMemoryInfo")
    monkeypatch.setattr(nvml_source, "load_pynvml", lambda: fake)
    report = live_processes(topology)
    assert report.memory_used[3] == 30 * GIB and report.memory_used[2] == 512 * 2**20
    assert report.memory_used[0] == 0 and 6 not in report.memory_used
    occupancy = Occupancy.build(
        topology, Ledger(host="h"), report.processes, memory_used=report.memory_used
    )
    assert occupancy.memory_used[3] == 30 * GIB
    with pytest.raises(GpusBusy, match=r"GPU 3 \(free, 0 shared jobs, 2 GiB free\)"):
        choose_share(topology, occupancy, ShareRequest(memory_bytes=4 * GIB, gpu=3), 4)
    choice = choose_share(topology, occupancy, ShareRequest(memory_bytes=4 * GIB), 4)
    ranked = [choice.candidate, *choice.runners_up]
    assert [c.gpu for c in ranked] == [0, 1, 4, 5, 6, 7]
    assert {c.free_bytes for c in ranked} == {32 * GIB}


def test_a_shared_job_waits_in_the_queue_for_room(tmp_path: Path) -> None:
    owner = gpualloc("alloc", "--hold", "--shareable", "--mem", "30G", "--gpus", "4")
    assert owner.returncode == 0, owner.stderr
    for gpu in (0, 1, 2, 3, 5, 6, 7):
        assert gpualloc("alloc", "--hold", "--gpus", str(gpu)).returncode == 0
    waiting = subprocess.Popen(
        gpualloc_argv("run", "--share", "--mem", "8G", "--wait", "--", "printenv", "GPUALLOC_GPUS"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not status()["queue"]:
            assert time.monotonic() < deadline and waiting.poll() is None
            time.sleep(0.1)
        (entry,) = status()["queue"]
        assert entry["request"]["share"]["memory_bytes"] == 8 * GIB
        assert "a shared place with 8 GiB" in gpualloc("status").stdout
        assert gpualloc("release", "--mine").returncode == 0  # room everywhere now
        out, err = waiting.communicate(timeout=TIMEOUT_S)
    finally:
        end(waiting)
    assert waiting.returncode == 0, err
    assert out.strip().isdigit()


def test_eviction_marks_the_shared_jobs_beside_a_lease_in_the_ledger() -> None:
    """What ``release --evict-shared`` writes, in-process (the tests above run the watchers that
    act on it): the shared job beside the owner's ``--shareable`` lease is marked with the
    evicter and the grace, and a lease that shares nothing is refused."""
    from gpualloc.host.lease_terms import LeaseTerms
    from gpualloc.host.local import LocalHost
    from gpualloc.ledger.shared_files import owner_name
    from gpualloc.model.request import JobRequest
    from gpualloc.placement.mapa.patterns import build_pattern
    from gpualloc.placement.want import Want

    host = LocalHost.open(load_bundled("dgx1-v100"))
    pid = os.getpid()
    one_gpu = JobRequest(1, build_pattern("ring", 1), sensitive=False)
    owner = host.allocate(
        Want(one_gpu, explicit=(2,)), LeaseTerms(source="alloc", pid=pid, shareable=True)
    ).lease
    plain = host.allocate(Want(one_gpu, explicit=(5,)), LeaseTerms(source="alloc", pid=pid))
    shared = host.allocate(
        Want(one_gpu, share=ShareRequest(gpu=2)), LeaseTerms(source="run", pid=pid)
    ).lease
    result = host.evict([owner.id, plain.lease.id], grace_s=5.0)
    assert [x.id for x in result.released] == [shared.id]
    assert [type(p).__name__ for p in result.problems] == ["RequestError"]
    marked = host.snapshot().ledger.find(shared.id)
    assert marked is not None and marked.share is not None
    assert (marked.share.evict_by, marked.share.evict_grace_s) == (owner_name(os.geteuid()), 5.0)
