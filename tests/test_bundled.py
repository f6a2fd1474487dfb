"""The bundled topologies: present, fresh, and faithful to their sources."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from gpualloc.discovery.smi import topology_from_smi_texts
from gpualloc.errors import TopologyNotFound
from gpualloc.model import PciePath
from gpualloc.topologies import bundled_names, load_bundled
from tests.recordings import recorded

REQUIRED = {
    "dgx1-p100", "dgx1-v100", "dgx2", "dgx-a100", "hgx-h100", "summit-node", "pcie-8gpu-2socket",
    "nvlink-pairs-4gpu", "a40-nv4-pairs-8gpu", "torus-2d-16", "cube-mesh-16", "minsky-p100",
    "single-gpu", "pcie-32gpu-2socket", "torus-2d-32",
}  # fmt: skip
BUILDER = Path(__file__).parent.parent / "scripts" / "build_bundled_topologies.py"


def test_required_topologies_are_bundled() -> None:
    assert set(bundled_names()) >= REQUIRED


def test_bundled_files_match_their_generator() -> None:
    spec = importlib.util.spec_from_file_location("build_bundled", BUILDER)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for filename, text in module.build_all().items():
        shipped = (Path(module.OUT_DIR) / filename).read_text()
        assert shipped == text, f"{filename} is stale: run scripts/build_bundled_topologies.py"


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_every_bundled_topology_says_where_it_came_from(name: str) -> None:
    topology = load_bundled(name)
    assert topology.name == name
    assert topology.provenance.source == "bundled"
    assert len(topology.provenance.description or "") > 100
    assert all(g.uuid and g.name and g.cpu_affinity for g in topology.gpus)


def _nvlink_matrix(topology) -> dict[tuple[int, int], int]:
    return {(x.a, x.b): x.nvlinks for x in topology.links}


def test_dgx1_v100_matches_the_real_output_and_the_issue() -> None:
    bundled = load_bundled("dgx1-v100")
    real = topology_from_smi_texts(recorded("dgx1-v100_vast_topo.txt"))
    assert _nvlink_matrix(bundled) == _nvlink_matrix(real)
    double = {(0, 3), (0, 4), (1, 2), (1, 5), (2, 3), (4, 7), (5, 6), (6, 7)}
    single = {(0, 1), (0, 2), (1, 3), (2, 6), (3, 7), (4, 5), (4, 6), (5, 7)}
    for pair, count in _nvlink_matrix(bundled).items():
        assert count == (2 if pair in double else 1 if pair in single else 0), pair
    pix = {(0, 1), (2, 3), (4, 5), (6, 7)}
    for link in bundled.links:
        same_quad = link.a // 4 == link.b // 4
        expected = (
            PciePath.PIX if (link.a, link.b) in pix else PciePath.PHB if same_quad else PciePath.SYS
        )
        assert link.pcie is expected, (link.a, link.b)
        assert link.nvlink_generation == (2 if link.nvlinks else None)


def test_dgx1_p100_links_and_switch_pairs() -> None:
    topology = load_bundled("dgx1-p100")
    nvlinked = {pair for pair, n in _nvlink_matrix(topology).items() if n}
    quads = {(a, b) for q in (0, 4) for a in range(q, q + 4) for b in range(a + 1, q + 4)}
    assert nvlinked == quads | {(0, 4), (1, 5), (2, 6), (3, 7)}
    assert all(n in (0, 1) for n in _nvlink_matrix(topology).values())
    assert {(x.a, x.b) for x in topology.links if x.pcie is PciePath.PIX} == {
        (0, 2),
        (1, 3),
        (4, 6),
        (5, 7),
    }
    assert topology.link(0, 1).bandwidth_gbps == 20.0


def test_nvswitch_hosts() -> None:
    for name, links in (("dgx2", 6), ("dgx-a100", 12), ("hgx-h100", 18)):
        topology = load_bundled(name)
        assert all(x.nvswitch and x.nvlinks == links for x in topology.links), name
    assert load_bundled("hgx-h100").link(0, 7).bandwidth_gbps == 450.0


def test_mapa_topologies() -> None:
    torus = load_bundled("torus-2d-16")
    degrees = [sum(1 for x in torus.links if x.nvlinks and i in (x.a, x.b)) for i in range(16)]
    assert degrees == [4] * 16  # a full 4x4 torus, including the reference's missing 1-5 edge
    assert torus.link(0, 4).kind == "NV1"
    cube = load_bundled("cube-mesh-16")
    assert sum(1 for x in cube.links if x.nvlinks) == 32
    assert cube.link(0, 11).kind == "NV2"  # declared DoubleNVLink in the reference (1-12)


def test_summit_has_cpuless_gpu_memory_nodes() -> None:
    summit = load_bundled("summit-node")
    assert [n.id for n in summit.numa_nodes] == [0, 8, 250, 251, 252, 253, 254, 255]
    assert summit.numa_node(255).cpus == []
    assert summit.gpus[0].gpu_numa_node == 255 and summit.gpus[0].numa_node == 0
    assert summit.link(0, 3).pcie is PciePath.SYS and summit.link(0, 1).kind == "NV2"


def test_minsky_follows_the_drb_reference() -> None:
    minsky = load_bundled("minsky-p100")
    assert [g.numa_node for g in minsky.gpus] == [0, 0, 1, 1]
    assert minsky.link(0, 1).kind == "NV2" and minsky.link(1, 2).kind == "SYS"


def test_unknown_name_suggests_close_ones() -> None:
    with pytest.raises(TopologyNotFound) as info:
        load_bundled("dgx-1-v100")
    assert "dgx1-v100" in (info.value.hint or "")


@pytest.mark.parametrize(
    ("typed", "suggested"),
    [("dgx1", ["dgx1-p100", "dgx1-v100"]), ("hgx-h10", ["hgx-h100"]), ("torus", ["torus-2d-16"])],
)
def test_an_unknown_name_suggests_the_names_it_begins(typed: str, suggested: list[str]) -> None:
    """``--topology dgx1`` suggested dgx2, dgx-a100 and dgx1-v100, but not dgx1-p100."""
    with pytest.raises(TopologyNotFound) as refused:
        load_bundled(typed)
    assert all(name in (refused.value.hint or "") for name in suggested)
