"""``run``, ``alloc``, ``release``, ``status`` and ``gc`` end to end, in real subprocesses:
a job's GPUs, exit status and signals, GPUs used outside gpualloc, leases held and released,
NUMA binding on a topology that describes this machine.

Every test has its own state directory (``GPUALLOC_STATE_DIR`` under tmp_path, set by the
autouse fixture in conftest) and works on a bundled topology. Tests synchronise on events the
jobs report (a line on stdout, an exit), never on sleeps. ``alloc`` and ``release`` on both
ledgers alike, and between two users, are ``test_cli_leases.py``'s.
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
from pathlib import Path

import psutil
import pytest
from msgspec.structs import replace

from gpualloc.model import NumaNode
from gpualloc.model.cpuset import parse_cpulist
from gpualloc.topologies import load_bundled
from tests.child_processes import end, end_all, running
from tests.cli_harness import TIMEOUT_S, gpualloc, gpualloc_argv, shlex_join, status
from tests.job_scripts import REPORT


@pytest.fixture
def job(tmp_path: Path) -> Path:
    path = tmp_path / "job.py"
    path.write_text(REPORT)
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
