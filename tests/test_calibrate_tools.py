"""``gpualloc calibrate`` with NVIDIA's tools and with recordings, and what
``doctor`` makes of them (point 4).

No GPU here: the host is a fake NVML built from a topology, torch is replaced or absent, and
``nvbandwidth`` / ``all_reduce_perf`` are small scripts on PATH that print real published outputs
(``fixtures/measured``) and log how they were called.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpualloc.discovery import calibration, resolve
from gpualloc.discovery import numa as numa_source
from gpualloc.discovery import nvml as nvml_source
from gpualloc.discovery.recorded import import_smi_texts
from gpualloc.errors import ExitCode
from gpualloc.model.topology import Topology
from gpualloc.topologies import load_bundled
from tests.fake_nvml import FakeNvml
from tests.measured_fixtures import MEASURED

NO_P2P = MEASURED / "p2p_bandwidth_latency" / "rtx2080ti_x2_pcie_no_p2p_autodl.txt"
SUPERBENCH = MEASURED / "nccl_tests" / "a100x8_sxm4_40gb_superbench.txt"


def _host(monkeypatch: pytest.MonkeyPatch, topology: Topology) -> FakeNvml:
    fake = FakeNvml.from_topology(topology)
    monkeypatch.setattr(nvml_source, "load_pynvml", lambda: fake)
    monkeypatch.setattr(numa_source, "discover_numa", lambda notes: [])
    return fake


def _rtx2080ti() -> Topology:
    """The 2080 Ti box's own topo -m (PIX), as recorded beside its p2pBandwidthLatencyTest."""
    text = (MEASURED / "topo" / "rtx2080ti_x2_pix_with_p2p_matrix_autodl.txt").read_text()
    return import_smi_texts(text.split("# nvidia-smi topo -p2p")[0], origin="2080ti")


def _tool(directory: Path, name: str, prints: Path) -> Path:
    """A fake ``name`` on PATH: logs its arguments and CUDA_VISIBLE_DEVICES, prints ``prints``."""
    log = directory / f"{name}.log"
    script = directory / name
    script.write_text(
        f'#!/bin/sh\necho "$CUDA_DEVICE_ORDER $CUDA_VISIBLE_DEVICES $*" >> {log}\ncat {prints}\n'
    )
    script.chmod(0o755)
    return log


@pytest.fixture
def no_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)


def test_from_a_p2p_recording_the_pair_is_measured_and_flagged(cli, monkeypatch) -> None:
    _host(monkeypatch, _rtx2080ti())
    result = cli("calibrate", "--from", str(NO_P2P), "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["matrix_gbps"] == [[0.0, 5.72], [5.72, 0.0]]
    assert [f["kind"] for f in data["findings"]] == ["below-link-class"]
    assert data["sources"] == [str(NO_P2P)]
    assert resolve.resolve_topology().link(0, 1).bandwidth_gbps == 5.72
    doctor = cli("doctor", "--json")
    measured = [f for f in json.loads(doctor.stdout)["findings"] if f["check"] == "bandwidth"]
    assert [(f["where"], f["severity"]) for f in measured] == [("GPU 0-1", "problem")]
    assert doctor.exit_code == ExitCode.CHECK_FAILED


def test_from_nccl_tests_keeps_the_collective_and_not_a_matrix(cli, monkeypatch) -> None:
    _host(monkeypatch, load_bundled("dgx-a100"))
    data = json.loads(cli("calibrate", "--from", str(SUPERBENCH), "--json").stdout)
    assert data["matrix_gbps"] == [] and data["findings"] == []
    (run,) = data["collectives"]
    assert run["gpus"] == list(range(8)) and run["busbw_gbps"] == 235.26
    assert resolve.resolve_topology().provenance.bandwidth == "estimated"  # no pair measured


def test_a_recording_of_another_host_is_refused(cli, monkeypatch) -> None:
    _host(monkeypatch, load_bundled("dgx1-v100"))
    result = cli("calibrate", "--from", str(NO_P2P))
    assert result.exit_code == ExitCode.TOPOLOGY_INVALID and "2 GPUs measured, this host has 8" in (
        result.stderr
    )
    assert not calibration.calibration_path().exists()


def test_without_torch_nvbandwidth_measures(cli, monkeypatch, tmp_path, no_torch) -> None:
    _host(monkeypatch, _rtx2080ti())
    log = _tool(tmp_path, "nvbandwidth", MEASURED / "nvbandwidth" / "azure_2gpu_v0.10_testdata.txt")
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    result = cli("calibrate", "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["matrix_gbps"] == [[0.0, 276.19], [276.07, 0.0]]
    assert data["method"] == "nvbandwidth device_to_device_memcpy_write_ce"
    assert log.read_text().split() == ["PCI_BUS_ID", "-t", "device_to_device_memcpy_write_ce"]


def test_all_reduce_perf_measures_the_sets_placement_weighs(
    cli, monkeypatch, tmp_path, no_torch
) -> None:
    _host(monkeypatch, _rtx2080ti())
    _tool(tmp_path, "nvbandwidth", MEASURED / "nvbandwidth" / "azure_2gpu_v0.10_testdata.txt")
    log = _tool(tmp_path, "all_reduce_perf", SUPERBENCH)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    data = json.loads(cli("calibrate", "--json").stdout)
    (run,) = data["collectives"]  # two GPUs: one set, the pair
    assert run["gpus"] == [0, 1] and run["busbw_gbps"] == 235.26
    assert log.read_text().split() == [
        "PCI_BUS_ID", "0,1", "-b", "268435456", "-e", "268435456", "-g", "2",
    ]  # fmt: skip
    assert json.loads(cli("calibrate", "--no-collectives", "--json").stdout)["collectives"] == []


def test_collectives_asked_for_without_the_tool_say_so(
    cli, monkeypatch, tmp_path, no_torch
) -> None:
    _host(monkeypatch, _rtx2080ti())
    _tool(tmp_path, "nvbandwidth", MEASURED / "nvbandwidth" / "azure_2gpu_v0.10_testdata.txt")
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    result = cli("calibrate", "--collectives")
    assert result.exit_code == ExitCode.DISCOVERY
    assert "all_reduce_perf is not on PATH" in result.stderr


def test_the_sets_are_pairs_numa_nodes_and_all() -> None:
    from gpualloc.discovery.measure_tools import collective_sets

    sets = collective_sets(load_bundled("pcie-8gpu-2socket"))
    assert len(sets) == 28 + 2 + 1
    assert (0, 1, 2, 3) in sets and (4, 5, 6, 7) in sets and sets[-1] == tuple(range(8))


def test_doctor_checks_recordings_it_is_given(cli, tmp_path) -> None:
    slower = MEASURED / "p2p_bandwidth_latency" / "pcie6gpu_p2p_slower_than_nop2p_nccl814.txt"
    healthy = MEASURED / "p2p_bandwidth_latency" / "dgx_station_v100x4_ugache.txt"
    result = cli("--topology", "dgx1-v100", "doctor", "--measured", str(slower), "--json")
    found = [f for f in json.loads(result.stdout)["findings"] if f["check"] == "bandwidth"]
    assert len(found) == 15 and all(f["severity"] == "problem" for f in found)
    assert "P2P 9.9 GB/s against 20.1" in found[0]["detail"]
    assert result.exit_code == ExitCode.CHECK_FAILED
    ok = cli("--topology", "dgx1-v100", "doctor", "--measured", str(healthy), "--json")
    found = [f for f in json.loads(ok.stdout)["findings"] if f["check"] == "bandwidth"]
    assert [f["severity"] for f in found] == ["ok"]


def test_bus_bandwidth_is_nccl_tests_formula() -> None:
    from gpualloc.discovery.torch_collectives import bus_bandwidth

    # all_reduce_perf on 8 A100s (fixtures/measured): 8 GiB in 63896 us, busbw 235.26 GB/s.
    assert bus_bandwidth(8589934592, 63896e-6, 8) == pytest.approx(235.26, abs=0.02)


def test_torch_ranks_get_one_gpu_each_and_rank_0_reports(tmp_path) -> None:
    from gpualloc.discovery.torch_collectives import measure_sets

    log = tmp_path / "ranks.log"
    worker = tmp_path / "worker.py"
    worker.write_text(
        "import json, os, sys\n"
        "assert sys.argv[1] == '1024'\n"
        f"open({str(log)!r}, 'a').write(' '.join(os.environ[k] for k in ("
        "'RANK', 'WORLD_SIZE', 'CUDA_VISIBLE_DEVICES', 'MASTER_ADDR')) + '\\n')\n"
        "if os.environ['RANK'] == '0':\n"
        "    print(json.dumps({'busbw_gbps': 12.5}))\n"
    )
    (found,) = measure_sets([(2, 5)], 1024, worker=[sys.executable, str(worker)])
    assert (found.gpus, found.busbw_gbps, found.source) == ((2, 5), 12.5, "torch.distributed")
    assert sorted(log.read_text().splitlines()) == ["0 2 2 127.0.0.1", "1 2 5 127.0.0.1"]


def test_a_failing_rank_is_one_line(tmp_path) -> None:
    from gpualloc.discovery.calibration import CalibrationUnavailable
    from gpualloc.discovery.torch_collectives import measure_sets

    worker = tmp_path / "worker.py"
    worker.write_text("import sys\nsys.exit('NCCL error: unhandled system error')\n")
    with pytest.raises(CalibrationUnavailable, match="failed: NCCL error"):
        measure_sets([(0, 1)], 1024, worker=[sys.executable, str(worker)])


def test_with_torch_and_no_nccl_tests_torch_measures_the_sets(cli, monkeypatch, tmp_path) -> None:
    from gpualloc.discovery import torch_collectives
    from gpualloc.discovery.bandwidth_matrix import parse_bandwidth_matrix
    from gpualloc.discovery.calibration import MeasuredCollective

    _host(monkeypatch, _rtx2080ti())

    class Copies:
        name = "recorded"
        torch = SimpleNamespace(
            distributed=SimpleNamespace(is_available=lambda: True, is_nccl_available=lambda: True)
        )

        def device_count(self) -> int:
            return 2

        def device_uuid(self, index: int) -> None:
            return None

        def copy_gbps(self, source: int, target: int, size: int, repeats: int) -> float:
            return parse_bandwidth_matrix(NO_P2P.read_text())[source][target]

    monkeypatch.setattr(calibration, "TorchCopy", Copies)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")  # no all_reduce_perf
    asked = []
    monkeypatch.setattr(
        torch_collectives,
        "measure_sets",
        lambda sets, size, **_: (
            asked.append((sets, size))
            or [
                MeasuredCollective(gpus=s, busbw_gbps=5.0, source="torch.distributed") for s in sets
            ]
        ),
    )
    data = json.loads(cli("calibrate", "--json").stdout)
    assert asked == [([(0, 1)], 256 * 2**20)]
    assert data["collectives"][0]["source"] == "torch.distributed"
    assert data["sources"] == ["recorded", "torch.distributed"]
    # A failure there keeps the pairs unless collectives were asked for.
    from gpualloc.discovery.calibration import CalibrationUnavailable

    def fails(sets, size, **_):
        raise CalibrationUnavailable("torch all-reduce on GPUs (0, 1) failed: NCCL error")

    monkeypatch.setattr(torch_collectives, "measure_sets", fails)
    kept = cli("calibrate", "--json")
    assert kept.exit_code == 0 and "warning: collectives not measured" in kept.stderr
    assert json.loads(kept.stdout)["collectives"] == []
    assert cli("calibrate", "--collectives").exit_code == ExitCode.DISCOVERY


def test_nvbandwidth_and_all_reduce_perf_name_gpus_by_cuda_number(monkeypatch) -> None:
    """Both tools number GPUs as CUDA does (bus order); where NVML enumerates otherwise, the
    matrix is put back in NVML's order and the sets are named by CUDA number."""
    from gpualloc.discovery import measure_tools
    from gpualloc.discovery.cache import CacheKey

    cuda_matrix = [[0.0, 1.0, 2.0], [10.0, 0.0, 12.0], [20.0, 21.0, 0.0]]  # by CUDA device
    monkeypatch.setattr(measure_tools.Nvbandwidth, "__init__", lambda self: None)
    monkeypatch.setattr(measure_tools.Nvbandwidth, "matrix", lambda self, count: cuda_matrix)
    key = CacheKey(source="nvml", boot_id=None, driver_version=None, gpu_uuids=("a", "b", "c"))
    ordinals = {0: 0, 1: 2, 2: 1}  # NVML's GPU 1 is CUDA's device 2
    found = measure_tools.measure_with_nvbandwidth(key, ordinals).matrix
    assert found[0][1] == cuda_matrix[0][2] and found[1][2] == cuda_matrix[2][1]
    asked: list = []

    def run(argv, gpus=None):
        asked.append(gpus)
        return "#  out-of-place\\n"

    monkeypatch.setattr(measure_tools, "_run_tool", run)
    with pytest.raises(measure_tools.CalibrationUnavailable):
        measure_tools.measure_collectives("all_reduce_perf", [(1, 2)], ordinals=ordinals)
    assert asked == [[2, 1]]
