"""CUDA samples' ``p2pBandwidthLatencyTest``: every matrix it prints, by its section title.

The test prints, in order: ``P2P Connectivity Matrix`` (1 where a GPU can map the other's
memory), ``Unidirectional P2P=Disabled Bandwidth Matrix (GB/s)``, ``Unidirectional P2P=Enabled
Bandwidth (P2P Writes) Matrix (GB/s)`` (and ``(P2P Reads)`` with ``--p2p_read``), the two
``Bidirectional`` matrices, and the ``P2P=Disabled`` / ``P2P=Enabled`` latency matrices (us), each
with a ``GPU`` and a ``CPU`` table. Rows are ``D\\D 0 1 ...`` headed; row ``i`` column ``j`` is the
copy from GPU ``i`` to GPU ``j``; the diagonal is a GPU's copy within its own memory, not a pair.

Bidirectional figures are the two directions added (the sample times both copies together and
counts both), so a pair's one-way rate under load is half of it. Where a pair has no P2P access,
the "P2P=Enabled" figures are staged copies too: the sample falls back to a normal memcpy.

The connectivity matrix is 0/1, not bandwidth: an importer that took the file's first matrix
whatever its title read it as GB/s
(tests/test_measurements.py::test_p2p_connectivity_is_never_read_as_bandwidth).
"""

from __future__ import annotations

import re

from gpualloc.measurements.provenance import split_provenance, unquoted
from gpualloc.measurements.records import CutTable, PairMatrix, Pattern, Recording, matrix_recording
from gpualloc.model.printable import count_of

_SECTION = re.compile(
    r"^(?:(?P<direction>Unidirectional|Bidirectional)\s+)?"
    r"P2P=(?P<p2p>Enabled|Disabled)\s+(?P<what>Bandwidth|Latency)\s*"
    r"(?:\(P2P (?P<access>Writes|Reads)\)\s*)?Matrix\s*\((?P<unit>GB/s|us)\)\s*$"
)
_CONNECTIVITY = "P2P Connectivity Matrix"
_HEADER = ("D\\D", "D/D", "GPU", "CPU")
_DEVICE = re.compile(r"^Device: (\d+), (.+?), pciBusID: (\w+)")


def looks_like_p2p_test(text: str) -> bool:
    return "P2P=Enabled" in text or "P2P=Disabled" in text or _CONNECTIVITY in text


def read_p2p_test(text: str, *, source: str) -> Recording:
    """Every complete matrix of a p2pBandwidthLatencyTest output."""
    provenance, raw = split_provenance(text)
    lines = [unquoted(line).strip() for line in raw]
    matrices: list[PairMatrix] = []
    devices: dict[int, str] = {}
    notes: list[str] = []
    for number, line in enumerate(lines):
        if match := _DEVICE.match(line):
            devices[int(match.group(1))] = match.group(2)
            continue
        section = _SECTION.match(line)
        if section is None and line != _CONNECTIVITY:
            continue
        try:
            values = _table(lines, number + 1)
        except CutTable as cut:
            notes.append(f"line {number + 1}: {line}: {cut}; not read")
            continue
        if section is not None:
            matrices.append(_section(section, line, values))
        else:
            matrices.append(
                PairMatrix(
                    testcase="p2p_connectivity",
                    title=line,
                    endpoints="gpu-to-gpu",
                    pattern="connectivity",
                    unit="",
                    values=_off_diagonal(values),
                )
            )
    return matrix_recording(
        "p2pBandwidthLatencyTest",
        source=source,
        provenance=provenance,
        devices=devices,
        matrices=matrices,
        notes=notes,
    )


def _section(match: re.Match[str], title: str, values: list[list[float]]) -> PairMatrix:
    direction = (match.group("direction") or "").lower()
    p2p = match.group("p2p") == "Enabled"
    access = (match.group("access") or "").lower()
    latency = match.group("what") == "Latency"
    pattern: Pattern = (
        "latency" if latency else "bidirectional-sum" if direction == "bidirectional" else "one-way"
    )
    state = "enabled" if p2p else "disabled"
    parts = [direction, "p2p", state, "latency" if latency else "", access]
    return PairMatrix(
        testcase="_".join(part for part in parts if part),
        title=title,
        endpoints="gpu-to-gpu",
        pattern=pattern,
        unit=match.group("unit"),
        values=_off_diagonal(values),
        p2p=p2p,
    )


def _table(lines: list[str], start: int) -> list[list[float]]:
    """The square table under a title (its ``D\\D``/``GPU`` header at ``start``)."""
    header = lines[start].split() if start < len(lines) else []
    if not header or header[0] not in _HEADER or not all(t.isdigit() for t in header[1:]):
        raise CutTable("no 'D\\D 0 1 ...' header under the title")
    columns = len(header) - 1
    rows: list[list[float]] = []
    for line in lines[start + 1 :]:
        tokens = line.split()
        if not tokens or not tokens[0].isdigit():
            break
        if int(tokens[0]) != len(rows) or len(tokens) - 1 != columns:
            raise CutTable(
                f"row {tokens[0]} has {count_of(len(tokens) - 1, 'value')} for "
                f"{count_of(columns, 'GPU')}"
            )
        try:
            rows.append([float(token) for token in tokens[1:]])
        except ValueError:
            raise CutTable(f"row {tokens[0]} holds a value that is not a number") from None
    if len(rows) != columns:
        raise CutTable(f"{count_of(len(rows), 'row')} for {count_of(columns, 'GPU')}")
    return rows


def _off_diagonal(values: list[list[float]]) -> list[list[float | None]]:
    return [
        [None if a == b else value for b, value in enumerate(row)] for a, row in enumerate(values)
    ]
