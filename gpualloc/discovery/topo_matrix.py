"""Parser for ``nvidia-smi topo -m`` (``--matrix``) text.

Pure: ``parse_topo_matrix(text) -> TopoMatrix``; running nvidia-smi is :mod:`.smi`'s job.

Real outputs differ in many ways (see tests/fixtures/topologies): raw ANSI underline codes on the
header (or the same codes pasted as literal ``^[[4m``), tabs or spaces or broken alignment, NIC
columns named ``NIC<n>`` with a NIC legend or ``mlx5_<n>`` without one, ``CPU Affinity`` /
``NUMA Affinity`` / ``GPU NUMA ID`` columns with ranges, lists, empty and ``N/A`` values, the old
``SOC`` class, 1 to 16 GPUs, prompt lines or truncation around the table, and a header in which two
device names run together because one fills its column (``mlx5_2mlx5_3``). So the parser splits
cells on tabs when the line has them and on whitespace otherwise, never on column offsets, and
cross-checks what it reads: the row labels must repeat the header's in order, every matrix cell
must be a known class, the diagonal must be ``X`` and the matrix symmetric. Anything else is a
:class:`~gpualloc.errors.TopologyParseError` naming the line and the token, never a wrong topology.
"""

from __future__ import annotations

import re

from msgspec import Struct, field

from gpualloc.errors import TopologyParseError
from gpualloc.model.cpuset import cpulist_ranges, is_cpulist
from gpualloc.model.printable import count_of
from gpualloc.user_files import shown_value

ANSI_ESCAPE = re.compile(r"(\x1b|\^\[)\[[0-9;]*m")
"""SGR codes, raw (ESC [ 4 m) or as pasted text (``^[[4m``)."""

AFFINITY_COLUMNS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_AFFINITY_HEADER = re.compile("|".join(re.escape(c) for c in AFFINITY_COLUMNS))
_GPU_LABEL = re.compile(r"^GPU(\d+)$")
_DEVICE_LABEL = re.compile(r"^[A-Za-z][A-Za-z0-9_.:-]*$")
_LINK_CELL = re.compile(r"^(NV(\d+)|PIX|PXB|PHB|NODE|SYS|SOC)$")
_LEGEND_ENTRY = re.compile(r"^\s*(\S+)\s*=\s*(.+?)\s*$")
_NIC_LEGEND_ENTRY = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")


class MatrixRow(Struct):
    """One row of the matrix: its label, its cells in header order, and affinity values."""

    label: str
    line_number: int
    cells: list[str]
    affinity: dict[str, str]


class TopoMatrix(Struct):
    """What ``nvidia-smi topo -m`` printed, checked but not yet interpreted."""

    devices: list[str]
    affinity_columns: list[str]
    rows: list[MatrixRow]
    header_line: int
    legend: dict[str, str] = field(default_factory=dict)
    nic_legend: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def gpu_labels(self) -> list[str]:
        return [d for d in self.devices if _GPU_LABEL.match(d)]

    @property
    def gpu_count(self) -> int:
        return len(self.gpu_labels)

    def row(self, label: str) -> MatrixRow | None:
        return next((r for r in self.rows if r.label == label), None)

    def cell(self, a: str, b: str) -> str:
        """The cell in row ``a``, column ``b``."""
        row = self.row(a)
        if row is None:
            raise KeyError(a)
        return row.cells[self.devices.index(b)]


def strip_ansi(text: str) -> str:
    return ANSI_ESCAPE.sub("", text)


def parse_topo_matrix(
    text: str, *, source: str | None = None, require_complete: bool = True
) -> TopoMatrix:
    """Parse ``nvidia-smi topo -m`` output.

    With ``require_complete`` (the default) every GPU row must be present; a truncated output
    raises. ``require_complete=False`` returns the rows that are there, for inspection.
    """
    lines = strip_ansi(text).replace("\r\n", "\n").split("\n")
    header_index = _find_header(lines, source)
    devices, affinity_columns = _parse_header(lines[header_index], header_index + 1, source)
    devices, unglued = _unglue(devices, _row_labels(lines[header_index + 1 :]))
    matrix = TopoMatrix(
        devices=devices, affinity_columns=affinity_columns, rows=[], header_line=header_index + 1
    )
    if unglued:
        matrix.notes.append(
            "header names run together, split by the row labels: "
            + ", ".join(f"{glued} -> {' '.join(parts)}" for glued, parts in unglued)
        )
    index = header_index + 1
    while index < len(lines) and len(matrix.rows) < len(devices):
        if not lines[index].strip():
            # Tolerate blank lines pasted between rows, but end the matrix at any other blank.
            following = next((i for i in range(index, len(lines)) if lines[i].strip()), None)
            expected = devices[len(matrix.rows)]
            if following is None or lines[following].split()[0] != expected:
                break
            index = following
        matrix.rows.append(_parse_row(matrix, lines[index], index + 1, source))
        index += 1
    _parse_legends(matrix, lines[index:])
    _check_symmetric(matrix, source)
    _check_complete(matrix, lines, source, require_complete)
    return matrix


def _find_header(lines: list[str], source: str | None) -> int:
    for number, line in enumerate(lines):
        tokens = line.split()
        if len(tokens) >= 2 and tokens[0] == "GPU0" and tokens[1] != "X":
            return number
        if tokens == ["GPU0"]:
            return number
    raise TopologyParseError(
        "no header row starting with 'GPU0' found; is this 'nvidia-smi topo -m' output?",
        source=source,
        hint="record it with: nvidia-smi topo -m > topo.txt",
    )


def _parse_header(line: str, line_number: int, source: str | None) -> tuple[list[str], list[str]]:
    affinity = list(_AFFINITY_HEADER.finditer(line))
    device_part = line[: affinity[0].start()] if affinity else line
    tail = line[affinity[-1].end() :] if affinity else ""
    between = [line[affinity[i].end() : affinity[i + 1].start()] for i in range(len(affinity) - 1)]
    for stray in [tail, *between]:
        if stray.strip():
            raise TopologyParseError(
                "unexpected text among the affinity column headers",
                line_number=line_number,
                token=stray.strip(),
                source=source,
            )
    devices = device_part.split()
    for position, label in enumerate(devices):
        if not _DEVICE_LABEL.match(label):
            raise TopologyParseError(
                "not a device label in the header",
                line_number=line_number,
                token=label,
                source=source,
            )
        gpu = _GPU_LABEL.match(label)
        if gpu and int(gpu.group(1)) != position:
            raise TopologyParseError(
                f"GPU columns must run GPU0, GPU1, ... in order; column {position + 1} is",
                line_number=line_number,
                token=label,
                source=source,
            )
    gpu_count = sum(1 for d in devices if _GPU_LABEL.match(d))
    if any(_GPU_LABEL.match(d) for d in devices[gpu_count:]):
        raise TopologyParseError(
            "GPU columns must come before NIC columns", line_number=line_number, source=source
        )
    return devices, [m.group(0) for m in affinity]


def _row_labels(lines: list[str]) -> list[str]:
    """The first token of each line of the matrix after the header (blank lines skipped, up to
    the legend): the devices in the order the rows name them."""
    labels = []
    for line in lines:
        tokens = line.split()
        if not tokens:
            continue
        if tokens[0] == "Legend:" or not _DEVICE_LABEL.match(tokens[0]):
            break
        labels.append(tokens[0])
    return labels


def _unglue(
    devices: list[str], row_labels: list[str]
) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """``devices`` with each header name that is several row labels run together split into
    them (nvidia-smi pads names to a column width and prints no separator after a name that
    fills it: ``mlx5_2mlx5_3``), and what was split. Only a split that turns the header into
    exactly the rows' labels is taken; anything else is left for the row checks to report."""
    if devices == row_labels or not row_labels:
        return devices, []
    split: list[str] = []
    unglued: list[tuple[str, list[str]]] = []
    position = 0
    for name in devices:
        parts: list[str] = []
        joined = ""
        while position < len(row_labels) and name.startswith(joined + row_labels[position]):
            joined += row_labels[position]
            parts.append(row_labels[position])
            position += 1
            if joined == name:
                break
        if joined != name:
            return devices, []
        split += parts
        if len(parts) > 1:
            unglued.append((name, parts))
    if split != row_labels[: len(split)] or not unglued:
        return devices, []
    return split, unglued


def _split_row(line: str) -> tuple[str, list[str], bool]:
    """Label, the remaining fields, and whether the fields came from tab-splitting."""
    if "\t" in line:
        fields = line.split("\t")
        return fields[0].strip(), [f.strip() for f in fields[1:]], True
    tokens = line.split()
    return (tokens[0] if tokens else ""), tokens[1:], False


def _parse_row(matrix: TopoMatrix, line: str, line_number: int, source: str | None) -> MatrixRow:
    expected = matrix.devices[len(matrix.rows)]
    label, fields, tabbed = _split_row(line)
    if label != expected:
        raise TopologyParseError(
            f"expected the row of {expected} (rows repeat the header's devices in order)",
            line_number=line_number,
            token=label,
            source=source,
        )
    ndev = len(matrix.devices)
    cells = fields[:ndev]
    if len(cells) < ndev:
        raise TopologyParseError(
            f"row {label} has {count_of(len(cells), 'matrix cell')}; the header names "
            f"{count_of(ndev, 'device')}",
            line_number=line_number,
            source=source,
            hint="the output may be truncated or re-wrapped; record it again",
        )
    for column, cell in enumerate(cells):
        diagonal = matrix.devices[column] == label
        if diagonal and cell != "X":
            raise TopologyParseError(
                f"the diagonal cell of {label} must be 'X'",
                line_number=line_number,
                token=cell,
                source=source,
            )
        if not diagonal and not _LINK_CELL.match(cell):
            raise TopologyParseError(
                f"row {label}, column {matrix.devices[column]}: not a link class "
                "(X, NV#, PIX, PXB, PHB, NODE, SYS, SOC)",
                line_number=line_number,
                token=cell,
                source=source,
                hint="cells merged or split by a copy-paste? record the output again",
            )
    affinity = _assign_affinity(
        matrix.affinity_columns, fields[ndev:], tabbed, label, line_number, source
    )
    return MatrixRow(label=label, line_number=line_number, cells=cells, affinity=affinity)


def _assign_affinity(
    columns: list[str],
    values: list[str],
    tabbed: bool,
    label: str,
    line_number: int,
    source: str | None,
) -> dict[str, str]:
    values = list(values)
    if tabbed and columns and columns[-1] == "GPU NUMA ID" and len(values) > len(columns):
        # nvidia-smi separates "GPU NUMA ID" from "NUMA Affinity" with two tabs.
        last = values.pop()
        while len(values) > len(columns) - 1 and values and values[-1] == "":
            values.pop()
        values.append(last)
    while len(values) > len(columns) and values[-1] == "":
        values.pop()
    if len(values) > len(columns):
        raise TopologyParseError(
            f"row {label} has more values than the header has columns",
            line_number=line_number,
            token=values[len(columns)],
            source=source,
        )
    values += [""] * (len(columns) - len(values))
    assigned = dict(zip(columns, values, strict=True))
    for column, value in assigned.items():
        if value in ("", "N/A"):
            continue
        valid = value.isdigit() if column == "GPU NUMA ID" else is_cpulist(value)
        if not valid:
            raise TopologyParseError(
                f"row {label}: not a valid {column} value",
                line_number=line_number,
                token=value,
                source=source,
            )
        try:  # bounded from the numbers alone, before anything expands the list
            cpulist_ranges(value, what="CPU id" if column == "CPU Affinity" else "NUMA node id")
        except ValueError as exc:
            raise TopologyParseError(
                f"row {label}: {column}: {exc}",
                line_number=line_number,
                token=_short(value),
                source=source,
            ) from None
    return assigned


def _short(token: str) -> str:
    return token if len(token) <= 40 else f"{token[:40]}... ({len(token)} characters)"


def _parse_legends(matrix: TopoMatrix, lines: list[str]) -> None:
    section = None
    for line in lines:
        stripped = line.strip()
        if stripped == "Legend:":
            section = "legend"
        elif stripped == "NIC Legend:":
            section = "nic"
        elif section == "legend" and (entry := _LEGEND_ENTRY.match(line)):
            matrix.legend[entry.group(1)] = entry.group(2)
        elif section == "nic" and (entry := _NIC_LEGEND_ENTRY.match(line)):
            matrix.nic_legend[entry.group(1)] = entry.group(2)


def _check_symmetric(matrix: TopoMatrix, source: str | None) -> None:
    by_label = {row.label: row for row in matrix.rows}
    for row in matrix.rows:
        for column, cell in enumerate(row.cells):
            other = by_label.get(matrix.devices[column])
            if other is None or other is row:
                continue
            mirror = other.cells[matrix.devices.index(row.label)]
            if _normalise(mirror) != _normalise(cell):
                later = max(row, other, key=lambda r: r.line_number)
                raise TopologyParseError(
                    f"matrix not symmetric: {row.label}->{other.label} is {shown_value(cell)} but "
                    f"{other.label}->{row.label} is {shown_value(mirror)}",
                    line_number=later.line_number,
                    token=mirror if later is other else cell,
                    source=source,
                )


def _normalise(cell: str) -> str:
    return "SYS" if cell == "SOC" else cell


def _check_complete(
    matrix: TopoMatrix, lines: list[str], source: str | None, require_complete: bool
) -> None:
    present = {row.label for row in matrix.rows}
    missing_gpus = [g for g in matrix.gpu_labels if g not in present]
    missing_nics = [d for d in matrix.devices if d not in present and d not in missing_gpus]
    if missing_gpus and require_complete:
        last = matrix.rows[-1] if matrix.rows else None
        after = f"after row {last.label}" if last else "after the header"
        raise TopologyParseError(
            f"the matrix stops {after}: rows {missing_gpus[0]}..{missing_gpus[-1]} are missing",
            line_number=last.line_number if last else matrix.header_line,
            source=source,
            hint="the output was truncated; record the whole 'nvidia-smi topo -m' output",
        )
    if missing_nics and not missing_gpus:
        matrix.notes.append(
            f"rows of {count_of(len(missing_nics), 'NIC')} missing from the matrix (truncated "
            "output?)"
        )
    if not any(line.strip() == "Legend:" for line in lines):
        matrix.notes.append("no legend after the matrix")
