"""Shared GPUs: ``--shareable`` leases, ``run --share`` best fit by memory
and by count, MPS or time slices, status, and eviction by the watcher, on bundled topologies.

dgx1-v100 has eight 32 GiB GPUs. Eviction between real Unix users is tested in
``test_shared_ledger.py``.
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


# ---- simulate --sharing ------------------------------------------------------------------------


def _simulated(topology: str, jobs: list, **options) -> dict[str, tuple[float, float, bool]]:
    from gpualloc.simulate.engine import SimOptions, simulate

    result = simulate(load_bundled(topology), jobs, SimOptions(runtime="fixed", **options))
    return {r.job.id: (round(r.start_s, 6), round(r.end_s, 6), r.shared) for r in result.jobs}


def test_simulated_sharing_trades_time_slices_for_an_earlier_start() -> None:
    from gpualloc.simulate.trace import SimJob

    jobs = [SimJob("big", 0.0, 4, 100.0, True), SimJob("small", 0.0, 1, 50.0, False)]
    # Whole GPUs: the small job waits for the big one.
    assert _simulated("nvlink-pairs-4gpu", jobs) == {
        "big": (0, 100, False),
        "small": (100, 150, False),
    }
    # Compute-bound (U = 1): side by side at half pace; the big job finishes alone.
    assert _simulated("nvlink-pairs-4gpu", jobs, sharing=2) == {
        "big": (0, 150, False),
        "small": (0, 100, True),
    }
    # Half-busy jobs fill each other's idle time: nobody slows.
    assert _simulated("nvlink-pairs-4gpu", jobs, sharing=2, gpu_busy=0.5) == {
        "big": (0, 100, False),
        "small": (0, 50, True),
    }


def test_simulated_sharing_keeps_to_the_limit_per_gpu() -> None:
    from gpualloc.simulate.trace import SimJob

    jobs = [SimJob(name, 0.0, 1, 60.0, False) for name in ("a", "b", "c")]
    assert _simulated("single-gpu", jobs, sharing=2) == {
        "a": (0, 120, True),
        "b": (0, 120, True),
        "c": (120, 180, True),
    }


def test_simulate_sharing_on_the_command_line(cli) -> None:
    args = ("--topology", "dgx1-v100", "simulate", "--generate", "mixed:jobs=40", "--json")
    result = cli(*args, "--sharing", "2", "--gpu-busy", "0.5")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    summary = data["policies"]["mapa"]["summary"]
    assert data["sharing"] == 2 and data["gpu_busy"] == 0.5
    assert summary["shared_jobs"] == summary["one_gpu_jobs"]["jobs"] > 0
    refused = cli(*args, "--gpu-busy", "0.5")
    assert refused.exit_code != 0 and "--gpu-busy applies to --sharing" in refused.stderr


def test_inside_a_slurm_job_gpus_outside_it_are_never_shared() -> None:
    topology = load_bundled("dgx1-v100")
    ledger = Ledger(host="h", leases=[shared_lease(3, "a")])
    outside = frozenset(range(8)) - {0}
    occupancy = Occupancy.build(topology, ledger, outside=outside)
    assert choose_share(topology, occupancy, ShareRequest(), 4).candidate.gpu == 0
    with pytest.raises(NoFeasiblePlacement, match="GPU 3 cannot be shared"):
        choose_share(topology, occupancy, ShareRequest(gpu=3), 4)


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


# ---- fractions of a GPU --------------------------------------------------------------------------


def test_a_gpu_takes_shared_jobs_while_their_parts_sum_to_at_most_one() -> None:
    topology = load_bundled("dgx1-v100")
    ledger = Ledger(host="h")
    ledger.leases += [lease_on(3, "a", share=LeasedShare(fraction=0.6, sm_percent=60))]
    occupancy = Occupancy.build(topology, ledger, max_shared_jobs=8)
    fits = choose_share(topology, occupancy, ShareRequest(sm_percent=40), 8)
    assert fits.candidate.gpu == 3 and fits.candidate.used_fraction == 0.6
    # 60 % more does not fit beside 60 %: it goes to another GPU, and GPU 3 named is busy.
    assert choose_share(topology, occupancy, ShareRequest(sm_percent=60), 8).candidate.gpu != 3
    with pytest.raises(GpusBusy) as busy:
        choose_share(topology, occupancy, ShareRequest(sm_percent=60, gpu=3), 8)
    assert "too little memory or GPU share on GPU 3" in busy.value.message
    assert "60% of it shared" in busy.value.message


def test_simulated_fractions_pack_without_slowing_each_other() -> None:
    from gpualloc.simulate.trace import SimJob

    jobs = [
        SimJob("a", 0.0, 1, 60.0, False, gpu_fraction=0.5),
        SimJob("b", 0.0, 1, 60.0, False, gpu_fraction=0.5),
        SimJob("c", 0.0, 1, 60.0, False, gpu_fraction=0.3),
    ]
    # Half and half share the one GPU at full pace; 0.3 more waits for room.
    assert _simulated("single-gpu", jobs, sharing=8) == {
        "a": (0, 60, True),
        "b": (0, 60, True),
        "c": (60, 120, True),
    }


def _two_shared_gpus(first: int, second: int) -> Ledger:
    """GPU 0 and GPU 1 shared, ``first`` and ``second`` per cent of them held; the rest held
    whole."""
    ledger = Ledger(host="h")
    ledger.leases += [
        lease_on(0, "a", share=LeasedShare(fraction=first / 100, sm_percent=first)),
        lease_on(1, "b", share=LeasedShare(fraction=second / 100, sm_percent=second)),
    ]
    ledger.leases += [lease_on(g, "c") for g in range(2, 8)]
    return ledger


def test_fgd_keeps_room_for_the_workloads_common_asks_where_best_fit_does_not() -> None:
    """Half the GPU is the common ask: a 30 % job should not leave a half-free GPU with 20 %."""
    topology = load_bundled("dgx1-v100")
    ledger = _two_shared_gpus(50, 65)  # 50 % and 35 % free
    occupancy = Occupancy.build(topology, ledger, max_shared_jobs=8)
    mix = {(1, 0.5): 0.8, (1, 0.3): 0.2}
    request = ShareRequest(sm_percent=30)
    fgd = choose_share(topology, occupancy, request, 8, strategy="fgd", mix=mix)
    assert fgd.candidate.gpu == 1  # 35 % was too little for a half anyway: fill it
    assert "expected fragmentation grows least" in fgd.reason
    best = choose_share(topology, occupancy, request, 8, strategy="best-fit", mix=mix)
    assert best.candidate.gpu == 1 and "least of it left" in best.reason  # 5 % left there
    first = choose_share(topology, occupancy, request, 8, strategy="first-fit")
    assert first.candidate.gpu == 0
    # A 20 % job: best fit fills the 35 % GPU's gap to 15 %; FGD too (neither 35 nor 15 %
    # holds a half), but a 50 % job may only go to GPU 0, where both agree.
    half = ShareRequest(sm_percent=50)
    assert choose_share(topology, occupancy, half, 8, strategy="fgd", mix=mix).candidate.gpu == 0


def test_expected_fragmentation_as_the_fgd_paper_defines_it() -> None:
    from gpualloc.placement.sharing.fragmentation import (
        expected_fragmentation,
        fragmentation,
        growth,
    )

    free = [1.0, 0.5, 0.2, 0.0]
    assert fragmentation(free, (1, 0.5)) == pytest.approx(0.2)  # 0.2 < 0.5: unusable
    assert fragmentation(free, (1, 1.0)) == pytest.approx(0.7)  # partial GPUs, for a whole one
    assert fragmentation(free, (2, 1.0)) == pytest.approx(1.7)  # fits nowhere: all of it
    mix = {(1, 0.5): 0.5, (1, 1.0): 0.5}
    assert expected_fragmentation(free, mix) == pytest.approx(0.45)
    # 0.3 of the half-free GPU leaves 0.2, a fragment for halves (0.4 in all) but less of it for
    # a whole GPU (0.4): 0.40 in expectation, down 0.05. 0.3 of the free GPU leaves no whole
    # GPU, so all 1.4 free is fragment for one: 0.80, up 0.35.
    assert growth(free, 1, 0.3, mix) == pytest.approx(-0.05)
    assert growth(free, 0, 0.3, mix) == pytest.approx(0.35)
    assert growth(free, 2, 0.2, mix) == pytest.approx(-0.2)  # filling a fragment removes it


def test_simulate_takes_a_share_placement(cli) -> None:
    args = ("--topology", "dgx1-v100", "simulate", "--generate", "mixed:jobs=30", "--json")
    assert cli(*args, "--sharing", "2", "--share-placement", "first-fit").exit_code == 0
    bad = cli(*args, "--sharing", "2", "--share-placement", "random")
    assert bad.exit_code == ExitCode.USAGE and "not one of fgd, best-fit" in bad.stderr


# ---- the live request mix ------------------------------------------------------------------------


def test_the_request_mix_forgets_old_requests_and_needs_enough_of_them() -> None:
    from gpualloc.ledger.stats import MIX_MEMORY, MIX_MIN_REQUESTS, LedgerStats

    stats = LedgerStats()
    for _ in range(MIX_MIN_REQUESTS):
        stats.observe_request(1, 0.5)
    assert stats.recent_mix()[0] is None  # too few to trust: 20, decayed, weigh under 20
    stats.observe_request(2, 1.0)
    stats.observe_request(2, 1.0)
    mix, weight = stats.recent_mix()
    assert MIX_MIN_REQUESTS < weight < MIX_MIN_REQUESTS + 2
    assert mix is not None and set(mix) == {(1, 0.5), (2, 1.0)}
    assert sum(mix.values()) == pytest.approx(1.0)
    assert mix[(2, 1.0)] > 1 / MIX_MIN_REQUESTS  # the newest weighs most
    for _ in range(7 * MIX_MEMORY):
        stats.observe_request(1, 0.25)
    mix, _ = stats.recent_mix()
    assert mix is not None and mix[(1, 0.25)] > 0.95  # the old asks have faded
    assert (2, 1.0) not in mix  # ... and one that decays below the floor is dropped
    assert stats.recent_mix()[1] == pytest.approx(MIX_MEMORY, rel=0.06)


def test_a_sliver_of_a_gpu_counts_as_a_hundredth_and_the_ledger_stays_readable() -> None:
    from gpualloc.ledger.store import ledger_text, parse_ledger

    ledger = Ledger(host="h")
    ledger.stats.observe_request(1, 100 * 1024**2 / (80 * GIB))  # --mem 100M on 80 GB: 0.1 %
    ledger.stats.observe_request(1, 1.0)
    assert ledger.stats.request_mix == {"1:0.01": pytest.approx(0.995), "1:1": 1.0}
    assert parse_ledger(ledger_text(ledger, 0), "ledger.json").stats == ledger.stats


def test_a_ledger_with_a_malformed_request_mix_is_refused() -> None:
    from gpualloc.errors import LedgerError
    from gpualloc.ledger.store import parse_ledger

    good = '{"schema_version": 6, "host": "h", "stats": {"request_mix": {"1:0.46": 3.5}}}'
    assert parse_ledger(good, "ledger.json").stats.request_mix == {"1:0.46": 3.5}
    bad = good.replace("1:0.46", "one half")
    with pytest.raises(LedgerError, match="request_mix"):
        parse_ledger(bad, "ledger.json")


def test_each_lease_adds_its_task_type_to_the_ledgers_mix() -> None:
    from gpualloc.host.lease_terms import LeaseTerms
    from gpualloc.host.local import LocalHost
    from gpualloc.model.request import JobRequest
    from gpualloc.placement.mapa.patterns import build_pattern
    from gpualloc.placement.want import Want

    host = LocalHost.open(load_bundled("dgx1-v100"))
    pid = os.getpid()
    two = JobRequest(2, build_pattern("ring", 2), sensitive=False)
    one = JobRequest(1, build_pattern("ring", 1), sensitive=False)
    host.allocate(Want(two), LeaseTerms(source="alloc", pid=pid))
    shared = host.allocate(
        Want(one, share=ShareRequest(sm_percent=30)), LeaseTerms(source="run", pid=pid)
    )
    assert shared.lease.share is not None
    mix = host.snapshot().ledger.stats.request_mix
    assert mix == {"1:0.3": 1.0, "2:1": pytest.approx(1 - 1 / 200)}


def test_fgd_weighs_the_hosts_recent_requests_once_there_are_enough() -> None:
    topology = load_bundled("dgx1-v100")
    ledger = _two_shared_gpus(40, 30)  # 60 % and 70 % free
    request = ShareRequest(sm_percent=20)
    fresh = Occupancy.build(topology, ledger, max_shared_jobs=8)
    assert fresh.share_mix is None and "Alibaba trace's mix" in fresh.share_mix_source
    # This host's shared jobs ask half a GPU: a 20 % job belongs where it leaves 50 % (GPU 1),
    # not 40 % (GPU 0), where no such job fits; whole-GPU asks see both as fragments already.
    for _ in range(30):
        ledger.stats.observe_request(1, 0.5)
        ledger.stats.observe_request(2, 1.0)
    known = Occupancy.build(topology, ledger, max_shared_jobs=8)
    assert known.share_mix is not None and set(known.share_mix) == {(1, 0.5), (2, 1.0)}
    choice = choose_share(
        topology, known, request, 8, mix=known.share_mix, mix_source=known.share_mix_source
    )
    assert choice.candidate.gpu == 1
    assert "grows least there (-0.100 GPU, weighed by this host's recent requests (52 by" in (
        choice.reason
    )
    best = choose_share(topology, known, request, 8, strategy="best-fit")
    assert best.candidate.gpu == 0  # best fit takes the fuller GPU and strands 40 %


def test_dry_run_says_which_mix_fgd_weighed(cli) -> None:
    shown = cli(*V100, "run", "--share", "--sm-share", "30", "--dry-run", "--", "true")
    assert shown.exit_code == 0, shown.stderr
    assert (
        "weighed by the Alibaba trace's mix (this host has recorded 0 of the 20 requests its own "
        "mix needs)" in shown.stdout
    )
