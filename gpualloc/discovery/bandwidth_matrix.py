"""Measured GPU-to-GPU bandwidth matrices, so that users can plan on measured numbers.

The outputs of the benchmarks users run are recognised by content (:mod:`gpualloc.measurements`):
``nvbandwidth`` text and ``-j`` JSON, CUDA samples' ``p2pBandwidthLatencyTest`` (its connectivity
matrix is never read as bandwidth; the matrix used is named), and ``nccl-tests`` (refused here:
it measures collectives, not pairs). Two plain formats are read too (GB/s, a row per source GPU):

- the Kubernetes GPU-topology proposal's table (seed 001): a ``gpu_0 gpu_1 ...`` header, then
  rows ``gpu_i v0 v1 ...``, optionally under a ``Bandwidth Matrix:`` title, or a bare
  ``D\\D 0 1 ...`` table;
- JSON: a list of rows ``[[750.48, 48.39, ...], ...]`` (the proposal's CR example).

The diagonal (a GPU's own memory bandwidth) is ignored. Measured matrices are not symmetric (the
proposal's has 4.64 GB/s one way and 16.81 the other); a link's bandwidth is the lower of the two
directions, because a ring or tree moves data both ways and the slower one sets the pace.
"""

from __future__ import annotations

import json
import re

from msgspec.structs import replace

from gpualloc.errors import TopologyError, TopologyParseError
from gpualloc.measurements.provenance import figure
from gpualloc.measurements.recognise import PairwiseCopy, pairwise_copy, read_recording
from gpualloc.model.printable import count_of
from gpualloc.model.topology import Gpu, Link, Provenance, Topology

_ROW_LABEL = re.compile(r"^(?:gpu_?)?(\d+)$", re.IGNORECASE)


def read_bandwidth_matrix(text: str, *, source: str = "<matrix>") -> PairwiseCopy:
    """The one-way GB/s of every GPU pair in ``text``, and which matrix of it was used."""
    recording = read_recording(text, source=source)
    if recording is not None:
        return pairwise_copy(recording)
    return PairwiseCopy(_plain_matrix(text, source), "the file's matrix")


def parse_bandwidth_matrix(text: str, *, source: str = "<matrix>") -> list[list[float]]:
    """The square matrix in ``text``; errors name the line and the token."""
    return read_bandwidth_matrix(text, source=source).matrix


def _plain_matrix(text: str, source: str) -> list[list[float]]:
    stripped = text.strip()
    if stripped.startswith("["):
        return _from_json(stripped, source)
    rows: dict[int, list[float]] = {}
    columns: int | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        tokens = raw.split()
        if not tokens:
            if rows:
                break  # the first matrix ends at a blank line
            continue
        head = tokens[0]
        if columns is None:
            labels = tokens[1:] if head.upper() in ("D\\D", "D/D") else tokens
            if labels and all(_ROW_LABEL.match(t) for t in labels):
                indices = [int(_ROW_LABEL.match(t).group(1)) for t in labels]  # type: ignore[union-attr]
                if indices != list(range(len(indices))):
                    raise TopologyParseError(
                        "matrix columns are not GPUs 0, 1, 2, ... in order",
                        line_number=number,
                        token=raw.strip(),
                        source=source,
                    )
                columns = len(indices)
            continue
        label = _ROW_LABEL.match(head)
        if not label:
            if rows:
                break
            continue
        row = int(label.group(1))
        if row != len(rows):
            raise TopologyParseError(
                f"expected the row of GPU {len(rows)}",
                line_number=number,
                token=head,
                source=source,
            )
        values = tokens[1:]
        if len(values) != columns:
            raise TopologyParseError(
                f"row of GPU {row} has {len(values)} values, the header {columns}",
                line_number=number,
                token=raw.strip(),
                source=source,
            )
        rows[row] = [_number(v, number, source) for v in values]
    if columns is None or not rows:
        raise TopologyParseError(
            "no bandwidth matrix found (expected a 'gpu_0 gpu_1 ...' or 'D\\D 0 1 ...' header)",
            source=source,
        )
    if len(rows) != columns:
        raise TopologyParseError(
            f"{len(rows)} rows for {columns} columns: the matrix is not square", source=source
        )
    return [rows[i] for i in range(columns)]


def _number(token: str, line: int, source: str) -> float:
    return figure(token, line_number=line, source=source, what="a bandwidth in GB/s")


def _from_json(text: str, source: str) -> list[list[float]]:
    from gpualloc.user_files import json_document

    try:
        data = json_document(text)
    except json.JSONDecodeError as exc:
        raise TopologyParseError(
            f"not valid JSON: {exc.msg}", line_number=exc.lineno, source=source
        ) from exc
    if not (isinstance(data, list) and data and all(isinstance(r, list) for r in data)):
        raise TopologyParseError("a JSON matrix is a list of rows", source=source)
    n = len(data)
    matrix = []
    for i, row in enumerate(data):
        if len(row) != n:
            raise TopologyParseError(
                f"row {i} has {count_of(len(row), 'value')} for {count_of(n, 'GPU')}: the matrix "
                "is not square",
                source=source,
            )
        if not all(isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 for v in row):
            raise TopologyParseError(
                f"row {i} holds a value that is not a bandwidth", source=source
            )
        matrix.append([float(v) for v in row])
    return matrix


def link_bandwidths(matrix: list[list[float]]) -> dict[tuple[int, int], float]:
    """Per unordered pair (a < b): the slower of the two directions."""
    n = len(matrix)
    return {(a, b): min(matrix[a][b], matrix[b][a]) for a in range(n) for b in range(a + 1, n)}


def apply_measured_bandwidth(topology: Topology, matrix: list[list[float]]) -> Topology:
    """``topology`` with every link's bandwidth replaced by the measured one."""
    if len(matrix) != topology.gpu_count:
        raise TopologyError(
            f"the bandwidth matrix has {count_of(len(matrix), 'GPU')}, the topology "
            f"{topology.gpu_count}",
            hint="record both on the same host",
        )
    measured = link_bandwidths(matrix)
    links = [replace(link, bandwidth_gbps=measured[(link.a, link.b)]) for link in topology.links]
    provenance = replace(topology.provenance, bandwidth="measured")
    return replace(topology, links=links, provenance=provenance)


def topology_from_bandwidth_matrix(
    matrix: list[list[float]], *, name: str, origin: str
) -> Topology:
    """A topology that knows only the measured bandwidths (link kinds unknown)."""
    n = len(matrix)
    measured = link_bandwidths(matrix)
    return Topology(
        name=name,
        gpus=[Gpu(index=i) for i in range(n)],
        links=[Link(a=a, b=b, bandwidth_gbps=bw) for (a, b), bw in sorted(measured.items())],
        provenance=Provenance(
            source="file",
            origin=origin,
            bandwidth="measured",
            notes=["link kinds and NUMA affinity unknown: only a bandwidth matrix was given"],
        ),
    ).validated()
