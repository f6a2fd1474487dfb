"""Degraded hardware found in real recordings: the 6-GPU box whose P2P is
slower than staged copies and the 2080 Ti pair without peer access are flagged; the healthy
recordings are not."""

from __future__ import annotations

import pytest
from msgspec.structs import replace

from gpualloc.measurements.degraded import below_link_class, p2p_slower_than_staged
from gpualloc.model.bandwidth import DEFAULT_BANDWIDTH_TABLE
from tests.measured_fixtures import recording


def test_p2p_slower_than_staged_copies_is_flagged_on_every_pair() -> None:
    findings = p2p_slower_than_staged(
        recording("p2p_bandwidth_latency/pcie6gpu_p2p_slower_than_nop2p_nccl814.txt")
    )
    assert len(findings) == 15  # every pair of the 6 GPUs
    assert findings[0].gpus == (0, 1) and "P2P 9.9 GB/s against 20.1" in findings[0].detail


@pytest.mark.parametrize(
    "relative",
    [
        "p2p_bandwidth_latency/rtx2080ti_x2_pcie_no_p2p_autodl.txt",  # 5.72 vs 5.71: equal
        "p2p_bandwidth_latency/dgx_station_v100x4_ugache.txt",  # no unidirectional matrices
    ],
)
def test_healthy_p2p_is_not_flagged(relative: str) -> None:
    assert p2p_slower_than_staged(recording(relative)) == []


def test_pairs_far_below_their_link_class(measured_benchmark) -> None:
    hosts = {host.recording: host for host in measured_benchmark.HOSTS}
    no_p2p = "p2p_bandwidth_latency/rtx2080ti_x2_pcie_no_p2p_autodl.txt"
    known = hosts[no_p2p].topology()  # its topo -p2p says NS: priced as a staged copy
    assert known.link(0, 1).peer_access is False
    assert below_link_class(recording(no_p2p), known) == []
    unknown = replace(known, links=[replace(known.link(0, 1), peer_access=None)])
    (finding,) = below_link_class(recording(no_p2p), unknown.estimated(DEFAULT_BANDWIDTH_TABLE))
    assert finding.gpus == (0, 1) and "5.7 GB/s over PIX" in finding.detail
    for healthy in (
        "p2p_bandwidth_latency/dgx_station_v100x4_ugache.txt",
        "nvbandwidth/a6000x6_issue50.txt",
    ):
        assert below_link_class(recording(healthy), hosts[healthy].topology()) == [], healthy
