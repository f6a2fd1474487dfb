"""The Alibaba GPU cluster trace of 2023 ("openb") as jobs for ``gpualloc simulate``.

The pod list behind the FGD paper (Weng et al., "Beware of Fragmentation: Scheduling
GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC'23; alibaba/clusterdata,
``cluster-trace-gpu-v2023``) is recognised by its header (``name,cpu_milli,memory_mib,num_gpu,
gpu_milli,...``) and read as it is:

- ``num_gpu`` -> GPUs; a task with none is skipped (counted: ``no GPU``);
- ``gpu_milli`` below 1000 on a 1-GPU task -> the share of one GPU it asks
  (:attr:`SimJob.gpu_fraction`);
- arrival = ``creation_time``; run time = ``deletion_time`` - ``scheduled_time``, the time the
  cluster ran it (a pod never scheduled is skipped: ``never scheduled``);
- ``qos`` -> priority class: ``LS`` (latency-sensitive, the cluster's own first class) and
  Kubernetes' ``Guaranteed`` -> high, ``Burstable`` -> normal, ``BE`` (best effort) -> low; any
  other class -> normal (counted);
- ``gpu_spec`` (allowed GPU models, ``|``-separated; empty = any) is honoured when it names the
  host's model (the task may run here); a spec that names only other models is ignored, so that
  the task still runs here, and counted;
- bandwidth sensitivity is not in the trace: a task of 2+ GPUs is sensitive, as ``run``'s
  default has it.

Lines starting with ``#`` before the header (a fixture's provenance) are skipped.
"""

from __future__ import annotations

import csv
import io
from collections import Counter
from dataclasses import dataclass, field

from gpualloc.errors import TraceError
from gpualloc.model.printable import count_of
from gpualloc.simulate.trace import MAX_SECONDS, SimJob, shown

COLUMNS = (
    "name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos", "pod_phase",
    "creation_time", "deletion_time", "scheduled_time",
)  # fmt: skip
QOS_PRIORITY = {"LS": "high", "Guaranteed": "high", "Burstable": "normal", "BE": "low"}
RECOGNISED_BY = COLUMNS[:5]
"""The columns that make a file the pod list, whatever follows them: a pod list without its
times is then told what it lacks, not asked for gpualloc's own columns
(tests/test_trace_openb.py::test_the_header_is_what_recognises_it)."""
NEEDED = ("name", "num_gpu", "gpu_milli", "creation_time", "deletion_time", "scheduled_time")
NODE_LIST = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
"""The header of the trace's other file, ``openb_node_list_gpu_node.csv``: its GPU nodes."""


@dataclass
class OpenbTrace:
    jobs: list[SimJob]
    skipped: Counter[str] = field(default_factory=Counter)
    """Why tasks were left out, and how many."""
    counted: Counter[str] = field(default_factory=Counter)
    """What was read with a default (unknown QoS, a gpu_spec of other models), and how many."""

    def notes(self) -> list[str]:
        lines = [
            f"{count_of(count, 'task')} skipped: {why}"
            for why, count in sorted(self.skipped.items())
        ]
        lines += [
            f"{count_of(count, 'task')}: {what}" for what, count in sorted(self.counted.items())
        ]
        return lines


def _body(text: str) -> str:
    lines = text.splitlines(keepends=True)
    while lines and lines[0].startswith("#"):
        lines.pop(0)
    return "".join(lines)


def _header(text: str) -> tuple[str, ...]:
    return tuple(column.strip() for column in _body(text).split("\n", 1)[0].strip().split(","))


def looks_like_openb(text: str) -> bool:
    header = _header(text)
    return header[: len(RECOGNISED_BY)] == RECOGNISED_BY or header == NODE_LIST


def _check_header(text: str, source: str) -> None:
    header = _header(text)
    if header == NODE_LIST:
        raise TraceError(
            f"{source}: this is the Alibaba trace's node list (its GPU nodes), not its pod list",
            hint="give the pod list, openb_pod_list_default.csv: the tasks to simulate",
        )
    missing = [column for column in NEEDED if column not in header]
    if missing:
        raise TraceError(
            f"{source}: this Alibaba pod list lacks {', '.join(missing)}: a simulation needs "
            "when each task arrives and how long it runs",
            hint="use a pod list with creation_time, scheduled_time and deletion_time "
            "(openb_pod_list_default.csv has them), or write gpualloc's own trace: id, "
            "arrival_s, gpus, duration_s, sensitive",
        )


def read_openb(text: str, *, source: str, host_model: str | None = None) -> OpenbTrace:
    """The trace's tasks that run on GPUs, as jobs (see the module docstring)."""
    _check_header(text, source)
    trace = OpenbTrace(jobs=[])
    reader = csv.DictReader(io.StringIO(_body(text), newline=""))
    for number, row in enumerate(reader, start=2):
        where = f"{source}:{number}"
        gpus = _integer(row, "num_gpu", where)
        if gpus == 0:
            trace.skipped["no GPU"] += 1
            continue
        if not (row.get("scheduled_time") or "").strip():
            trace.skipped["never scheduled"] += 1
            continue
        created = _integer(row, "creation_time", where)
        scheduled = _integer(row, "scheduled_time", where)
        deleted = _integer(row, "deletion_time", where)
        if deleted < scheduled or scheduled < created:
            raise TraceError(f"{where}: times out of order (created, scheduled, deleted)")
        milli = _integer(row, "gpu_milli", where)
        fraction = milli / 1000 if gpus == 1 and 0 < milli < 1000 else None
        qos = (row.get("qos") or "").strip()
        if qos not in QOS_PRIORITY:
            trace.counted[f"QoS {qos or '(none)'} read as normal priority"] += 1
        spec = [m.strip() for m in (row.get("gpu_spec") or "").split("|") if m.strip()]
        if spec and host_model and not any(m.lower() in host_model.lower() for m in spec):
            trace.counted["gpu_spec names other GPU models (ignored)"] += 1
        trace.jobs.append(
            SimJob(
                id=str(row["name"]),
                arrival_s=float(created),
                gpus=gpus,
                duration_s=float(deleted - scheduled),
                sensitive=gpus > 1,
                priority=QOS_PRIORITY.get(qos, "normal"),
                gpu_fraction=fraction,
                order=len(trace.jobs),
            )
        )
    if not trace.jobs:
        raise TraceError(f"{source}: no task asks for a GPU", hint="is this the openb pod list?")
    trace.jobs.sort(key=lambda job: (job.arrival_s, job.order))
    return trace


def _integer(row: dict[str, str], name: str, where: str) -> int:
    value = (row.get(name) or "").strip()
    try:
        number = int(value)
    except ValueError:  # a word, or more digits than Python converts
        raise TraceError(f"{where}: {name} {shown(value)} is not a whole number") from None
    if number < 0:
        raise TraceError(f"{where}: {name} {shown(value)} is negative")
    if number > MAX_SECONDS:
        raise TraceError(f"{where}: {name} {shown(value)} is above {MAX_SECONDS:g}")
    return number


def coarse_mix(jobs: list[SimJob]) -> dict[tuple[int, float], float]:
    """The jobs' task types with parts of a GPU rounded to the nearest of 10, 25 and 50 %, and
    their shares: what :data:`gpualloc.placement.sharing.fragmentation.DEFAULT_MIX` holds for
    the trace."""
    from gpualloc.placement.sharing.fragmentation import task_mix

    def nearest(part: float) -> float:
        return min((0.1, 0.25, 0.5), key=lambda p: abs(p - part))

    return task_mix(
        (j.gpus, 1.0 if j.gpu_fraction is None else nearest(j.gpu_fraction)) for j in jobs
    )
