"""Verified launch: a job's processes are matched to its lease, and a job
on a GPU its lease does not hold, or a stranger on a leased GPU, is flagged by ``status`` and by
the verifier ``run`` leaves beside the job; fault injection on the fake NVML and on a recorded
topology whose file declares where the job runs, through a broker too."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from gpualloc.discovery import nvml as nvml_source
from gpualloc.discovery.live import live_processes
from gpualloc.launcher.verify import VerifyTerms, verify
from gpualloc.ledger.attribution import attribute, process_lineage
from gpualloc.ledger.schema import Lease, LeasedGpu
from gpualloc.model.topology import GpuProcess
from gpualloc.topologies import load_bundled
from tests.broker_harness import RunningBroker, broker_leases, clean_env, until
from tests.child_processes import end, finish, stderr_until
from tests.cli_harness import TIMEOUT_S, gpualloc_argv
from tests.fake_nvml import FakeNvml
from tests.job_scripts import DECLARE

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=timezone.utc)


def lease(tag: str, gpus: tuple[int, ...], *, pid: int | None = None, **terms) -> Lease:
    return Lease(
        id=tag * 12,
        gpus=tuple(LeasedGpu(index=g) for g in gpus),
        uid=1000,
        user=terms.pop("user", "alice"),
        pid=pid,
        hold=pid is None,
        created=NOW,
        source="run" if pid else "alloc",
        **terms,
    )


def on(gpu: int, pid: int, user: str | None = None) -> GpuProcess:
    return GpuProcess(gpu=gpu, pid=pid, name="python", user=user)


def test_processes_belong_to_the_nearest_lease_and_mismatches_are_found() -> None:
    shell = lease("a", (0, 1), pid=100)  # alloc from shell 100
    inner = lease("b", (4,), pid=150)  # gpualloc run from that shell: its own lease
    held = lease("c", (2,), user="bob")  # --hold: bob's processes on GPU 2 are its job's
    group = lease("d", (6,), pid=600, process_group=600)
    second = lease("e", (7,))  # alice's --hold: the alloc shell's job may use it too
    lineage = {
        101: (100, 101, 100, 1),
        102: (100, 102, 100, 1),
        151: (100, 151, 150, 100, 1),
        200: (200, 200, 1),
        300: (300, 300, 1),
        301: (301, 301, 1),
        601: (600, 601, 1),  # a daemonised child, reparented but still in the job's group
        103: (100, 103, 100, 1),
    }
    found = attribute(
        [shell, inner, held, group, second],
        [
            on(0, 101),
            on(5, 102),  # the alloc shell's job on GPU 5: misplaced
            on(4, 151),
            on(1, 200, "carol"),  # carol on alice's GPU 1: intruder
            on(2, 300, "bob"),
            on(2, 301, "carol"),  # carol on bob's held GPU 2: intruder
            on(6, 601),
            on(7, 103, "alice"),  # the alloc shell's job on alice's held GPU 7: hers
        ],
        lineage=lineage,
    )
    assert {pid: x.id for pid, x in found.owners.items()} == {
        101: shell.id,
        102: shell.id,
        151: inner.id,  # not the alloc shell's, though it descends from it
        300: held.id,
        601: group.id,
        103: second.id,
    }
    assert [(m.lease.id, m.process.pid) for m in found.misplaced] == [(shell.id, 102)]
    assert [(i.process.gpu, i.process.pid) for i in found.intruders] == [(1, 200), (2, 301)]
    lines = found.lines()
    assert lines[0] == (
        f"lease {shell.id} (alice): pid 102 (python) runs on GPU 5, which the lease does not "
        "hold (it holds GPU 0-1)"
    )
    assert lines[1] == (
        f"GPU 1, held by lease {shell.id} (alice), also runs pid 200 (python, carol), which is "
        "not that lease's job"
    )


def test_lineage_is_read_from_proc() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        group, pid, parent, *_ = process_lineage(child.pid)
        assert (group, pid, parent) == (os.getpgrp(), child.pid, os.getpid())
    finally:
        end(child)
    assert process_lineage(child.pid) == ()


# ---- the fake NVML ----------------------------------------------------------------------------


@pytest.fixture
def job() -> subprocess.Popen:
    process = subprocess.Popen(["sleep", "60"])
    yield process
    end(process)


def test_a_job_on_a_gpu_it_does_not_hold_is_flagged_from_nvml(
    monkeypatch: pytest.MonkeyPatch, job: subprocess.Popen
) -> None:
    topology = load_bundled("dgx1-v100")
    fake = FakeNvml.from_topology(topology)
    fake.gpus[0].processes = [(job.pid, 1 << 30)]
    fake.gpus[3].processes = [(job.pid, 1 << 30)]  # the job also opened GPU 3
    monkeypatch.setattr(nvml_source, "load_pynvml", lambda: fake)
    mine = lease("e", (0, 1), pid=job.pid)
    found = attribute([mine], live_processes(topology).processes)
    assert [(m.lease.id, m.process.gpu) for m in found.misplaced] == [(mine.id, 3)]
    said: list[str] = []
    verdict = verify(
        mine,
        job.pid,
        lambda: live_processes(topology).processes,
        VerifyTerms(grace_s=5, action="kill", poll_s=0.05),
        say=said.append,
        leads_group=False,
    )
    assert verdict == "misplaced" and "runs on GPU 3, which the lease does not hold" in said[0]
    assert "ending it (verify.action = kill)" in said[1]
    assert job.wait(timeout=TIMEOUT_S) == -signal.SIGTERM


def half_written() -> list[GpuProcess]:
    from gpualloc.errors import TopologyParseError

    raise TopologyParseError("unexpected end of the file", source="host.json")


def test_the_verifier_passes_a_job_that_keeps_to_its_gpus(
    monkeypatch: pytest.MonkeyPatch, job: subprocess.Popen
) -> None:
    topology = load_bundled("dgx1-v100")
    fake = FakeNvml.from_topology(topology)
    monkeypatch.setattr(nvml_source, "load_pynvml", lambda: fake)
    mine = lease("f", (0, 1), pid=job.pid)
    shared = lease("g", (1,), pid=os.getpid())  # another job on GPU 1, in the ledger
    terms = VerifyTerms(grace_s=0.3, poll_s=0.05)

    def check(**options) -> str:
        return verify(
            mine,
            job.pid,
            lambda: live_processes(topology).processes,
            terms,
            say=said.append,
            leads_group=False,
            **options,
        )

    said: list[str] = []
    assert check() == "unseen" and said == []  # no CUDA yet within the grace period
    assert verify(mine, job.pid, half_written, terms, say=said.append, leads_group=False) == (
        "unseen"  # a look that fails (a topology file caught mid-write): it looks on, not dies
    )
    fake.gpus[1].processes = [(job.pid, None)]
    assert check() == "verified" and said == []
    fake.gpus[1].processes.append((os.getpid(), None))
    assert check(leases=lambda: [mine, shared]) == "verified" and said == []
    assert check() == "verified" and "also runs pid" in said[0]  # not known as a lease's
    end(job)
    assert check() == "ended"


# ---- end to end, on a recorded topology that declares where the job runs ---------------------


@pytest.fixture
def host_file(tmp_path: Path) -> Path:
    path = tmp_path / "host.json"
    path.write_text(load_bundled("nvlink-pairs-4gpu").to_json())
    return path


def _start(host_file: Path, tmp_path: Path, *gpus: str, env: dict[str, str]) -> subprocess.Popen:
    script = tmp_path / "declare.py"
    script.write_text(DECLARE)
    argv = gpualloc_argv(
        "run",
        "--gpus",
        "0,1",
        "--",
        sys.executable,
        str(script),
        str(host_file),
        *gpus,
        topology=str(host_file),
    )
    return subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )


def _status(host_file: Path, *args: str) -> subprocess.CompletedProcess:
    argv = gpualloc_argv("status", *args, topology=str(host_file))
    return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S)


def test_status_flags_a_job_outside_its_lease_and_a_stranger_inside_it(
    host_file: Path, tmp_path: Path
) -> None:
    job = _start(host_file, tmp_path, "0", "2", env={"GPUALLOC_VERIFY_GRACE": "off"})
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        pid = int(job.stdout.readline())
        data = json.loads(host_file.read_text())
        data["processes"].append({"gpu": 1, "pid": stranger.pid, "name": "sleep", "user": "eve"})
        host_file.write_text(json.dumps(data))
        host = json.loads(_status(host_file, "--json").stdout)
        (mine,) = host["leases"]
        assert [(p["gpu"], p["pid"]) for p in mine["misplaced"]] == [(2, pid)]
        assert [p["pid"] for p in host["gpus"][1]["intruders"]] == [stranger.pid]
        assert host["gpus"][0]["intruders"] == [] and host["gpus"][2]["state"] == "foreign"
        table = _status(host_file).stdout
        assert f"pid {pid} (job) of lease {mine['id']}, which does not hold this GPU" in table
        assert f"ALSO USED BY pid {stranger.pid} (sleep, eve), not the lease's job" in table
        assert f"MISMATCH: lease {mine['id']}" in table and "runs on GPU 2" in table
    finally:
        end(stranger)
        finish(job, input="", timeout_s=TIMEOUT_S)  # its input closed: it ends


@pytest.mark.parametrize("action", ["warn", "kill"])
def test_run_warns_of_or_ends_a_job_that_leaves_its_gpus(
    host_file: Path, tmp_path: Path, action: str
) -> None:
    job = _start(
        host_file,
        tmp_path,
        "1",
        "3",
        env={"GPUALLOC_VERIFY_GRACE": "60", "GPUALLOC_VERIFY_ACTION": action},
    )
    try:
        job.stdout.readline()
        said = stderr_until(job, "verify.action")
        assert "runs on GPU 3, which the lease does not hold (it holds GPU 0-1)" in said
        if action == "kill":
            assert "ending it (verify.action = kill)" in said
            finish(job, timeout_s=TIMEOUT_S)
            assert job.returncode == -signal.SIGTERM
        else:
            assert 'set verify.action = "kill" to end such jobs' in said
            assert job.poll() is None  # only warned: the job runs on
    finally:
        if job.returncode is None:
            finish(job, input="", timeout_s=TIMEOUT_S)


TOPOLOGY = "nvlink-pairs-4gpu"
"""The host of the job that runs through a broker."""


@pytest.mark.slow
def test_a_brokered_job_that_leaves_its_gpus_is_ended_by_its_verifier() -> None:
    if os.geteuid() != 0:
        pytest.skip("the broker's tests run it as root (CI runs as root)")
    from gpualloc.topologies import load_bundled

    broker = RunningBroker(TOPOLOGY)
    host_file = broker.directory / "host.json"
    host_file.write_text(load_bundled(TOPOLOGY).to_json())
    broker.topology = str(host_file)
    broker.start()
    script = broker.directory / "declare.py"
    script.write_text(DECLARE)
    env = {
        **clean_env(), "GPUALLOC_BROKER": str(broker.socket),
        "GPUALLOC_VERIFY_GRACE": "60", "GPUALLOC_VERIFY_ACTION": "kill",
    }  # fmt: skip
    run = ["run", "--gpus", "0,1", "--"]
    argv = [
        sys.executable,
        "-m",
        "gpualloc",
        *run,
        sys.executable,
        str(script),
        str(host_file),
        "3",
    ]
    job = subprocess.Popen(
        argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert job.stdout is not None and job.stdout.readline().strip()  # it declared itself
        err = stderr_until(job, "verify.action")
        assert "runs on GPU 3, which the lease does not hold (it holds GPU 0-1)" in err, err
        assert "ending it (verify.action = kill)" in err
        job.wait(timeout=30)
        assert job.returncode == -15
        until(lambda: not broker_leases(broker), "the ended job's lease to go", 5)
    finally:
        end(job)
        broker.stop()
        shutil.rmtree(broker.directory, ignore_errors=True)


# ---- gpualloc doctor, on the fake NVML --------------------------------------------------------


@pytest.fixture
def fake_host(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    """This host, as the fake NVML describes it: a DGX-1 with every link up."""
    from gpualloc.discovery import health

    fake = FakeNvml.from_topology(load_bundled("dgx1-v100"))
    monkeypatch.setattr(nvml_source, "load_pynvml", lambda: fake)
    monkeypatch.setattr(health, "read_kernel_log", lambda: "")
    return fake


def test_doctor_finds_nothing_wrong_with_a_healthy_host(cli, fake_host: FakeNvml) -> None:
    result = cli("doctor")
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "no problems found" in result.stdout
    data = json.loads(cli("doctor", "--json").stdout)
    assert data["ok"] and data["links_source"] == "nvml"
    assert {f["check"] for f in data["findings"]} == {"ledger", "nvlink", "pcie", "p2p", "lease"}
    assert "16 NVLink connections with every link up" in result.stdout


def test_doctor_flags_a_link_down_a_gpu_at_x8_p2p_off_and_a_job_off_its_gpus(
    cli, fake_host: FakeNvml, job: subprocess.Popen
) -> None:
    from gpualloc.errors import ExitCode

    assert cli("topo", "show").exit_code == 0  # discovered (and cached) with every link up
    pair = cli("alloc", "--gpus", "0,3", "--pid", str(job.pid), "--format", "json")
    lease_id = json.loads(pair.stdout)["lease"]["id"]
    assert cli("alloc", "--gpus", "4,7", "--hold").exit_code == 0
    fake_host.gpus[0].nvlinks_down = {2}  # one of the two NVLinks between GPU 0 and 3
    fake_host.gpus[2].pcie_width_now = 8
    fake_host.gpus[5].pcie_generation_now = 1  # idle: a note, not a problem
    fake_host.p2p[(0, 3, 0)] = 4  # NVML_P2P_STATUS_DISABLED_BY_REGKEY
    fake_host.p2p[(4, 7, 2)] = 5  # over NVLink: NVML_P2P_STATUS_NOT_SUPPORTED
    fake_host.gpus[6].processes = [(job.pid, 1 << 30)]  # the lease's job, on GPU 6
    result = cli("doctor", "--json")
    assert result.exit_code == ExitCode.CHECK_FAILED
    problems = {
        (f["check"], f["where"]): f["detail"]
        for f in json.loads(result.stdout)["findings"]
        if f["severity"] == "problem"
    }
    assert set(problems) == {
        ("nvlink", "GPU 0,3"),
        ("pcie", "GPU 2"),
        ("p2p", "GPU 0,3"),
        ("p2p", "GPU 4,7"),
        ("lease", f"lease {lease_id}"),
    }
    assert problems["nvlink", "GPU 0,3"].startswith("1 of 2 NVLinks to GPU 3 are up")
    assert problems["pcie", "GPU 2"].startswith("PCIe link at x8, below its x16")
    assert "is off (DR: disabled by registry key)" in problems["p2p", "GPU 0,3"]
    assert "peer-to-peer over NVLink is off (NS" in problems["p2p", "GPU 4,7"]
    assert "runs on GPU 6, which the lease does not hold" in problems["lease", f"lease {lease_id}"]
    table = cli("doctor")
    assert "5 problems found" in table.stdout
    assert "PCIe generation 1 of 3 now: idle GPUs lower it" in table.stdout


def test_nvidia_smi_link_outputs_are_read() -> None:
    """The fallback without NVML: ``topo -p2p r`` (recorded on two GeForce boards, where the
    driver turns peer-to-peer off) and ``--query-gpu=pcie.link.*``."""
    from gpualloc.discovery.links import parse_p2p_matrix, parse_pcie_query
    from tests.recordings import recorded

    assert parse_p2p_matrix(recorded("p2p_rw_2x-rtx5090_gns.txt")) == {(0, 1): "GNS"}
    (x16, x8) = parse_pcie_query("0, 1, 4, 16, 16\n1, 4, 4, 8, 16\n2, [N/A], [N/A], [N/A], 16\n")[
        :2
    ]
    assert (x16.pcie_generation, x16.pcie_width, x8.pcie_width, x8.pcie_width_max) == (1, 16, 8, 16)


def test_doctor_reads_nvidia_smi_where_nvml_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The recorded ``nvlink -s`` of three RTX A6000s, GPU 0 and 1 bridged (NV4), GPU 2 not:
    all is well; with one of GPU 0's links gone inactive, it is flagged."""
    from gpualloc.checkup import link_findings
    from gpualloc.discovery import links as links_source
    from gpualloc.discovery import smi
    from gpualloc.discovery.recorded import load_topology_file
    from tests.recordings import RECORDED, recorded

    pynvml_missing = FakeNvml([], {})
    pynvml_missing.init_error = __import__("pynvml").NVMLError_LibraryNotFound()
    monkeypatch.setattr(nvml_source, "load_pynvml", lambda: pynvml_missing)
    topology = load_topology_file(RECORDED / "3x-rtx-a6000_one-nvlink-bridge_topo.txt")
    status = recorded("nvlink_status_3x-rtx-a6000_one-bridge_inactive.txt")
    outputs = {
        "nvlink": status,
        "topo": (
            " \tGPU0\tGPU1\tGPU2\t\n GPU0\tX\tOK\tOK\t\n GPU1\tOK\tX\tOK\t\n GPU2\tOK\tOK\tX\t\n"
        ),
        "--query-gpu": "0, 4, 4, 16, 16\n1, 4, 4, 16, 16\n2, 1, 4, 16, 16\n",
    }
    first = {"nvlink": "nvlink", "topo": "topo"}
    monkeypatch.setattr(
        smi, "run_nvidia_smi", lambda *args: outputs[first.get(args[0], args[0].split("=")[0])]
    )
    now = links_source.read_links(topology, [(0, 1), (0, 2), (1, 2)])
    assert now.source == "nvidia-smi" and now.p2p[(0, 1)] == "OK"
    assert [p.active for p in now.gpus[0].ports] == [True] * 4 and now.gpus[2].ports == []
    findings = link_findings(topology, now, [])
    assert [f.severity for f in findings if f.check == "nvlink"] == ["ok"]
    outputs["nvlink"] = status.replace("Link 3: 14.062 GB/s", "Link 3: <inactive>", 1)
    (down,) = [
        f
        for f in link_findings(topology, links_source.read_links(topology, []), [])
        if f.severity == "problem"
    ]
    assert (down.where, down.detail[:40]) == ("GPU 0", "3 of 4 NVLinks to its peers are up (the ")


def test_doctor_vouches_for_no_job_where_it_cannot_see_the_processes() -> None:
    from gpualloc.checkup import lease_findings
    from gpualloc.ledger.attribution import Attribution

    (blind,) = lease_findings(Attribution(), [], processes_seen=False)
    assert (blind.severity, blind.detail) == ("note", "the GPUs' process lists cannot be read here")
    assert lease_findings(Attribution(), [])[0].severity == "ok"


def test_links_already_down_at_discovery_are_found_without_an_earlier_picture() -> None:
    """A topology discovered with a link down records it as the truth, so
    doctor said "every link up". A port down below a port up, and a GPU with fewer NVSwitch
    links than its peers, are problems whatever the topology says."""
    from msgspec.structs import replace as replaced

    from gpualloc.checkup import link_findings
    from gpualloc.discovery.links import GpuLinks, LinksNow, Port
    from gpualloc.topologies import load_bundled

    bundled = load_bundled("hgx-h100")  # as discovered with 2 of GPU 2's links already down
    topology = replaced(
        bundled,
        links=[
            replaced(link, nvlinks=16) if 2 in (link.a, link.b) else link for link in bundled.links
        ],
    )
    switch = "00000000:05:00.0"

    def ports(down: set[int]) -> list[Port]:
        return [Port(link=i, active=i not in down, remote_bus_id=switch) for i in range(18)]

    now = LinksNow(
        gpus={g: GpuLinks(gpu=g, ports=ports({4, 5} if g == 2 else set())) for g in range(8)},
        source="nvml",
    )
    problems = {
        (f.where, f.detail[:40])
        for f in link_findings(topology, now, [])
        if f.severity == "problem"
    }
    assert ("GPU 2", "NVLink port 4, 5 down while port 17 is u") in problems
    assert ("GPU 2", "16 NVSwitch links up where its peers hav") in problems
    assert {where for where, _ in problems} == {"GPU 2"}
    said = [f.detail for f in link_findings(topology, now, []) if f.check == "nvlink"]
    assert not [line for line in said if "every link up" in line], "no contradiction"
