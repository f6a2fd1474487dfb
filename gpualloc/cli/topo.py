"""``gpualloc topo``: show, list, import, record and export host topologies."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from gpualloc.cli.declare import Arg, Command, Group, json_flag, value
from gpualloc.cli.state import STATE
from gpualloc.errors import RequestError
from gpualloc.model.printable import count_of

if TYPE_CHECKING:
    from gpualloc.model.topology import Topology

JSON = json_flag("Print the topology as JSON (the documented model) instead.")


def show(as_json: bool) -> None:
    """Show the GPUs, the link and bandwidth matrices, the NUMA nodes, and where it all came from.

    The topology is this host's (NVML, then nvidia-smi; cached until reboot or driver change),
    or the one named by --topology / GPUALLOC_TOPOLOGY.
    """
    _render(STATE.load_topology(), as_json)


def list_bundled(as_json: bool) -> None:
    """List the bundled topologies usable with --topology NAME."""
    from gpualloc.cli.output import Table, print_json, print_tables
    from gpualloc.cli.topology_view import describe
    from gpualloc.topologies import bundled_names, load_bundled

    topologies = [load_bundled(name) for name in bundled_names()]
    if as_json:
        print_json(
            [
                {
                    "name": t.name,
                    "gpus": t.gpu_count,
                    "summary": describe(t),
                    "description": t.provenance.description,
                }
                for t in topologies
            ]
        )
        return
    rows = [[t.name or "", str(t.gpu_count), describe(t).split(": ", 1)[1]] for t in topologies]
    print_tables(
        [
            Table(
                "Bundled topologies",
                ["Name", "GPUs", "Summary"],
                rows,
                wrap=(2,),
                caption="Use one with: gpualloc --topology NAME topo show",
            )
        ]
    )


def import_text(
    topo_file: Path | None,
    nvlink: Path | None,
    numa: Path | None,
    p2p: Path | None,
    output: Path | None,
    name: str | None,
    bandwidth_matrix: Path | None,
    mig: list[Path] | None,
    as_json: bool,
) -> None:
    """Turn recorded nvidia-smi / numactl text into a gpualloc topology.

    FILE is the output of 'nvidia-smi topo -m' saved to a file ('-' for stdin): the links and
    affinities; 'nvlink -s' adds GPU names and link rates; 'numactl -H' adds NUMA memory and
    distances; --mig adds the MIG devices. Without -o or --json the result is shown as 'topo
    show' would show it.
    """
    from gpualloc.discovery import bandwidth_matrix as bm
    from gpualloc.discovery.mig_text import read_mig_texts, topology_from_gpu_list, with_mig_layout
    from gpualloc.discovery.recorded import import_smi_files, import_smi_texts, read_text
    from gpualloc.user_files import refuse_overwriting_inputs

    if topo_file is None and bandwidth_matrix is None and not mig:
        raise RequestError(
            "nothing to import",
            hint="give a 'nvidia-smi topo -m' file, --bandwidth-matrix, --mig, or some of them",
        )
    read = [topo_file, nvlink, numa, p2p, bandwidth_matrix, *(mig or []), *STATE.input_files()]
    refuse_overwriting_inputs(output, read)
    if name is not None:
        _check_topology_name(name)
    mig_texts = (
        read_mig_texts([(str(path), read_text(path, "MIG file")) for path in mig]) if mig else None
    )
    table = STATE.bandwidth_override()
    matrix = imported = None
    if bandwidth_matrix is not None:
        from gpualloc.cli.output import say

        imported = bm.read_bandwidth_matrix(
            read_text(bandwidth_matrix, "bandwidth matrix file"), source=str(bandwidth_matrix)
        )
        matrix = imported.matrix
        say(f"bandwidth from {bandwidth_matrix}: {imported.used}")
    if topo_file is None and matrix is None:
        assert mig is not None and mig_texts is not None
        topology = topology_from_gpu_list(mig_texts, origin=str(mig[0]), name=name or mig[0].stem)
        mig_texts = None
    elif topo_file is None:
        assert matrix is not None and bandwidth_matrix is not None
        topology = bm.topology_from_bandwidth_matrix(
            matrix, name=name or bandwidth_matrix.stem, origin=str(bandwidth_matrix)
        )
    elif str(topo_file) == "-":
        topology = import_smi_texts(sys.stdin.read(), origin="<stdin>", name=name, table=table)
    else:
        topology = import_smi_files(
            topo_file, nvlink_path=nvlink, numa_path=numa, p2p_path=p2p, name=name, table=table
        )
    if matrix is not None and topo_file is not None:
        topology = bm.apply_measured_bandwidth(topology, matrix)
    if matrix is not None:
        assert imported is not None  # the matrix is what was imported
        topology.provenance.notes.append(
            f"link bandwidths measured: {imported.used} in {bandwidth_matrix}"
        )
    if mig_texts is not None:
        topology = with_mig_layout(topology, mig_texts)
    if output is not None:
        from gpualloc.atomic import write_output

        write_output(output, topology.to_json(), "-o")
        from gpualloc.cli.output import say

        say(f"wrote {output} ({count_of(topology.gpu_count, 'GPU')})")
        if not as_json:
            return
    _render(topology, as_json)


def _check_topology_name(name: str) -> None:
    """Refuse a ``--name`` that every later ``topo show``, ``status`` and error would print:
    control characters (an escape sequence rewrites the reader's terminal) or bytes that are
    not UTF-8 (no topology file can hold them) (tests/test_bad_input_options.py)."""
    from gpualloc.model.printable import has_surrogates, printable

    if not name.strip():
        raise RequestError("--name is empty", hint="give the topology a name, or leave --name out")
    if has_surrogates(name) or printable(name) != name:
        raise RequestError(
            f"--name '{printable(name, 60)}' holds control characters or bytes that are not "
            "UTF-8 text",
            hint="give a name of printable UTF-8 text",
        )


def record(output: Path | None) -> None:
    """Save what this host looks like as a topology file, for bug reports and test fixtures.

    Probes the host afresh (ignoring the cache). The file works anywhere with --topology FILE.
    """
    from gpualloc.cli.output import say, write_stdout
    from gpualloc.user_files import refuse_overwriting_inputs

    refuse_overwriting_inputs(output, STATE.input_files())
    STATE.refresh = True
    topology = STATE.load_topology()
    if output is None:
        write_stdout(topology.to_json())
        return
    from gpualloc.atomic import write_output

    write_output(output, topology.to_json(), "-o")
    say(f"wrote {output} ({count_of(topology.gpu_count, 'GPU')})")


def export(fmt: str, output: Path | None) -> None:
    """Write the topology as a graph file: a node per GPU, an edge per GPU pair with its link
    class and the bandwidth placement plans by (weight, GB/s one way).

    Example: `gpualloc --topology dgx1-v100 topo export --format graphml -o dgx1.graphml`
    """
    from gpualloc.cli.output import say, write_stdout
    from gpualloc.model.graph_export import export_graph
    from gpualloc.user_files import refuse_overwriting_inputs

    refuse_overwriting_inputs(output, STATE.input_files())
    topology = STATE.load_topology()
    text = export_graph(topology, fmt)
    if output is None:
        write_stdout(text)
        return
    from gpualloc.atomic import write_output

    write_output(output, text, "-o")
    say(f"wrote {output} ({count_of(topology.gpu_count, 'GPU')}, {fmt})")


def _render(topology: Topology, as_json: bool) -> None:
    from gpualloc.cli.output import print_json, print_tables
    from gpualloc.cli.topology_view import LEGEND, describe, provenance_lines, topology_tables

    if as_json:
        print_json(topology.to_json_dict())
        return
    footer = [*LEGEND, "", *provenance_lines(topology)]
    print_tables(topology_tables(topology), heading=describe(topology), footer=footer)


TO_STDOUT = "Write here instead of stdout."
TOPO = Group(
    "topo",
    "What a host looks like: GPUs, NVLink/PCIe links, NUMA nodes.",
    (
        Command("show", show, (JSON,), summary="GPUs, link and bandwidth matrices, NUMA nodes."),
        Command(
            "list",
            list_bundled,
            (json_flag("Print the list as JSON instead."),),
            summary="List the bundled topologies usable with --topology NAME.",
        ),
        Command(
            "import",
            import_text,
            (
                value(
                    "--nvlink",
                    kind="path",
                    metavar="FILE",
                    help="Output of 'nvidia-smi nvlink -s'.",
                ),
                value(
                    "--numa", kind="path", metavar="FILE", help="Output of 'numactl --hardware'."
                ),
                value(
                    "--p2p",
                    kind="path",
                    metavar="FILE",
                    help="Output of 'nvidia-smi topo -p2p r': which pairs have peer access (a "
                    "pair without it copies through host memory). Also read when pasted below "
                    "topo -m.",
                ),
                value(
                    "--output",
                    "-o",
                    kind="path",
                    metavar="OUT",
                    help="Write the topology JSON to OUT.",
                ),
                value(
                    "--name",
                    metavar="NAME",
                    help="Name stored in the topology (default: the file's stem).",
                ),
                value(
                    "--bandwidth-matrix",
                    kind="path",
                    metavar="FILE",
                    help="Measured bandwidth: nvbandwidth output (text or -j JSON), "
                    "p2pBandwidthLatencyTest output, a 'gpu_0 gpu_1 ...' table or JSON rows, "
                    "recognised by content. Its GB/s replace the estimated link bandwidths (the "
                    "matrix used is named on stderr). Alone, it makes a topology of its own.",
                ),
                value(
                    "--mig",
                    kind="path",
                    metavar="FILE",
                    repeat=True,
                    help="MIG layout: output of 'nvidia-smi -L', 'nvidia-smi mig -lgi' or plain "
                    "'nvidia-smi' (its MIG devices table); repeat for several, each is "
                    "recognised by its content. With no topo -m file, 'nvidia-smi -L' alone "
                    "makes the topology.",
                ),
                JSON,
            ),
            Arg("topo_file", "[FILE]", kind="path"),
            summary="Turn recorded nvidia-smi / numactl text into a gpualloc topology.",
        ),
        Command(
            "record",
            record,
            (value("--output", "-o", kind="path", metavar="FILE", help=TO_STDOUT),),
            summary="Save this host's topology to a file (for bug reports).",
        ),
        Command(
            "export",
            export,
            (
                value(
                    "--format",
                    dest="fmt",
                    metavar="FORMAT",
                    default="graphml",
                    completion="graph_formats",
                    help="graphml (yEd, Cytoscape, Gephi, igraph), gexf (Gephi) or json "
                    "(networkx's node-link data, d3).",
                ),
                value("--output", "-o", kind="path", metavar="FILE", help=TO_STDOUT),
            ),
            summary="Write the topology as a graph file (GraphML, GEXF, JSON).",
        ),
    ),
)
