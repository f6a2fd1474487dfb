"""Peer access and the model's measured factors: a pair the driver refuses
P2P copies through host memory and is priced so; cross-socket PCIe from 4.0 on and NCCL's
efficiency over NVLink are the recordings' figures."""

from __future__ import annotations

import json

import pytest
from msgspec.structs import replace

from gpualloc.discovery.recorded import import_smi_texts
from gpualloc.model.bandwidth import DEFAULT_BANDWIDTH_TABLE, bandwidth_table_from
from gpualloc.model.paths import PciePath
from gpualloc.model.rings import allreduce_busbw_gbps
from gpualloc.topologies import load_bundled
from tests.fake_nvml import FakeNvml, probe
from tests.measured_fixtures import MEASURED
from tests.recordings import recorded

TWO_2080TI = (MEASURED / "topo" / "rtx2080ti_x2_pix_with_p2p_matrix_autodl.txt").read_text()


def test_nvml_peer_status_is_read_and_a_refused_pair_is_priced_as_staged() -> None:
    bundled = load_bundled("pcie-8gpu-2socket")
    fake = FakeNvml.from_topology(bundled)
    fake.p2p[(0, 1, 0)] = 2  # GNS: GeForce boards have P2P off in the driver
    found = probe(fake)
    assert found.link(0, 1).peer_access is False and found.link(0, 2).peer_access is True
    pcie_4_x16 = 1.969 * 16
    assert found.link(0, 1).bandwidth_gbps == pytest.approx(pcie_4_x16 * 0.5, abs=0.001)
    assert found.link(0, 2).bandwidth_gbps == bundled.link(0, 2).bandwidth_gbps


def test_a_topo_p2p_matrix_pasted_below_topo_m_is_read() -> None:
    topology = import_smi_texts(TWO_2080TI, origin="2080ti")
    link = topology.link(0, 1)
    assert (link.pcie, link.peer_access, link.bandwidth_gbps) == (PciePath.PIX, False, 7.88)
    alone = import_smi_texts(TWO_2080TI.split("# nvidia-smi topo -p2p")[0], origin="2080ti")
    assert alone.link(0, 1).peer_access is None and alone.link(0, 1).bandwidth_gbps == 15.76


def test_topo_import_takes_the_p2p_matrix_from_its_own_file(cli, tmp_path) -> None:
    topo = tmp_path / "topo.txt"
    topo.write_text(recorded("2x-rtx5090_threadripper_phb_topo.txt"))
    p2p = tmp_path / "p2p.txt"
    p2p.write_text(recorded("p2p_rw_2x-rtx5090_gns.txt"))
    result = cli("topo", "import", str(topo), "--p2p", str(p2p), "--json")
    assert result.exit_code == 0, result.stderr
    (link,) = json.loads(result.stdout)["links"]
    assert link["peer_access"] is False
    plain = json.loads(cli("topo", "import", str(topo), "--json").stdout)["links"][0]
    assert plain["peer_access"] is None and plain["bandwidth_gbps"] > link["bandwidth_gbps"]


def test_cross_socket_factor_depends_on_the_pcie_generation() -> None:
    table = DEFAULT_BANDWIDTH_TABLE
    assert table.path_factor(PciePath.SYS, 3) == 0.5  # the DGX-1 V100 of seed 001
    assert table.path_factor(PciePath.SYS, 4) == table.path_factor(PciePath.SYS, 5) == 0.7
    assert table.path_factor(PciePath.NODE, 4) == 0.7 and table.path_factor(PciePath.PIX, 4) == 1
    assert table.path_factor(PciePath.SYS, None) == 0.5  # unknown generation: PCIe 3.0
    mine = bandwidth_table_from({"pcie_path_factor_by_generation": {"4": {"SYS": 0.6}}}, "test")
    assert mine.path_factor(PciePath.SYS, 4) == 0.6 and mine.path_factor(PciePath.SYS, 3) == 0.5


def test_nccl_efficiency_scales_nvlink_rings_only() -> None:
    a100 = load_bundled("dgx-a100")
    assert allreduce_busbw_gbps(a100, (0, 1, 2, 3)) == pytest.approx(240.0)
    pcie = load_bundled("pcie-8gpu-2socket")
    ring = allreduce_busbw_gbps(pcie, (0, 1))
    assert ring == pcie.link(0, 1).bandwidth_gbps  # PCIe: no NCCL recording, not scaled
    full = replace(DEFAULT_BANDWIDTH_TABLE, nccl_nvlink_efficiency=1.0)
    assert allreduce_busbw_gbps(a100, (0, 1), full) == pytest.approx(300.0)


def test_a_faster_pcie_pair_beside_an_nvlink_ring_keeps_the_nvlink_scaling() -> None:
    """An NVLink ring 0-1-2-3 at 20 GB/s with PCIe diagonals at 25: NCCL's ring is the NVLink
    one (the diagonals close no ring), so its rate is scaled as NVLink."""
    base = load_bundled("nvlink-pairs-4gpu")
    ring = {(0, 1), (1, 2), (2, 3), (0, 3)}
    links = [
        replace(link, nvlinks=1, bandwidth_gbps=20.0)
        if (link.a, link.b) in ring
        else replace(link, nvlinks=0, nvlink_generation=None, bandwidth_gbps=25.0)
        for link in base.links
    ]
    topology = replace(base, links=links).validated()
    efficiency = DEFAULT_BANDWIDTH_TABLE.nccl_nvlink_efficiency
    assert allreduce_busbw_gbps(topology, (0, 1, 2, 3)) == pytest.approx(20.0 * efficiency)
    assert allreduce_busbw_gbps(topology, (0, 2)) == 25.0  # the PCIe pair alone: unscaled
