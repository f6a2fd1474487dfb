"""The topology model: validation, JSON round-trips, lookups, bandwidth, networkx view."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpualloc.errors import SchemaVersionError, TopologyError
from gpualloc.model import (
    DEFAULT_BANDWIDTH_TABLE,
    SCHEMA_VERSION,
    Gpu,
    Link,
    PciePath,
    Provenance,
    Topology,
)
from gpualloc.model.bandwidth import load_bandwidth_table
from gpualloc.model.cpuset import format_cpulist, parse_cpulist
from gpualloc.topologies import bundled_names, load_bundled


@st.composite
def topologies(draw: st.DrawFn) -> Topology:
    count = draw(st.integers(1, 9))
    gpus = [
        Gpu(
            index=i,
            name=draw(st.sampled_from([None, "Tesla V100-SXM2-32GB", "NVIDIA H100 80GB HBM3"])),
            cpu_affinity=draw(st.lists(st.integers(0, 255), max_size=8)),
            pcie_generation=draw(st.none() | st.integers(1, 6)),
            pcie_width=draw(st.none() | st.sampled_from([4, 8, 16])),
        )
        for i in range(count)
    ]
    links = []
    for a in range(count):
        for b in range(a + 1, count):
            nvlinks = draw(st.integers(0, 18))
            links.append(
                Link(
                    a=a,
                    b=b,
                    pcie=draw(st.none() | st.sampled_from(list(PciePath))),
                    nvlinks=nvlinks,
                    nvlink_generation=draw(st.none() | st.integers(1, 6)) if nvlinks else None,
                    nvswitch=draw(st.booleans()) if nvlinks else False,
                    bandwidth_gbps=0.0,
                )
            )
    topology = Topology(gpus=gpus, links=links, provenance=Provenance(source="file"))
    return topology.with_bandwidth_table(DEFAULT_BANDWIDTH_TABLE)


@given(topologies())
def test_json_round_trip(topology: Topology) -> None:
    assert Topology.from_json(topology.to_json()) == topology


@given(topologies())
def test_bandwidth_is_positive_and_nvlink_beats_pcie(topology: Topology) -> None:
    for link in topology.links:
        assert link.bandwidth_gbps > 0
        if link.nvlinks:
            assert link.bandwidth_gbps >= 20.0 * link.nvlinks * 0.7
    for a in range(topology.gpu_count):
        for b in range(topology.gpu_count):
            if a != b:
                assert topology.link(a, b) is topology.link(b, a)
                assert {topology.link(a, b).a, topology.link(a, b).b} == {a, b}


@pytest.mark.parametrize("name", bundled_names())
def test_bundled_round_trip(name: str) -> None:
    topology = load_bundled(name)
    again = Topology.from_json(topology.to_json())
    assert again == topology
    assert again.to_json() == topology.to_json()


def test_json_contract_keys() -> None:
    data = json.loads(load_bundled("dgx1-v100").to_json())
    assert data["schema_version"] == SCHEMA_VERSION
    gpu = data["gpus"][0]
    assert {"index", "uuid", "pci_bus_id", "name", "numa_node", "cpu_affinity"} <= set(gpu)
    assert isinstance(gpu["cpu_affinity"], list) and isinstance(gpu["cpu_affinity"][0], int)
    link = data["links"][0]
    assert {"a", "b", "kind", "nvlinks", "pcie", "bandwidth_gbps"} <= set(link)
    assert (link["a"], link["b"], link["kind"], link["nvlinks"]) == (0, 1, "NV1", 1)
    assert link["pcie"] == "PIX"
    assert [(x["a"], x["b"]) for x in data["links"]] == sorted(
        (a, b) for a in range(8) for b in range(a + 1, 8)
    )


def _document(**changes: object) -> dict:
    data = load_bundled("minsky-p100").to_json_dict()
    data.update(changes)
    return data


def test_newer_schema_is_refused_with_a_hint() -> None:
    with pytest.raises(SchemaVersionError) as info:
        Topology.from_json_dict(_document(schema_version=SCHEMA_VERSION + 1), origin="x.json")
    assert "upgrade gpualloc" in (info.value.hint or "")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"schema_version": "1"}, "no integer schema_version"),
        ({"links": []}, "every GPU pair exactly once"),
        ({"gpus": []}, "every GPU pair"),
        ({"surprise": 1}, "unknown field surprise"),
    ],
)
def test_invalid_documents(changes: dict, message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        Topology.from_json_dict(_document(**changes), origin="x.json")


def test_missing_and_duplicate_links_are_named() -> None:
    data = _document()
    data["links"] = [*data["links"][:-1], data["links"][0]]
    with pytest.raises(TopologyError, match=r"missing \[\(2, 3\)\].*1 duplicated"):
        Topology.from_json_dict(data)


def test_link_endpoints_must_be_ordered() -> None:
    with pytest.raises(ValueError, match="a < b"):
        Link(a=2, b=1, bandwidth_gbps=1.0)


def test_bad_json_text() -> None:
    with pytest.raises(TopologyError, match="not valid JSON"):
        Topology.from_json("{", origin="f.json")


def test_lookups() -> None:
    topology = load_bundled("dgx1-v100")
    assert topology.link(4, 0).kind == "NV2"
    with pytest.raises(TopologyError, match="does not exist"):
        topology.link(0, 8)
    with pytest.raises(TopologyError, match="GPU 9 does not exist"):
        topology.gpu(9)
    with pytest.raises(ValueError, match="itself"):
        topology.link(3, 3)
    assert topology.numa_node(1) is not None and topology.numa_node(5) is None


def test_networkx_view() -> None:
    graph = load_bundled("dgx1-v100").to_networkx()
    assert graph.number_of_nodes() == 8 and graph.number_of_edges() == 28
    assert graph.edges[0, 3]["weight"] == 50.0 and graph.edges[0, 3]["kind"] == "NV2"
    assert graph.nodes[0]["name"] == "Tesla V100-SXM2-32GB"


def test_bandwidth_table_override(tmp_path: Path) -> None:
    path = tmp_path / "table.json"
    path.write_text(json.dumps({"pcie_path_factor": {"SYS": 0.25}, "nvlink_link_gbps": {"2": 30}}))
    table = load_bandwidth_table(path)
    assert table.pcie_path_factor[PciePath.PIX] == 1.0  # untouched entries keep their defaults
    topology = load_bundled("dgx1-v100").with_bandwidth_table(table)
    assert topology.link(0, 5).bandwidth_gbps == pytest.approx(15.76 * 0.25, rel=1e-3)
    assert topology.link(0, 3).bandwidth_gbps == 60.0


@pytest.mark.parametrize(
    ("content", "message"),
    [("[", "not JSON"), ("[]", "JSON object"), ('{"pcie_path_factor": {"SYS": "x"}}', "SYS")],
)
def test_bad_bandwidth_tables(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "table.json"
    path.write_text(content)
    with pytest.raises(TopologyError, match=message):
        load_bandwidth_table(path)


def test_newer_nvlink_generation_than_the_table_knows() -> None:
    assert DEFAULT_BANDWIDTH_TABLE.nvlink_rate(6) == 50.0
    assert DEFAULT_BANDWIDTH_TABLE.nvlink_rate(None) == 25.0


@given(st.sets(st.integers(0, 300)))
def test_cpulist_round_trip(cpus: set[int]) -> None:
    text = format_cpulist(cpus)
    assert (parse_cpulist(text) if text else []) == sorted(cpus)


@pytest.mark.parametrize("text", ["", "a", "3-1", "1,,2", "0-"])
def test_bad_cpulists(text: str) -> None:
    with pytest.raises(ValueError):
        parse_cpulist(text)


@pytest.mark.parametrize("fmt", ["graphml", "gexf", "json"])
def test_topology_exports_as_a_graph_file_that_networkx_reads_back(cli, fmt: str) -> None:
    """``topo export`` (networkx's writers): every GPU and pair, the link class and weight."""
    import io

    import networkx as nx

    result = cli("--topology", "dgx1-v100", "topo", "export", "--format", fmt)
    assert result.exit_code == 0, result.stderr
    if fmt == "json":
        data = json.loads(result.stdout)
        graph = nx.node_link_graph(data, edges="links")
    else:
        reader = nx.read_graphml if fmt == "graphml" else nx.read_gexf
        graph = reader(io.BytesIO(result.stdout.encode()), node_type=int)
    assert graph.number_of_nodes() == 8 and graph.number_of_edges() == 28
    assert graph.edges[0, 3]["kind"] == "NV2" and graph.edges[0, 3]["weight"] == 50.0
    assert graph.edges[0, 5]["kind"] == "SYS"
    assert graph.nodes[0]["cpu_affinity"] == "0-19,40-59"


def test_topology_export_to_a_file_and_a_bad_format(cli, tmp_path: Path) -> None:
    target = tmp_path / "dgx2.graphml"
    result = cli("--topology", "dgx2", "topo", "export", "-o", str(target))
    assert result.exit_code == 0 and f"wrote {target} (16 GPUs, graphml)" in result.stderr
    assert target.read_text().count("<node ") == 16
    refused = cli("--topology", "dgx2", "topo", "export", "--format", "dot")
    assert refused.exit_code == 2 and "not one of graphml, gexf, json" in refused.stderr
