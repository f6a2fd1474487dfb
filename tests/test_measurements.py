"""Recorded benchmark outputs (``fixtures/measured``, copied from ``shared/reference/measured``
with their provenance headers): each is read right, or refused with one line that says why.

Figures asserted here are the ones printed in the files; a parser that read the wrong matrix
(the old importer took p2pBandwidthLatencyTest's 0/1 connectivity matrix as GB/s) fails them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpualloc.discovery.bandwidth_matrix import read_bandwidth_matrix
from gpualloc.errors import ExitCode, TopologyParseError
from gpualloc.measurements.recognise import pairwise_copy, read_recording
from tests.house_rules import refused
from tests.measured_fixtures import MEASURED
from tests.measured_fixtures import recording as read

BENCHMARK_KINDS = ("nvbandwidth", "nccl_tests", "p2p_bandwidth_latency")


def test_every_benchmark_recording_is_a_fixture_that_reads() -> None:
    """Every file of the three kinds reads into at least one figure, keeping its provenance."""
    files = [p for kind in BENCHMARK_KINDS for p in sorted((MEASURED / kind).glob("*.txt"))]
    assert len(files) == 12
    for path in files:
        recording = read_recording(path.read_text(), source=str(path))
        assert recording is not None, path
        assert recording.matrices or recording.collectives, path
        assert recording.provenance["source"], path


# --- nvbandwidth -------------------------------------------------------------------------------


def test_nvbandwidth_read_ce_is_transposed_to_source_target() -> None:
    recording = read("nvbandwidth/azure_2gpu_v0.10_testdata.txt")
    assert recording.tool == "nvbandwidth"
    d2d = recording.matrix("device_to_device_memcpy_read_ce")
    assert d2d is not None and d2d.title.startswith("memcpy CE GPU(row) <- GPU(column)")
    # Printed: row 0 column 1 = 276.07 is GPU 0 reading from GPU 1, i.e. data 1 -> 0.
    assert d2d.values == [[None, 276.19], [276.07, None]]
    host = recording.matrix("host_to_device_memcpy_ce")
    assert host is not None and host.endpoints == "host-to-gpu" and host.values == [[26.03, 25.94]]
    back = recording.matrix("device_to_host_memcpy_ce")
    assert back is not None and back.endpoints == "gpu-to-host" and back.values == [[25.97, 26.00]]
    assert pairwise_copy(recording).matrix == [[0.0, 276.19], [276.07, 0.0]]


def test_nvbandwidth_six_pcie_gpus_named_by_its_sum_line() -> None:
    recording = read("nvbandwidth/a6000x6_issue50.txt")
    (d2d,) = recording.matrices
    assert d2d.testcase == "device_to_device_memcpy_read_ce"  # no Running line: from SUM
    assert d2d.gpu_count == 6 and d2d.values[0][1] == 26.34 and d2d.values[3][0] == 21.82
    assert all(d2d.values[i][i] is None for i in range(6))


def test_nvbandwidth_quoted_paste_of_host_sm_copies() -> None:
    recording = read("nvbandwidth/h100x8_host_sm_issue24.txt")
    names = [m.testcase for m in recording.matrices]
    assert names == ["host_to_device_memcpy_sm", "device_to_host_memcpy_sm"]
    assert recording.matrices[0].engine == "SM" and recording.matrices[0].values[0][7] == 35.06
    assert recording.matrices[1].endpoints == "gpu-to-host"
    with pytest.raises(TopologyParseError, match=r"no GPU-to-GPU copy matrix .* 2 host-to-gpu"):
        pairwise_copy(recording)


def test_nvbandwidth_local_copy_and_device_names() -> None:
    recording = read("nvbandwidth/h20-3e_x8_device_local_copy_issue48.txt")
    (local,) = recording.matrices
    assert local.endpoints == "gpu-local" and local.values[0][0] == 1116.30
    assert recording.devices == ("NVIDIA H20-3e",) * 8


def test_nvbandwidth_json_with_waived_peer_tests() -> None:
    recording = read("nvbandwidth/json_1gpu_dcgm_testinput.json.txt")
    h2d = recording.matrix("host_to_device_memcpy_ce")
    assert h2d is not None and h2d.values == [[12.3964]]
    both = recording.matrix("host_to_device_bidirectional_memcpy_ce")
    assert both is not None and both.pattern == "bidirectional-each"
    assert "device_to_device_memcpy_read_ce: waived" in recording.notes
    with pytest.raises(TopologyParseError, match="waived: one GPU, or no peer access"):
        pairwise_copy(recording)


# --- p2pBandwidthLatencyTest --------------------------------------------------------------------


def test_p2p_connectivity_is_never_read_as_bandwidth() -> None:
    """An importer that read the connectivity matrix gave every pair 1.0 or 0.0 GB/s."""
    path = MEASURED / "p2p_bandwidth_latency" / "rtx2080ti_x2_pcie_no_p2p_autodl.txt"
    imported = read_bandwidth_matrix(path.read_text(), source=path.name)
    assert imported.matrix == [[0.0, 5.72], [5.72, 0.0]]
    assert imported.used.startswith("unidirectional_p2p_enabled_writes")
    recording = read("p2p_bandwidth_latency/rtx2080ti_x2_pcie_no_p2p_autodl.txt")
    connectivity = recording.matrix("p2p_connectivity")
    assert connectivity is not None and connectivity.values == [[None, 0.0], [0.0, None]]
    latency = recording.matrix("p2p_disabled_latency")
    assert latency is not None and latency.unit == "us" and latency.values[0][1] == 14.76
    assert latency.one_way(0, 1) is None  # a latency is not a bandwidth
    assert len(recording.matrices) == 7


def test_p2p_bidirectional_figures_are_both_directions_added() -> None:
    recording = read("p2p_bandwidth_latency/dgx_station_v100x4_ugache.txt")
    imported = pairwise_copy(recording)
    assert imported.used.startswith("bidirectional_p2p_enabled")
    assert imported.matrix[0][1] == pytest.approx(96.87 / 2)


def test_p2p_slower_than_staged_is_kept_whole() -> None:
    recording = read("p2p_bandwidth_latency/pcie6gpu_p2p_slower_than_nop2p_nccl814.txt")
    names = [m.testcase for m in recording.matrices]
    assert names == [
        "unidirectional_p2p_disabled",
        "unidirectional_p2p_enabled_writes",
        "unidirectional_p2p_enabled_reads",
    ]
    enabled, disabled = recording.matrices[1], recording.matrices[0]
    assert enabled.values[0][1] == 9.90 and disabled.values[0][1] == 20.10


def test_a_cut_matrix_is_a_note_and_a_whole_one_still_reads() -> None:
    text = (
        "Unidirectional P2P=Enabled Bandwidth (P2P Writes) Matrix (GB/s)\n"
        "   D\\D     0      1\n     0 770.94  10.16\n     1  10.35 771.01\n\n"
        "Bidirectional P2P=Enabled Bandwidth Matrix (GB/s)\n"
        "   D\\D     0      1\n     0 780.00  19.00\n"
    )
    recording = read_recording(text, source="cut.txt")
    assert recording is not None and len(recording.matrices) == 1
    assert recording.notes and "1 row for 2 GPUs" in recording.notes[0]
    only_cut = text.split("\n\n")[1]
    with pytest.raises(TopologyParseError, match="no complete matrix"):
        read_recording(only_cut, source="cut.txt")


# --- nccl-tests ---------------------------------------------------------------------------------


def test_nccl_tests_old_format_with_a_stray_log_line() -> None:
    recording = read("nccl_tests/a100x8_sxm4_40gb_superbench.txt")
    (run,) = recording.collectives
    assert run.gpus == tuple(range(8)) and run.hosts == ("localhost",)
    assert run.gpu_names == ("A100-SXM4-40GB",)
    assert run.largest.size_bytes == 8589934592 and run.largest.busbw == 235.26
    assert run.average_busbw == pytest.approx(68.4048)
    assert len(run.rows) == 34  # 0, 0, 4 B .. 8 GiB; the 'NCCL INFO' line is not a row


def test_nccl_tests_runs_attributed_through_cuda_visible_devices() -> None:
    recording = read("nccl_tests/a40x8_nv4pairs_p2p_node_sys.txt")
    pair, four, node = recording.collectives
    assert (pair.gpus, pair.p2p_disabled, pair.largest.busbw) == ((0, 1), False, 47.49)
    assert (four.gpus, four.p2p_disabled, four.gpu_count) == ((0, 1, 6, 7), True, 4)
    assert (node.gpus, node.p2p_disabled, node.largest.busbw) == ((1, 2), True, 3.61)
    assert {run.operation for run in recording.collectives} == {"all_reduce"}


def test_nccl_tests_gpu_count_from_the_command_when_devices_are_not_printed() -> None:
    recording = read("nccl_tests/dgx_a100_640gb_4gpu.txt")
    plain, staged = recording.collectives
    assert plain.gpu_count == 4 and plain.gpus is None  # docker chose them: not in the output
    assert plain.largest.busbw == 234.72 and not plain.p2p_disabled
    assert staged.p2p_disabled and staged.largest.busbw == 5.2


def test_nccl_tests_across_two_hosts_names_both() -> None:
    recording = read("nccl_tests/h100x16_2node_gcp_a3mega.txt")
    (run,) = recording.collectives
    assert run.gpu_count == 16 and run.gpus is None and not run.single_host
    assert run.hosts == ("ztan-mig-235z", "ztan-mig-gq73")
    assert run.bus_ids[0] == "0000:04:00" and run.largest.busbw == 338.82


def test_nccl_tests_cut_before_its_average_is_refused() -> None:
    text = (MEASURED / "nccl_tests" / "a100x8_sxm4_40gb_superbench.txt").read_text()
    cut = text.split("# Out of bounds")[0]
    with pytest.raises(TopologyParseError, match="no complete run"):
        read_recording(cut, source="cut.txt")


# --- the command line ---------------------------------------------------------------------------


def test_topo_import_names_the_matrix_it_used_and_plan_says_so(
    cli: Callable[..., Any], tmp_path: Path
) -> None:
    source = MEASURED / "p2p_bandwidth_latency" / "dgx_station_v100x4_ugache.txt"
    topology = tmp_path / "station.json"
    result = cli("topo", "import", "--bandwidth-matrix", str(source), "-o", str(topology))
    assert result.exit_code == 0, result.stderr
    assert "bidirectional_p2p_enabled" in result.stderr
    plan = cli("--topology", str(topology), "plan", "-n", "2", "--explain", "--json")
    used = json.loads(plan.stdout)["explain"]["bandwidth"]
    assert (
        used.startswith("link bandwidths measured: bidirectional_p2p_enabled")
        and str(source) in used
    )
    estimated = cli("--topology", "dgx1-v100", "plan", "-n", "2", "--explain")
    assert "link bandwidths: estimated from link classes" in estimated.stdout


@pytest.mark.parametrize(
    ("relative", "message"),
    [
        ("nccl_tests/a40x8_nv4pairs_p2p_node_sys.txt", "measures collectives, not GPU pairs"),
        ("nvbandwidth/h20-3e_x8_device_local_copy_issue48.txt", "no GPU-to-GPU copy matrix"),
    ],
)
def test_topo_import_refuses_in_one_line(
    cli: Callable[..., object], relative: str, message: str
) -> None:
    result = cli("topo", "import", "--bandwidth-matrix", str(MEASURED / relative))
    assert message in refused(result, ExitCode.TOPOLOGY_PARSE)  # type: ignore[arg-type]
