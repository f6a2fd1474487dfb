"""gpualloc against what a real GPU machine said: the recordings of ``scripts/device_check.sh``.

``tests/fixtures/device/README.md`` says which machine made each folder. These run everywhere
(no GPU needed): the parsers read the real texts, the recorded topology loads and plans, and
what the real CUDA job printed agrees with the GPU gpualloc leased it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from gpualloc import boot
from gpualloc.discovery.nvml import normalise_bus_id
from gpualloc.discovery.this_host import describes_this_host
from gpualloc.model.topology import Topology
from tests.cli_harness import Result

DEVICE = Path(__file__).parent / "fixtures" / "device"
H200 = DEVICE / "h200-vm-2026-11-26"
THROUGH_BROKER = DEVICE / "h200-vm-2026-11-26-broker"
AFTER_BUDGETS = DEVICE / "h200-vm-2026-11-26-budget"


def output_of(name: str, folder: Path = H200) -> str:
    """A recording's output, without its header (everything up to the first blank line)."""
    return (folder / name).read_text(encoding="utf-8").split("\n\n", 1)[1]


def output_file(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.write_text(output_of(name), encoding="utf-8")
    return path


@pytest.fixture
def elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine is not the recording's (whose host name, ``vm``, may well be ours)."""
    monkeypatch.setattr(boot, "hostname", lambda: "not-the-recording-host")


def recorded_topology() -> Topology:
    return Topology.from_json_dict(json.loads((H200 / "recorded-topology.json").read_bytes()))


def test_the_real_topo_m_with_its_escape_codes_and_numactl_import(
    cli: Callable[..., Result], tmp_path: Path
) -> None:
    topo = output_file(tmp_path, "topo-m.txt")
    assert "\x1b[4m" in topo.read_text(), "the recording lost its escape codes"
    numa = output_file(tmp_path, "numactl-H.txt")
    result = cli("topo", "import", str(topo), "--numa", str(numa), "--json")
    assert result.exit_code == 0, result.stderr
    imported = json.loads(result.stdout)
    (gpu,) = imported["gpus"]
    assert gpu["cpu_affinity"] == list(range(16))
    assert gpu["numa_node"] == 0
    assert gpu["gpu_numa_node"] is None  # "GPU NUMA ID" N/A
    (node,) = imported["numa_nodes"]
    assert node["memory_total_bytes"] == 4443 * 2**20
    assert imported["links"] == []


@pytest.mark.parametrize("recording", ["mig-lgi.txt", "nvidia-smi.txt"])
def test_a_host_without_mig_is_read_as_no_mig_device(
    cli: Callable[..., Result], tmp_path: Path, recording: str
) -> None:
    """``mig -lgi``'s "No MIG-enabled devices found." and plain ``nvidia-smi`` without a MIG
    table were refused as unrecognised (exit 4) until this recording."""
    topo = output_file(tmp_path, "topo-m.txt")
    mig = output_file(tmp_path, recording)
    result = cli("topo", "import", str(topo), "--mig", str(mig), "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["mig_instances"] == []


def test_the_recorded_topology_agrees_with_nvidia_smi_and_cuda() -> None:
    topology = recorded_topology()
    (gpu,) = topology.gpus
    query = output_of("nvidia-smi-q.txt")
    assert gpu.name == "NVIDIA H200" and "Product Name" in query and "NVIDIA H200" in query
    assert gpu.uuid is not None and gpu.uuid in query
    assert gpu.pci_bus_id is not None and normalise_bus_id(gpu.pci_bus_id) in query
    assert topology.provenance.driver_version == "580.159.04"
    job = json.loads(output_of("gpualloc-run-cuda.txt").strip().splitlines()[-1])
    assert job["leased"] == "0" and job["visible"] == "0" and job["order"] == "PCI_BUS_ID"
    (device,) = job["devices"]
    assert normalise_bus_id(device["bus_id"]) == normalise_bus_id(gpu.pci_bus_id)
    # NVML counts 143,771 MiB, as nvidia-smi does; CUDA 615 MiB fewer (what the driver keeps)
    assert gpu.memory_total_bytes == 143771 * 2**20 and "143771 MiB" in query
    assert 0 < gpu.memory_total_bytes - device["memory_total_bytes"] < 2**30


@pytest.mark.usefixtures("elsewhere")
def test_the_recorded_topology_plans_and_runs_elsewhere_without_binding(
    cli: Callable[..., Result],
) -> None:
    path = str(H200 / "recorded-topology.json")
    shown = cli("--topology", path, "topo", "show")
    assert shown.exit_code == 0, shown.stderr
    assert "NVIDIA H200" in shown.stdout and "00000000:00:06.0" in shown.stdout
    dry = cli("--topology", path, "run", "-n", "1", "--dry-run", "--", "true")
    assert dry.exit_code == 0, dry.stderr
    assert "CUDA_VISIBLE_DEVICES=0" in dry.stdout
    assert "NUMA: not bound" in dry.stdout and "argv: true" in dry.stdout, dry.stdout


def test_a_recording_names_its_host_by_machine_id_not_by_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Cloud VMs share host names (the H200 machine and this project's CI are both ``vm``): a
    recording with a machine id is this host only where the ids match."""
    topology = recorded_topology()
    monkeypatch.setattr(boot, "hostname", lambda: "vm")
    monkeypatch.setattr(boot, "machine_id", lambda: "ours")
    assert topology.provenance.machine_id is None  # recorded before machine ids were kept
    assert describes_this_host(topology)  # so the host name decides, as it did
    provenance = msgspec.structs.replace(topology.provenance, machine_id="theirs")
    theirs = msgspec.structs.replace(topology, provenance=provenance)
    assert not describes_this_host(theirs)
    ours = msgspec.structs.replace(
        topology, provenance=msgspec.structs.replace(provenance, machine_id="ours")
    )
    assert describes_this_host(ours)
    monkeypatch.setattr(boot, "machine_id", lambda: None)
    assert describes_this_host(theirs)  # no id here to compare: the name decides


@pytest.mark.parametrize("folder", [H200, THROUGH_BROKER, AFTER_BUDGETS], ids=lambda f: f.name)
def test_the_device_check_passed_every_step(folder: Path) -> None:
    summary = (folder / "summary.txt").read_text()
    assert summary.rstrip().endswith("device check: passed")
    tier = output_of("pytest-gpu.txt", folder)
    assert "4 passed" in tier and "skipped" not in tier
    for name in folder.iterdir():
        if name.name not in ("summary.txt", "recorded-topology.json"):
            assert name.read_text().startswith("# captured-by: "), name.name


def test_the_broker_gave_a_real_cuda_job_the_gpu_it_leased_and_freed_it() -> None:
    """On a real H200, through a real ``gpualloc serve``: the job CUDA ran saw exactly the GPU
    of its lease (by bus id), and the broker released the lease when the job ended."""
    topology = Topology.from_json_dict(
        json.loads((THROUGH_BROKER / "recorded-topology.json").read_bytes())
    )
    job = json.loads(output_of("gpualloc-broker-run-cuda.txt", THROUGH_BROKER).splitlines()[-1])
    (device,) = job["devices"]
    leased = topology.gpu(int(job["leased"]))
    assert leased.pci_bus_id is not None
    assert normalise_bus_id(device["bus_id"]) == normalise_bus_id(leased.pci_bus_id)
    status = json.loads(output_of("gpualloc-broker-status.json", THROUGH_BROKER))
    assert status["broker"] and status["leases"] == [] and status["free"] == [0]
    log = output_of("broker-log.txt", THROUGH_BROKER)
    assert "released: its job ended" in log
    doctor = output_of("gpualloc-broker-doctor.txt", THROUGH_BROKER)
    assert "no problems found" in doctor


def test_sysfs_told_the_numa_node_so_no_not_supported_note_is_kept() -> None:
    """On the real H200 NVML said NOT_SUPPORTED for the NUMA node and sysfs said 0; the first
    two recordings, made before sysfs was asked, still carried the 'not supported' note."""
    topology = json.loads(output_of("gpualloc-topo-show.json", AFTER_BUDGETS))
    (gpu,) = topology["gpus"]
    assert gpu["numa_node"] == 0 and gpu["gpu_numa_node"] is None
    assert not [n for n in topology["provenance"]["notes"] if "NUMA node" in n]
    plan = output_of("gpualloc-plan.txt", AFTER_BUDGETS)
    assert "Runners-up" not in plan and "runners-up: none; these are the only usable GPUs" in plan
