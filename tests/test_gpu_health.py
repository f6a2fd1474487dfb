"""Unhealthy GPUs are never handed out: faults injected into the fake NVML
and the kernel log, and declared in a recorded topology, each flagged and skipped; a job that
allows unhealthy GPUs gets one, at once or, through the broker, when its queued turn comes.

The lines below follow the driver's
``NVRM: Xid (PCI:<domain>:<bus>:<device>): <code>, pid=..., ...`` format.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from gpualloc.discovery import health, xid
from gpualloc.discovery import nvml as nvml_source
from gpualloc.errors import ExitCode
from gpualloc.ledger.occupancy import Occupancy
from gpualloc.ledger.schema import Ledger
from gpualloc.topologies import load_bundled
from tests.broker_harness import RunningBroker, broker_leases, hold_request, through_broker
from tests.child_processes import finish
from tests.fake_nvml import FakeNvml

KERNEL_LOG = """\
NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.129.03
NVRM: Xid (PCI:0000:10:00): 13, pid=4242, name=python, Graphics Exception: ESR 0x504648
NVRM: Xid (PCI:0000:15:00): 48, pid=777, name=python, An uncorrectable double bit error
NVRM: Xid (PCI:0000:15:00): 64, pid='<unknown>', name=<unknown>, row remapper failure
nvidia-nvlink: IBMNPU: ...
"""
"""GPU 0 (bus 0x10, as the fake NVML numbers buses) hits a program's fault, GPU 5 (0x15) two
critical errors."""


def with_bus_ids(topology):
    """The fake NVML's bus ids (00000000:1N:00.0 for GPU N) on a bundled topology's GPUs."""
    from msgspec.structs import replace

    from tests.fake_nvml import bus_id

    return replace(topology, gpus=[replace(g, pci_bus_id=bus_id(g.index)) for g in topology.gpus])


def test_critical_xids_are_faults_application_ones_are_not() -> None:
    topology = with_bus_ids(load_bundled("dgx1-v100"))
    assert xid.parse_xid_errors(KERNEL_LOG) == [
        ("0000:10:00", 13),
        ("0000:15:00", 48),
        ("0000:15:00", 64),
    ]
    (fault,) = xid.xid_faults(topology, KERNEL_LOG)  # Xid 13 is the program's fault
    assert (fault.gpu, fault.kind) == (5, "xid")
    assert fault.detail == (
        "Xid 64: ECC page retirement or row remapping failed (2 critical Xid errors since boot)"
    )


@pytest.fixture
def sick_host(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    """A fake DGX-1 with a fault of every kind NVML reports, and the kernel log above."""
    fake = FakeNvml.from_topology(load_bundled("dgx1-v100"))
    fake.gpus[1].ecc_uncorrected = 3
    fake.gpus[2].retired_pages_pending = True
    fake.gpus[3].remapped_rows = (0, 2, 1, 0)  # pending
    fake.gpus[4].remapped_rows = (0, 9, 0, 1)  # failed
    fake.gpus[6].lost_on = {"*"}
    fake.gpus[7].unsupported |= {
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRetiredPagesPendingStatus",
        "nvmlDeviceGetRemappedRows",
    }
    monkeypatch.setattr(nvml_source, "load_pynvml", lambda: fake)
    monkeypatch.setattr(health, "read_kernel_log", lambda: KERNEL_LOG)
    return fake


def test_every_nvml_fault_and_the_xid_are_flagged(sick_host: FakeNvml) -> None:
    topology = with_bus_ids(load_bundled("dgx1-v100"))
    faults, notes = health.live_faults(topology)
    assert notes == []
    assert [(f.gpu, f.kind) for f in faults] == [
        (1, "ecc"),
        (2, "retired-pages"),
        (3, "remapped-rows"),
        (4, "remapped-rows"),
        (5, "xid"),
        (6, "lost"),
    ]
    details = {f.gpu: f.detail for f in faults}
    assert details[1] == "3 uncorrectable ECC errors since the driver loaded"
    uuid = topology.gpus[6].uuid  # the card to pull, as discovery knew it (b2653dd: no name)
    assert details[6] == f"fell off the bus (NVML: GPU is lost): bus 00000000:16:00.0, UUID {uuid}"
    assert "wait for a GPU reset" in details[3] and "failed" in details[4]
    occupancy = Occupancy.build(topology, Ledger(host="h"), faults=faults)
    assert occupancy.free == {0, 7}  # 7 supports none of the checks: nothing known against it
    assert (
        occupancy.state(1) == "unhealthy" and "GPU 1 is unhealthy: 3" in occupancy.describe([1])[0]
    )


def test_without_the_kernel_log_xids_are_not_checked_and_status_says_so(
    monkeypatch: pytest.MonkeyPatch, sick_host: FakeNvml
) -> None:
    def denied() -> str:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(health, "read_kernel_log", denied)
    faults, notes = health.live_faults(load_bundled("dgx1-v100"))
    assert 5 not in {f.gpu for f in faults}
    assert notes and "Xid errors not checked: cannot read /dev/kmsg" in notes[0]


# ---- on a recorded topology, through the command line ----------------------------------------


@pytest.fixture
def sick_topology(tmp_path: Path) -> tuple[str, str]:
    data = json.loads(load_bundled("nvlink-pairs-4gpu").to_json())
    data["faults"] = [
        {"gpu": 1, "kind": "ecc", "detail": "3 uncorrectable ECC errors since the driver loaded"}
    ]
    path = tmp_path / "sick.json"
    path.write_text(json.dumps(data))
    return ("--topology", str(path))


def test_an_unhealthy_gpu_is_skipped_said_and_overridable(cli, sick_topology) -> None:
    pair = cli(*sick_topology, "alloc", "-n", "2", "--hold", "--format", "json")
    assert json.loads(pair.stdout)["placement"]["gpus"] in ([2, 3], [3, 2])  # not the 0-1 pair
    status = cli(*sick_topology, "status")
    assert "1    unhealthy" in status.stdout and "UNHEALTHY: 3 uncorrectable ECC" in status.stdout
    data = json.loads(cli(*sick_topology, "status", "--json").stdout)
    assert data["gpus"][1]["state"] == "unhealthy" and data["gpus"][1]["faults"][0]["kind"] == "ecc"
    named = cli(*sick_topology, "alloc", "--gpus", "1", "--hold")
    assert named.exit_code == ExitCode.NO_PLACEMENT and "--allow-unhealthy" in named.stderr
    too_many = cli(*sick_topology, "alloc", "-n", "4", "--hold")  # 3 healthy GPUs on the host
    assert too_many.exit_code == ExitCode.NO_PLACEMENT
    assert "GPU 1 unhealthy: 3 uncorrectable ECC errors" in too_many.stderr
    forced = cli(*sick_topology, "alloc", "--gpus", "1", "--hold", "--allow-unhealthy")
    assert forced.exit_code == 0, forced.stderr
    plan = cli(*sick_topology, "plan", "-n", "1", "--json")
    assert json.loads(plan.stdout)["gpus"] != [1] and "skipping unhealthy GPU 1" in plan.stderr


def test_a_fault_on_a_gpu_that_does_not_exist_is_refused() -> None:
    from gpualloc.errors import TopologyError

    topology = load_bundled("single-gpu")
    data = json.loads(topology.to_json())
    data["faults"] = [{"gpu": 3, "kind": "xid", "detail": "Xid 79"}]
    with pytest.raises(TopologyError, match="fault or utilization is on GPU 3"):
        type(topology).from_json(json.dumps(data))


def test_processes_and_health_are_asked_in_one_nvml_session(sick_host: FakeNvml) -> None:
    """Initialising NVML is the slow part of asking it, and ``run`` asks every time."""
    from gpualloc.discovery.live import observe

    now = observe(with_bus_ids(load_bundled("dgx1-v100")))
    assert sick_host.calls["nvmlInit"] == 1
    assert now.processes.source == "nvml" and {f.gpu for f in now.faults} == {1, 2, 3, 4, 5, 6}


def test_a_waiting_job_hears_which_gpus_are_unhealthy_not_that_nobody_holds_them() -> None:
    from gpualloc.host.wait import who_holds
    from gpualloc.model.topology import GpuFault, GpuProcess

    topology = load_bundled("nvlink-pairs-4gpu")
    fault = GpuFault(gpu=1, kind="ecc", detail="3 uncorrectable ECC errors")
    stranger = GpuProcess(gpu=2, pid=4242, name="python", user="eve")
    occupancy = Occupancy.build(topology, Ledger(host="h"), [stranger], faults=[fault])
    assert who_holds(occupancy) == "held by unhealthy: 1, not gpualloc: 2"


# ---- through the broker ------------------------------------------------------------------------

TOPOLOGY = "nvlink-pairs-4gpu"
"""The host the broker serves, GPU 1 unhealthy."""


def test_a_waiter_that_allows_unhealthy_gpus_is_placed_on_one_when_its_turn_comes(
    tmp_path: Path,
) -> None:
    """--allow-unhealthy through the broker, at once and for a queued turn, which the broker
    places itself (GPU 1 is unhealthy; then the healthy three are held)."""
    if os.geteuid() != 0:
        pytest.skip("the broker's tests run it as root (CI runs as root)")
    from gpualloc.topologies import load_bundled

    data = json.loads(load_bundled(TOPOLOGY).to_json())
    data["faults"] = [{"gpu": 1, "kind": "ecc", "detail": "3 uncorrectable ECC errors"}]
    sick = tmp_path / "sick.json"
    sick.write_text(json.dumps(data))
    sick.chmod(0o644)
    running = RunningBroker(str(sick)).start()
    try:
        named = through_broker(running, "alloc", "--gpus", "1", "--hold")
        finish(named, timeout_s=30)
        assert named.returncode == ExitCode.NO_PLACEMENT
        forced = through_broker(
            running, "alloc", "--gpus", "1", "--hold", "--allow-unhealthy", "--format", "json"
        )
        out, err = finish(forced, timeout_s=30)
        assert forced.returncode == 0, err
        released = through_broker(running, "release", json.loads(out)["lease"]["id"])
        finish(released, timeout_s=30)
        assert released.returncode == 0 and not broker_leases(running)
        running.call("alloc", hold_request("ffffffffffff", gpus=3))
        held = {g["index"] for g in broker_leases(running)[0]["gpus"]}
        assert held == {0, 2, 3}
        strict = through_broker(running, "alloc", "--wait", "--timeout", "1", "--hold")
        finish(strict, timeout_s=30)
        assert strict.returncode == 124  # healthy GPUs only: none comes free
        lenient = through_broker(
            running, "alloc", "--wait", "--timeout", "20", "--hold", "--allow-unhealthy",
            "--format", "json",
        )  # fmt: skip
        out, err = finish(lenient, timeout_s=30)
        assert lenient.returncode == 0, err
        assert json.loads(out)["placement"]["gpus"] == [1]
    finally:
        running.stop()
        shutil.rmtree(running.directory, ignore_errors=True)
