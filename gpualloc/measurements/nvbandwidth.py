"""NVIDIA ``nvbandwidth``: its text output and its ``-j`` JSON.

Each testcase prints ``Running NAME.``, a description such as ``memcpy CE GPU(row) <- GPU(column)
bandwidth (GB/s)``, a header of column indices, one row per row index (``N/A`` where a pair is
not measured, e.g. the diagonal), and ``SUM NAME value``. The description says which way the data
went: ``A(row) -> B(column)`` from row to column, ``A(row) <- B(column)`` from column to row,
``<->`` both ways at once, where nvbandwidth reports the rate of one direction while the other
runs (its README, "Bidirectional tests"). ``memcpy local GPU(column)`` is a GPU's copy within its
own memory. Host testcases print a single row (the host) with a column per GPU.

A testcase nvbandwidth waived (one GPU, no peer access) prints no matrix; the JSON says
``"status": "Waived"``; both become a note of the recording.
"""

from __future__ import annotations

import re

from gpualloc.errors import TopologyParseError
from gpualloc.measurements.provenance import figure, split_provenance, unquoted
from gpualloc.measurements.records import (
    CutTable,
    Endpoints,
    PairMatrix,
    Pattern,
    Recording,
    matrix_recording,
)
from gpualloc.model.printable import count_of

_DESCRIPTION = re.compile(
    r"^(?P<what>memcpy|memory latency)\s+(?P<engine>CE|SM)?\s*"
    r"(?:(?P<row>CPU|GPU)\(row\)\s*(?P<arrow><->|->|<-)\s*(?P<column>CPU|GPU)\(column\)"
    r"|local GPU\(column\))"
    r".*\((?P<unit>GB/s|ns|us)\)\s*$"
)
_RUNNING = re.compile(r"^Running (\w+)\.?\s*$")
_SUM = re.compile(r"^SUM (\w+)\s+\S+")
_DEVICE = re.compile(r"^Device (\d+): (.+?)(?: \(([0-9a-fA-F:.]+)\))?\s*$")


def looks_like_nvbandwidth(text: str) -> bool:
    return "nvbandwidth" in text or any(
        _DESCRIPTION.match(unquoted(line).strip()) for line in text.splitlines()
    )


def read_nvbandwidth(text: str, *, source: str) -> Recording:
    """Every testcase of an nvbandwidth text or JSON output."""
    provenance, lines = split_provenance(text)
    body = "\n".join(lines).strip()
    if body.startswith("{"):
        return _read_json(body, source=source, provenance=provenance)
    lines = [unquoted(line).rstrip() for line in lines]
    matrices: list[PairMatrix] = []
    devices: dict[int, str] = {}
    notes: list[str] = []
    running: str | None = None
    number = 0
    while number < len(lines):
        line = lines[number].strip()
        number += 1
        if match := _RUNNING.match(line):
            running = match.group(1)
        elif match := _DEVICE.match(line):
            devices[int(match.group(1))] = match.group(2)
        elif line.endswith("Waived.") or line.startswith("WAIVED"):
            notes.append(f"{running or 'a testcase'}: waived")
        elif _DESCRIPTION.match(line):
            title_line = number
            try:
                grid, number = _grid(lines, number)
            except CutTable as cut:
                notes.append(f"line {title_line}: {running or line}: {cut}; not read")
                continue
            name = running or _sum_name(lines, number) or "unnamed"
            matrices.append(_matrix(name, line, grid, source=source, line_number=number))
            running = None
    return matrix_recording(
        "nvbandwidth",
        source=source,
        provenance=provenance,
        devices=devices,
        matrices=matrices,
        notes=notes,
    )


def _grid(lines: list[str], start: int) -> tuple[list[list[str]], int]:
    """The header and rows after a description: cells as text; where the table ends."""
    number = start
    while number < len(lines) and not lines[number].strip():
        number += 1
    header = lines[number].split() if number < len(lines) else []
    if not header or not all(token.isdigit() for token in header):
        raise CutTable("no column header under the description")
    rows: list[list[str]] = []
    for line in lines[number + 1 :]:
        tokens = line.split()
        if not tokens or not tokens[0].isdigit() or len(tokens) < 2:
            break
        if int(tokens[0]) != len(rows) or len(tokens) - 1 != len(header):
            raise CutTable(
                f"row {tokens[0]} has {len(tokens) - 1} values for {len(header)} columns"
            )
        rows.append(tokens[1:])
    if not rows:
        raise CutTable("a header with no rows under it")
    return rows, number + 1 + len(rows)


def _sum_name(lines: list[str], start: int) -> str | None:
    """The testcase named by the ``SUM`` line just after a table (when ``Running`` is absent)."""
    for line in lines[start : start + 3]:
        if match := _SUM.match(line.strip()):
            return match.group(1)
    return None


def _matrix(
    name: str, description: str, cells: list[list[str]], *, source: str, line_number: int
) -> PairMatrix:
    match = _DESCRIPTION.match(description.strip())
    if match is None:
        raise TopologyParseError(
            f"testcase {name}: an nvbandwidth description gpualloc does not know",
            token=description.strip(),
            source=source,
        )
    values = [[_cell(cell, source, line_number) for cell in row] for row in cells]
    row, arrow, column = match.group("row"), match.group("arrow"), match.group("column")
    unit = match.group("unit")
    endpoints: Endpoints
    pattern: Pattern = "latency" if unit != "GB/s" else "one-way"
    if row is None:
        endpoints = "gpu-local"
    elif row == "GPU" and column == "GPU":
        endpoints = "gpu-to-gpu"
        if len(values) != len(values[0]):
            raise TopologyParseError(
                f"testcase {name}: {count_of(len(values), 'row')} for "
                f"{count_of(len(values[0]), 'GPU')}, not square",
                source=source,
            )
        if arrow == "<-":
            values = [list(column_values) for column_values in zip(*values, strict=True)]
        for index in range(len(values)):
            values[index][index] = None
    elif arrow == "<->":
        endpoints = "host-gpu-both"
    else:
        host_sends = (row == "CPU") == (arrow == "->")
        endpoints = "host-to-gpu" if host_sends else "gpu-to-host"
        if row == "GPU":  # one column (the host) per GPU row: a figure per GPU in one row
            values = [[r[0] for r in values]] if len(values[0]) == 1 else values
    if arrow == "<->" and pattern != "latency":
        pattern = "bidirectional-each"
    return PairMatrix(
        testcase=name,
        title=description.strip(),
        endpoints=endpoints,
        pattern=pattern,
        unit=unit,
        values=values,
        engine=match.group("engine") or "",
    )


def _cell(token: str, source: str, line_number: int) -> float | None:
    if token.upper() == "N/A":
        return None
    return figure(token, line_number=line_number, source=source)


def _read_json(body: str, *, source: str, provenance: dict[str, str]) -> Recording:
    from gpualloc.user_files import json_document

    try:
        document = json_document(body)
        testcases = document["nvbandwidth"]["testcases"]
    except (ValueError, KeyError, TypeError) as exc:
        raise TopologyParseError(
            f"not nvbandwidth -j output ({type(exc).__name__}: {exc})", source=source
        ) from None
    matrices: list[PairMatrix] = []
    notes: list[str] = []
    for case in testcases:
        name = str(case.get("name", "unnamed"))
        status = case.get("status", "Passed")
        if status != "Passed" or "bandwidth_matrix" not in case:
            notes.append(f"{name}: {str(status).lower()}")
            continue
        cells = [[str(cell) for cell in row] for row in case["bandwidth_matrix"]]
        description = str(case.get("bandwidth_description", ""))
        matrices.append(_matrix(name, description, cells, source=source, line_number=0))
    if not matrices:
        raise TopologyParseError("an nvbandwidth -j output with no passed testcase", source=source)
    return Recording(
        tool="nvbandwidth",
        source=source,
        provenance=provenance,
        matrices=tuple(matrices),
        notes=tuple(notes),
    )
