"""NUMA nodes from ``numactl --hardware`` text or from sysfs (``/sys/devices/system/node``).

``parse_numactl_hardware`` is pure; ``read_sysfs_numa`` reads a directory tree (a fake root in
tests); ``discover_numa`` runs ``numactl -H`` and falls back to sysfs.
"""

from __future__ import annotations

import re
from pathlib import Path

from gpualloc.discovery.text import is_comment_or_prompt
from gpualloc.errors import TopologyParseError
from gpualloc.model.cpuset import bounded_id, parse_cpulist
from gpualloc.model.printable import count_of
from gpualloc.model.topology import NumaNode

_AVAILABLE = re.compile(r"^available: (\d+) nodes? \(([0-9,\-]*)\)\s*$")
_CPUS = re.compile(r"^node (\d+) cpus:(.*)$")
_SIZE = re.compile(r"^node (\d+) size: (\d+) (kB|MB|GB)\s*$")
_FREE = re.compile(r"^node (\d+) free: ")
_DIST_HEADER = re.compile(r"^node(\s+\d+)+\s*$")
_DIST_ROW = re.compile(r"^\s*(\d+):((\s+\d+)+)\s*$")
_UNIT_BYTES = {"kB": 1024, "MB": 1024**2, "GB": 1024**3}

SYSFS_NODE_ROOT = Path("/sys/devices/system/node")


def parse_numactl_hardware(text: str, *, source: str | None = None) -> list[NumaNode]:
    """Parse ``numactl --hardware``; CPU-less nodes (GPU memory on coherent hosts) are kept."""
    cpus: dict[int, list[int]] = {}
    sizes: dict[int, int] = {}
    distances: dict[int, dict[int, int]] = {}
    header: list[int] | None = None
    declared: list[int] | None = None
    for number, raw in enumerate(text.replace("\r\n", "\n").split("\n"), start=1):
        line = raw.rstrip()
        if not line.strip() or line.strip() == "node distances:" or _FREE.match(line):
            continue
        if is_comment_or_prompt(line):
            continue
        if match := _AVAILABLE.match(line):
            declared = _node_list(match.group(2), number, source) if match.group(2) else []
        elif match := _CPUS.match(line):
            ids = match.group(2).split()
            if not all(i.isdigit() for i in ids):
                bad = next(i for i in ids if not i.isdigit())
                raise TopologyParseError(
                    "CPU id is not a number", line_number=number, token=bad, source=source
                )
            cpus[int(match.group(1))] = [_cpu_id(i, number, source) for i in ids]
        elif match := _SIZE.match(line):
            sizes[int(match.group(1))] = int(match.group(2)) * _UNIT_BYTES[match.group(3)]
        elif _DIST_HEADER.match(line):
            header = [int(t) for t in line.split()[1:]]
        elif (match := _DIST_ROW.match(line)) and header is not None:
            values = [int(t) for t in match.group(2).split()]
            if len(values) != len(header):
                raise TopologyParseError(
                    f"distance row has {count_of(len(values), 'value')} for "
                    f"{count_of(len(header), 'node')}",
                    line_number=number,
                    source=source,
                )
            distances[int(match.group(1))] = dict(zip(header, values, strict=True))
        elif "No NUMA available" in line:
            return []
        else:
            raise TopologyParseError(
                "not a line of 'numactl --hardware' output",
                line_number=number,
                token=line.strip(),
                source=source,
                hint="record it with: numactl --hardware > numa.txt",
            )
    if not cpus:
        raise TopologyParseError(
            "no 'node N cpus:' lines; is this 'numactl --hardware' output?", source=source
        )
    if declared is not None and sorted(cpus) != declared:
        raise TopologyParseError(
            f"'available:' declares nodes {declared} but cpus are listed for {sorted(cpus)}",
            source=source,
        )
    return [
        NumaNode(
            id=node,
            cpus=cpus[node],
            memory_total_bytes=sizes.get(node),
            distances=distances.get(node, {}),
        )
        for node in sorted(cpus)
    ]


def _node_list(text: str, number: int, source: str | None) -> list[int]:
    """The ``available:`` line's node list, bounded before it is expanded: a range
    such as ``0-99999999999`` would otherwise be built id by id."""
    try:
        return parse_cpulist(text, what="NUMA node id")
    except ValueError as exc:
        raise TopologyParseError(
            f"'available:' {exc}", line_number=number, token=_short(text), source=source
        ) from None


def _cpu_id(digits: str, number: int, source: str | None) -> int:
    try:
        return bounded_id(digits)
    except ValueError as exc:
        raise TopologyParseError(
            str(exc), line_number=number, token=_short(digits), source=source
        ) from None


def _short(token: str) -> str:
    return token if len(token) <= 40 else f"{token[:40]}... ({len(token)} characters)"


def read_sysfs_numa(root: Path = SYSFS_NODE_ROOT) -> list[NumaNode]:
    """Read NUMA nodes from sysfs; an absent tree (kernel without NUMA) gives []."""
    if not root.is_dir():
        return []
    entries = sorted(root.glob("node[0-9]*"), key=lambda p: int(p.name[4:]))
    ids = [int(entry.name[4:]) for entry in entries]
    nodes = []
    for node_id, entry in zip(ids, entries, strict=True):
        cpulist = _read(entry / "cpulist")
        row = [int(v) for v in _read(entry / "distance").split()]
        nodes.append(
            NumaNode(
                id=node_id,
                cpus=parse_cpulist(cpulist) if cpulist else [],
                memory_total_bytes=_meminfo_total(_read(entry / "meminfo")),
                distances=dict(zip(ids, row, strict=True)) if len(row) == len(ids) else {},
            )
        )
    return nodes


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _meminfo_total(text: str) -> int | None:
    match = re.search(r"MemTotal:\s+(\d+) kB", text)
    return int(match.group(1)) * 1024 if match else None


def discover_numa(notes: list[str]) -> list[NumaNode]:
    """This host's NUMA nodes: ``numactl -H`` if installed, else sysfs; notes say which failed."""
    import shutil  # here: reading a recorded topology (doctor) runs no process
    import subprocess

    numactl = shutil.which("numactl")
    if numactl:
        try:
            completed = subprocess.run(
                [numactl, "--hardware"], capture_output=True, text=True, timeout=10, check=True
            )
            return parse_numactl_hardware(completed.stdout, source="numactl --hardware")
        except (OSError, subprocess.SubprocessError, TopologyParseError) as exc:
            notes.append(f"numactl --hardware failed ({exc}); NUMA read from sysfs")
    nodes = read_sysfs_numa()
    if not nodes:
        notes.append("no NUMA information (no numactl, no /sys/devices/system/node)")
    return nodes
