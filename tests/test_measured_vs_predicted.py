"""Predictions set against real measurements (issue 32, point 2): the comparison itself, and
the figures docs/evaluation.md section 5 reports (``benchmarks/measured.py``)."""

from __future__ import annotations

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


def test_runs_that_do_not_measure_the_host_are_not_counted() -> None:
    plain, staged = compare_recording(
        recording("nccl_tests/dgx_a100_640gb_4gpu.txt"),
        load_bundled("dgx-a100"),
        gpu_map=(4, 5, 6, 7),
    )
    assert plain.gpus == (4, 5, 6, 7) and plain.counted
    assert not staged.counted and staged.why_not_counted == "NCCL_P2P_DISABLE=1"
    assert median_abs_error([plain, staged]) == pytest.approx(abs(plain.error))
    across = recording("nccl_tests/h100x16_2node_gcp_a3mega.txt")
    assert compare_recording(across, load_bundled("hgx-h100")) == []  # the network's figure


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
    assert sum(c.counted for c in everything) == 25
    assert median_abs_error(everything) == pytest.approx(0.03, abs=0.01)
    before = measured_benchmark.summary(measured_benchmark.comparisons(before=True))
    assert before == pytest.approx((0.18, 0.28), abs=0.01)
    assert measured_benchmark.summary(measured_benchmark.comparisons()) == pytest.approx(
        (0.03, 0.03), abs=0.01
    )
    held_out = dict(measured_benchmark.leave_one_out_efficiency())
    assert len(held_out) == 3 and all(abs(error) < 0.1 for error in held_out.values())
    section = "\n".join(measured_benchmark.measured_section())
    assert "before **18 %**, after **3 %**" in section
    assert "left out: across two hosts" in section


def test_a_staged_copy_is_a_little_slower_the_farther_apart_the_gpus() -> None:
    """Issue 41, item 1: without peer access every pair was priced alike (half the link),
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
