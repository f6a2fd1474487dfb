"""``gpualloc calibrate``: measured bandwidth saved for these GPUs and used from then on.

There is no GPU here, so the measuring backend is replaced by one that answers with a real
machine's published measurements (the Kubernetes GPU-topology proposal's DGX-1 V100 matrix,
``fixtures/bandwidth/k8s-proposal-matrix.txt``) on a fake NVML host built from ``dgx1-v100``.
What torch itself measures is checked on a GPU machine, not here.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from gpualloc.discovery import calibration, resolve
from gpualloc.discovery import numa as numa_source
from gpualloc.discovery import nvml as nvml_source
from gpualloc.discovery.bandwidth_matrix import parse_bandwidth_matrix
from gpualloc.errors import ExitCode, NoGpuFound
from gpualloc.topologies import load_bundled
from tests.fake_nvml import FakeNvml

MEASURED = Path(__file__).parent / "fixtures" / "bandwidth" / "k8s-proposal-matrix.txt"


def _fake_host(monkeypatch: pytest.MonkeyPatch, name: str) -> FakeNvml:
    fake = FakeNvml.from_topology(load_bundled(name))
    monkeypatch.setattr(nvml_source, "load_pynvml", lambda: fake)
    monkeypatch.setattr(numa_source, "discover_numa", lambda notes: [])
    return fake


class RecordedCopies:
    """Answers each pair with a published measurement instead of timing torch copies."""

    name = "recorded"

    def __init__(self, matrix: list[list[float]]) -> None:
        self.matrix = matrix
        self.asked: list[tuple[int, int, int, int]] = []
        self.uuids: list[str] = []

    def device_count(self) -> int:
        return len(self.matrix)

    def device_uuid(self, index: int) -> str | None:
        return self.uuids[index] if self.uuids else None

    def copy_gbps(self, source: int, target: int, size_bytes: int, repeats: int) -> float:
        self.asked.append((source, target, size_bytes, repeats))
        return self.matrix[source][target] / 2  # the proposal counts both directions


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> RecordedCopies:
    backend = RecordedCopies(parse_bandwidth_matrix(MEASURED.read_text()))
    monkeypatch.setattr(calibration, "TorchCopy", lambda: backend)
    return backend


def test_without_a_gpu_it_says_so_in_one_line(cli, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_gpu() -> None:
        raise NoGpuFound("no NVIDIA GPU found (NVML: library not found; nvidia-smi: not found)")

    monkeypatch.setattr(resolve, "host_key", no_gpu)
    result = cli("calibrate")
    assert result.exit_code == ExitCode.NO_GPU
    assert result.stderr.count("\n") == 1 and "no NVIDIA GPU on this host" in result.stderr
    assert not calibration.calibration_path().exists()


def test_one_gpu_has_no_pair_to_measure(cli, monkeypatch: pytest.MonkeyPatch, recorded) -> None:
    _fake_host(monkeypatch, "single-gpu")
    result = cli("calibrate")
    assert result.exit_code == 0
    assert "pairwise and collective figures need two" in result.stdout + result.stderr
    assert json.loads(cli("calibrate", "--json").stdout)["measured"] is False
    assert recorded.asked == [] and not calibration.calibration_path().exists()


def test_measurements_are_saved_and_used_for_these_gpus_only(
    cli, monkeypatch: pytest.MonkeyPatch, recorded: RecordedCopies
) -> None:
    fake = _fake_host(monkeypatch, "dgx1-v100")
    before = resolve.resolve_topology()
    result = cli("calibrate", "--json", "--size-mib", "64", "--repeats", "3")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["measured"] is True and data["matrix_gbps"][1][4] == 2.32  # 4.64 both ways
    assert len(recorded.asked) == 8 * 7 and recorded.asked[0][2:] == (64 * 2**20, 3)
    after = resolve.resolve_topology()
    assert after.provenance.bandwidth == "measured"
    assert after.link(1, 4).bandwidth_gbps == 2.32  # the slower direction (4.64 vs 16.81)
    assert after.link(0, 3).bandwidth_gbps == pytest.approx(96.25 / 2)
    assert before.link(1, 4).bandwidth_gbps == 7.88  # the estimate
    # Placement scores with the measurement: the pair left is as slow as it was measured.
    plan = json.loads(cli("plan", "-n", "2", "--free", "1,4", "--json").stdout)
    assert plan["scores"]["bottleneck_gbps"] == 2.32
    # Another GPU in the box: the calibration is not for this host any more.
    fake.gpus[0].uuid = "GPU-replaced"
    assert resolve.resolve_topology().provenance.bandwidth != "measured"


def test_forget_goes_back_to_estimates(cli, monkeypatch: pytest.MonkeyPatch, recorded) -> None:
    _fake_host(monkeypatch, "dgx1-v100")
    assert cli("calibrate").exit_code == 0
    assert resolve.resolve_topology().provenance.bandwidth == "measured"
    forgotten = cli("calibrate", "--forget")
    assert forgotten.exit_code == 0 and "removed" in forgotten.stdout + forgotten.stderr
    assert resolve.resolve_topology().link(1, 4).bandwidth_gbps == 7.88
    assert "no calibration" in (lambda r: r.stdout + r.stderr)(cli("calibrate", "--forget"))


def test_a_recorded_topology_cannot_be_calibrated(cli) -> None:
    result = cli("--topology", "dgx1-v100", "calibrate")
    assert result.exit_code == ExitCode.USAGE and "not a recorded topology" in result.stderr


def test_without_torch_it_says_what_to_install(cli, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_host(monkeypatch, "dgx1-v100")
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    result = cli("calibrate")
    assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"  # set before torch is imported
    assert result.exit_code == ExitCode.DISCOVERY
    assert "torch is not installed" in result.stderr and "pip install torch" in result.stderr


def test_a_damaged_calibration_is_ignored(
    cli, monkeypatch: pytest.MonkeyPatch, recorded: RecordedCopies
) -> None:
    _fake_host(monkeypatch, "dgx1-v100")
    assert cli("calibrate").exit_code == 0
    assert resolve.resolve_topology().provenance.bandwidth == "measured"
    path = calibration.calibration_path()
    path.write_text(path.read_text()[: len(path.read_text()) // 2])  # torn
    topology = resolve.resolve_topology()
    assert topology.provenance.bandwidth != "measured"
    assert topology.link(1, 4).bandwidth_gbps == 7.88


def test_devices_numbered_otherwise_than_nvml_are_matched_by_uuid(
    cli, monkeypatch: pytest.MonkeyPatch, recorded: RecordedCopies
) -> None:
    """torch numbers GPUs in bus order, NVML in its own (not bus order on every host: the L40S
    profile of NVIDIA's mock NVML); each NVML GPU is copied to and from its own torch device, found
    by UUID. A torch that sees other GPUs than NVML is refused."""
    fake = _fake_host(monkeypatch, "dgx1-v100")
    uuids = [gpu.uuid for gpu in fake.gpus]
    recorded.uuids = [uuids[1], uuids[0], *uuids[2:]]  # torch's device 0 is NVML's GPU 1
    assert cli("calibrate").exit_code == 0
    matrix = calibration.load_calibration().matrix
    assert matrix[0][3] == recorded.matrix[1][3] / 2  # GPU 0 is torch's device 1
    assert matrix[1][3] == recorded.matrix[0][3] / 2
    assert matrix[2][3] == recorded.matrix[2][3] / 2
    calibration.calibration_path().unlink()
    recorded.uuids = ["GPU-elsewhere", *uuids[1:]]
    result = cli("calibrate")
    assert result.exit_code == ExitCode.DISCOVERY and "CUDA_VISIBLE_DEVICES" in result.stderr
    assert not calibration.calibration_path().exists()
