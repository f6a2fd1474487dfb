"""Predictions set against real measurements: the comparison itself, and
the figures docs/evaluation.md section 5 reports (``benchmarks/measured.py``)."""

from __future__ import annotations

import re

import pytest

from gpualloc.measurements.compare import compare_recording, median_abs_error
from gpualloc.topologies import load_bundled
from tests.measured_fixtures import recording


def test_a_collective_is_set_against_the_best_ring_of_its_gpus() -> None:
    (found,) = compare_recording(
        recording("nccl_tests/a100x8_sxm4_40gb_superbench.txt"), load_bundled("dgx-a100")
    )
    assert found.gpus == tuple(range(8)) and found.path == "NV12"
    # The best ring's NV12 (300 GB/s) at NCCL's efficiency over NVLink (0.8).
    assert (found.predicted_gbps, found.measured_gbps) == (240.0, 235.26)
    assert found.error == pytest.approx(240 / 235.26 - 1)


def test_runs_with_p2p_disabled_are_predicted_through_host_memory_and_across_hosts_not() -> None:
    """NCCL_P2P_DISABLE=1 runs NCCL's transport for peers without access
    (host memory), predicted at nccl_staged_efficiency of the staged copy ring."""
    from gpualloc.model.bandwidth import DEFAULT_BANDWIDTH_TABLE as table
    from gpualloc.model.rings import best_ring_gbps, staged_pair_gbps

    topology = load_bundled("dgx-a100")
    plain, staged = compare_recording(
        recording("nccl_tests/dgx_a100_640gb_4gpu.txt"), topology, gpu_map=(4, 5, 6, 7)
    )
    assert plain.gpus == (4, 5, 6, 7) and plain.counted and plain.what == "all-reduce busbw"
    assert staged.counted and staged.what == "all-reduce busbw, P2P off"
    ring = best_ring_gbps((4, 5, 6, 7), lambda a, b: staged_pair_gbps(topology, a, b))
    assert ring < 16  # PCIe 4.0 staged, not NV12
    assert staged.predicted_gbps == pytest.approx(ring * table.nccl_staged_efficiency)
    assert (staged.measured_gbps, staged.path) == (5.2, "SYS")
    before = compare_recording(
        recording("nccl_tests/dgx_a100_640gb_4gpu.txt"),
        topology,
        gpu_map=(4, 5, 6, 7),
        model_p2p_off=False,
    )
    assert before[1].predicted_gbps == pytest.approx(240.0)  # as if peers had access
    across = recording("nccl_tests/h100x16_2node_gcp_a3mega.txt")
    assert compare_recording(across, load_bundled("hgx-h100")) == []  # the network's figure


def test_a_copy_through_an_nvswitch_is_scaled_and_a_direct_nvlink_copy_is_not() -> None:
    """Copies through an NVSwitch reach about 0.84 of the link rate
    (NVIDIA/nccl#1264: 371-377 of 450 GB/s on H100); a DGX Station's direct NV2 0.97."""
    (h100,) = compare_recording(
        recording("nvbandwidth/azure_2gpu_v0.10_testdata.txt"), load_bundled("hgx-h100")
    )
    assert h100.predicted_gbps == pytest.approx(450 * 0.84)
    station = compare_recording(
        recording("p2p_bandwidth_latency/dgx_station_v100x4_ugache.txt"),
        load_bundled("dgx1-v100"),
    )
    assert {c.predicted_gbps for c in station if c.path == "NV2"} == {50.0}


def test_an_all_reduce_over_a_pair_without_peer_access_runs_through_host_memory() -> None:
    from msgspec.structs import replace

    from gpualloc.model.bandwidth import DEFAULT_BANDWIDTH_TABLE as table
    from gpualloc.model.rings import allreduce_busbw_gbps

    topology = load_bundled("pcie-8gpu-2socket")
    links = [replace(link, peer_access=False) for link in topology.links]
    staged = replace(topology, links=links).with_bandwidth_table(table)
    pair = staged.link(0, 1).bandwidth_gbps  # the staged copy
    assert allreduce_busbw_gbps(staged, (0, 1)) == pytest.approx(
        pair * table.nccl_staged_efficiency
    )
    assert allreduce_busbw_gbps(topology, (0, 1)) == topology.link(0, 1).bandwidth_gbps


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ({"staged_copy_factor": -1}, "a factor is > 0 and <= 1"),
        ({"pcie_path_factor": {"SYS": -0.5}}, "pcie_path_factor[SYS] = -0.5"),
        ({"pcie_lane_gbps": {"4": 1e308}}, "a rate is > 0 and <= 100000 GB/s"),
        ({"nvswitch_copy_efficiency": 1.5}, "nvswitch_copy_efficiency = 1.5"),
    ],
)
def test_a_bandwidth_table_with_a_negative_factor_or_an_endless_rate_is_refused(
    override: dict, said: str
) -> None:
    from gpualloc.errors import TopologyError
    from gpualloc.model.bandwidth import bandwidth_table_from

    with pytest.raises(TopologyError, match=re.escape(said)) as refused:
        bandwidth_table_from(override, "table.json")
    assert "staged_copy_factor" in (refused.value.hint or "")  # the hint names the fields


def test_pairs_take_the_slower_measured_direction() -> None:
    found = compare_recording(
        recording("nvbandwidth/azure_2gpu_v0.10_testdata.txt"), load_bundled("hgx-h100")
    )
    assert [(c.gpus, c.measured_gbps) for c in found] == [((0, 1), 276.07)]


def test_the_evaluations_figures(measured_benchmark) -> None:
    """Every modelled host reads and compares; the errors docs/evaluation.md states hold."""
    found = {host.recording: comparisons for host, comparisons in measured_benchmark.comparisons()}
    assert len(found) == 6
    station = found["p2p_bandwidth_latency/dgx_station_v100x4_ugache.txt"]
    assert len(station) == 6 and all(abs(c.error) < 0.05 for c in station)
    (no_p2p,) = found["p2p_bandwidth_latency/rtx2080ti_x2_pcie_no_p2p_autodl.txt"]
    assert no_p2p.path == "PIX" and no_p2p.error == pytest.approx(7.88 / 5.72 - 1, abs=0.01)
    a6000 = found["nvbandwidth/a6000x6_issue50.txt"]
    assert {c.path for c in a6000} == {"NODE", "SYS"} and len(a6000) == 15
    everything = [c for comparisons in found.values() for c in comparisons]
    assert sum(c.counted for c in everything) == 28
    assert median_abs_error(everything) == pytest.approx(0.03, abs=0.01)
    before = measured_benchmark.summary(measured_benchmark.comparisons(before=True))
    assert before == pytest.approx((0.28, 1.02), abs=0.01)
    assert measured_benchmark.summary(measured_benchmark.comparisons()) == pytest.approx(
        (0.03, 0.04), abs=0.01
    )
    out = measured_benchmark.left_out()  # each host's sets, fitted without that host
    nvlink_runs = [c for cs in out.values() for c in cs if c.what == "all-reduce busbw"]
    assert len(nvlink_runs) == 3 and all(abs(c.error) < 0.1 for c in nvlink_runs)
    (alone,) = out["p2p_bandwidth_latency/rtx2080ti_x2_pcie_no_p2p_autodl.txt"]
    assert alone.error == pytest.approx(0.6 * 15.76 / 5.72 - 1, abs=0.02)  # 0.60, not 0.50
    section = "\n".join(measured_benchmark.measured_section())
    assert "before **28 %**, after **3 %**" in section and "| host left out |" in section
    assert "Out of sample (host left out): median **16 %**, 15 of 28" in section
    assert "left out: across two hosts" in section


def test_a_staged_copy_is_a_little_slower_the_farther_apart_the_gpus() -> None:
    """Without peer access every pair was priced alike (half the link),
    so placement could not tell GPUs of one root complex from GPUs of two sockets."""
    from gpualloc.model.bandwidth import estimate_link_bandwidth_gbps
    from gpualloc.model.paths import PciePath

    def staged(path: PciePath | None) -> float:
        return estimate_link_bandwidth_gbps(
            nvlinks=0, nvlink_generation=None, nvlink_link_gbps=None, pcie=path,
            pcie_generation=3, pcie_width=16, peer_access=False,
        )  # fmt: skip

    near, node, far = staged(PciePath.PIX), staged(PciePath.NODE), staged(PciePath.SYS)
    assert near == staged(PciePath.PHB) == pytest.approx(15.76 * 0.5, rel=1e-3)
    assert near > node > far == staged(None)
