"""``nccl-tests`` output (``all_reduce_perf`` and the other ``*_perf`` collectives).

A run prints ``# nThread .. nGpus ..``, one ``#  Rank N [Group G] Pid P on HOST device D
[BUS] NAME`` line per rank, a per-size table (``size count type redop [root] time algbw busbw
#wrong|error`` out of place, then the same in place) and ``# Avg bus bandwidth : X``. Older
releases have no ``root`` column and print ``error`` instead of ``#wrong``; both are read. A
file may hold several runs (each ends at its ``Avg bus bandwidth`` line), and people keep the
command line above each: from it come the collective's name (``all_reduce_perf``), the GPU count
(``-g N``), ``CUDA_VISIBLE_DEVICES`` and ``NCCL_P2P_DISABLE=1``.

The GPUs a run used: the ``Rank`` lines' device numbers, mapped through ``CUDA_VISIBLE_DEVICES``
when the command set it (the ranks see the visible devices renumbered from 0), so a run on GPUs
4-7 is attributed to 4-7. With neither, the GPUs are not known and :attr:`CollectiveRun.gpus` is
None. Bus bandwidth (busbw) is algorithm bandwidth scaled so that it compares with the links'
rate whatever the collective and GPU count (nccl-tests' PERFORMANCE.md), which is why it is the
figure checked against a predicted ring bandwidth.
"""

from __future__ import annotations

import re

from gpualloc.errors import TopologyParseError
from gpualloc.measurements.provenance import split_provenance, unquoted
from gpualloc.measurements.records import CollectiveRow, CollectiveRun, Recording

_RANK = re.compile(
    r"^#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+(\d+)\s+"
    r"\[([^\]]*)\]\s*(.*)$"
)
_AVERAGE = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*([0-9.eE+-]+)")
_THREADS = re.compile(r"^#\s*nThread\s+\d+\s+nGpus\s+(\d+)")
_BANNER = re.compile(r"^#\s*Collective test starting:\s*(\w+?)_perf")
_COMMAND = re.compile(r"(?:^|[\s/])(\w+?)_perf(?:\s|$)")
_VISIBLE = re.compile(r"CUDA_VISIBLE_DEVICES=([0-9,]+)")
_GPUS_FLAG = re.compile(r"(?:^|\s)(?:-g|--ngpus)\s+(\d+)")
_P2P_OFF = re.compile(r"NCCL_P2P_DISABLE=1")


def looks_like_nccl_tests(text: str) -> bool:
    return "Avg bus bandwidth" in text or ("busbw" in text and "algbw" in text)


class _Run:
    """What has been read of the run in progress."""

    def __init__(self) -> None:
        self.command: str | None = None
        self.operation: str | None = None
        self.ranks: list[tuple[str, int, str, str]] = []
        self.threads_gpus: int | None = None
        self.rows: list[CollectiveRow] = []

    def started(self) -> bool:
        return bool(self.rows or self.ranks)


def read_nccl_tests(text: str, *, source: str) -> Recording:
    """Every complete run in an nccl-tests output."""
    provenance, raw = split_provenance(text)
    runs: list[CollectiveRun] = []
    notes: list[str] = []
    run = _Run()
    for number, original in enumerate(raw, start=1):
        line = unquoted(original).strip()
        if match := _AVERAGE.match(line):
            runs.append(_finish(run, float(match.group(1)), source))
            run = _Run()
        elif match := _RANK.match(line):
            host, device, bus, name = match.group(2, 3, 4, 5)
            run.ranks.append((host, int(device), bus, name.strip()))
        elif match := _THREADS.match(line):
            run.threads_gpus = int(match.group(1))
        elif match := _BANNER.match(line):
            run.operation = match.group(1)
        elif not line.startswith("#") and (row := _row(line, number, source)) is not None:
            run.rows.append(row)
        elif _COMMAND.search(line) and not line.startswith("#"):
            if run.started():
                notes.append(f"line {number}: a run cut before its 'Avg bus bandwidth' line")
                run = _Run()
            run.command = line.rstrip("\\").strip()
            run.operation = _COMMAND.search(line).group(1)  # type: ignore[union-attr]
        elif run.command is not None and original.rstrip().endswith("\\"):
            run.command += " " + line.rstrip("\\").strip()
    if run.rows:
        notes.append("the last run has no 'Avg bus bandwidth' line: it may be cut; not read")
    if not runs:
        raise TopologyParseError(
            "an nccl-tests output with no complete run (no '# Avg bus bandwidth' line)",
            source=source,
            hint="save the whole output of the *_perf command to the file",
        )
    return Recording(
        tool="nccl-tests",
        source=source,
        provenance=provenance,
        collectives=tuple(runs),
        notes=tuple(notes),
    )


def _row(line: str, number: int, source: str) -> CollectiveRow | None:
    """A table row (12 cells, or 13 with ``root``), or None for any other line."""
    tokens = line.split()
    if len(tokens) not in (12, 13) or not (tokens[0].isdigit() and tokens[1].isdigit()):
        return None
    offset = len(tokens) - 12  # 1 where the root column is there
    try:
        algbw, busbw = float(tokens[5 + offset]), float(tokens[6 + offset])
        in_place_algbw, in_place_busbw = float(tokens[9 + offset]), float(tokens[10 + offset])
    except ValueError:
        raise TopologyParseError(
            "an nccl-tests row with a cell that is not a number",
            line_number=number,
            token=line,
            source=source,
        ) from None
    return CollectiveRow(int(tokens[0]), algbw, busbw, in_place_algbw, in_place_busbw)


def _finish(run: _Run, average: float, source: str) -> CollectiveRun:
    if not run.rows:
        raise TopologyParseError(
            "an 'Avg bus bandwidth' line with no table above it: the output is cut",
            source=source,
        )
    command = run.command or ""
    visible = _VISIBLE.search(command)
    visible_gpus = [int(g) for g in visible.group(1).split(",")] if visible else None
    gpus: tuple[int, ...] | None = None
    hosts = tuple(dict.fromkeys(host for host, _, _, _ in run.ranks))
    if run.ranks and len(hosts) == 1:
        devices = [device for _, device, _, _ in run.ranks]
        if visible_gpus is not None and all(d < len(visible_gpus) for d in devices):
            devices = [visible_gpus[d] for d in devices]
        gpus = tuple(devices)
    elif not run.ranks and visible_gpus is not None:
        gpus = tuple(visible_gpus)
    flag = _GPUS_FLAG.search(command)
    count = (
        len(run.ranks)
        if run.ranks
        else len(gpus)
        if gpus is not None
        else int(flag.group(1))
        if flag
        else run.threads_gpus or 0
    )
    if count < 1:
        raise TopologyParseError(
            "an nccl-tests run whose GPU count is not printed (no 'Rank' lines, no '-g N')",
            source=source,
            hint="keep the command line or the '# Using devices' block in the file",
        )
    return CollectiveRun(
        operation=run.operation,
        gpu_count=count,
        gpus=gpus,
        bus_ids=tuple(bus for _, _, bus, _ in run.ranks),
        hosts=hosts,
        gpu_names=tuple(dict.fromkeys(name for _, _, _, name in run.ranks)),
        p2p_disabled=bool(_P2P_OFF.search(command)),
        command=run.command,
        rows=tuple(run.rows),
        average_busbw=average,
    )
