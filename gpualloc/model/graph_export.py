"""A topology as a graph file for the tools people draw and analyse graphs with
(``gpualloc topo export``): GraphML (yEd, Cytoscape, Gephi, networkx, igraph), GEXF (Gephi) and
networkx's node-link JSON (d3, or ``networkx.node_link_graph``).

One node per GPU (its name, bus id, NUMA node, memory, CPU affinity as a CPU list), one edge per
GPU pair (the link class such as NV2 or SYS, the NVLink count, the PCIe path, and ``weight``, the
one-way bandwidth in GB/s that placement plans by). GraphML and GEXF hold only scalar
attributes, so lists become CPU-list or comma-separated strings and missing values are left out.
networkx does the writing; it is imported here only (house style habit 9).
"""

from __future__ import annotations

import io
import json
import re
from enum import Enum
from typing import TYPE_CHECKING, Any

from gpualloc.model.cpuset import format_cpulist

if TYPE_CHECKING:
    from gpualloc.model.topology import Topology

FORMATS = ("graphml", "gexf", "json")


def export_graph(topology: Topology, fmt: str) -> str:
    """``topology`` as a ``fmt`` document (one of :data:`FORMATS`)."""
    import networkx as nx

    if fmt not in FORMATS:
        from gpualloc.model.option_values import unknown_choice

        raise unknown_choice("--format", fmt, FORMATS)
    graph = topology.to_networkx()
    for _, attributes in graph.nodes(data=True):
        _flatten(attributes)
    for _, _, attributes in graph.edges(data=True):
        _flatten(attributes)
    if fmt == "json":
        try:
            data = nx.node_link_data(graph, edges="links")  # networkx >= 3.4 names the key
        except TypeError:
            data = nx.node_link_data(graph)  # older: "links" is the default
        return json.dumps(data, indent=2, sort_keys=True) + "\n"
    _xml_safe(graph.graph)
    for _, attributes in graph.nodes(data=True):
        _xml_safe(attributes)
    for _, _, attributes in graph.edges(data=True):
        _xml_safe(attributes)
    out = io.BytesIO()
    if fmt == "graphml":
        nx.write_graphml(graph, out)
    else:
        nx.write_gexf(graph, out)
    return out.getvalue().decode("utf-8")


def _flatten(attributes: dict[str, Any]) -> None:
    """Attributes as scalars, in place: what GraphML and GEXF can hold."""
    for key, value in list(attributes.items()):
        if value is None or value == [] or value == {}:
            del attributes[key]
        elif isinstance(value, Enum):
            attributes[key] = str(value.value)
        elif isinstance(value, (list, tuple)):
            ints = all(isinstance(v, int) and not isinstance(v, bool) for v in value)
            attributes[key] = format_cpulist(value) if ints else ",".join(map(str, value))
        elif isinstance(value, dict):
            attributes[key] = json.dumps(value, sort_keys=True)


NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
"""A character XML 1.0 cannot hold, even as a character reference (a control character such as
ESC, a lone surrogate, U+FFFE/U+FFFF): a GPU name with one would make the file unreadable
(tests/test_bad_input_files.py::test_an_exported_graph_with_control_characters_in_names_parses)."""


def _xml_safe(attributes: dict[str, Any]) -> None:
    """Texts, in place, with each character XML cannot hold written out as ``\\xNN`` (or
    ``\\uNNNN``), as gpualloc shows such characters elsewhere."""
    for key, value in list(attributes.items()):
        if isinstance(value, str) and NOT_XML.search(value):
            attributes[key] = NOT_XML.sub(_written_out, value)


def _written_out(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
