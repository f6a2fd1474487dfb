"""This host's bandwidth from NVIDIA's own tools, run now or recorded earlier.

- :class:`Nvbandwidth`: ``nvbandwidth -t device_to_device_memcpy_write_ce`` (CUDA copy engines,
  one copy at a time; NVIDIA/nvbandwidth), the copy matrix when torch is not installed.
- :func:`measure_collectives`: ``all_reduce_perf`` (NVIDIA/nccl-tests) over the GPU sets
  placement weighs: every pair, each NUMA node's GPUs, and all of them. Each run gets its GPUs
  through ``CUDA_VISIBLE_DEVICES`` with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, so that CUDA numbers
  them as NVML does.
- :func:`from_recordings`: outputs of nvbandwidth, p2pBandwidthLatencyTest or nccl-tests saved
  on this host (``calibrate --from``), read by :mod:`gpualloc.measurements`.

Every tool's output goes through the same parsers as a recording, so a figure measured now and
one imported mean the same thing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone

from gpualloc.discovery.cache import CacheKey
from gpualloc.discovery.calibration import Calibration, CalibrationUnavailable, MeasuredCollective
from gpualloc.errors import TopologyError, TopologyParseError
from gpualloc.measurements.degraded import below_link_class, p2p_slower_than_staged
from gpualloc.measurements.recognise import pairwise_copy, read_recording
from gpualloc.measurements.records import Finding, Recording
from gpualloc.model.printable import count_of
from gpualloc.model.topology import Topology

NVBANDWIDTH_TESTCASE = "device_to_device_memcpy_write_ce"
ALL_REDUCE_BYTES = 256 * 2**20
"""One message size, large enough that the bus bandwidth has settled (nccl-tests' tables reach
their plateau from a few hundred MiB on the recordings' hosts)."""
TOOL_TIMEOUT_S = 600


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _run_tool(argv: list[str], gpus: Sequence[int] | None = None) -> str:
    """A tool's standard output; its failure is one line naming it."""
    env = dict(os.environ, CUDA_DEVICE_ORDER="PCI_BUS_ID")
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
    try:
        done = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CalibrationUnavailable(f"{argv[0]} did not run: {exc}") from None
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise CalibrationUnavailable(f"{' '.join(argv)} exited {done.returncode}: {last[0]}")
    return done.stdout


class Nvbandwidth:
    """The copy matrix from ``nvbandwidth`` on PATH."""

    def __init__(self) -> None:
        path = shutil.which("nvbandwidth")
        if path is None:
            raise CalibrationUnavailable(
                "cannot measure: neither torch nor nvbandwidth is installed",
                hint="pip install torch (a CUDA build), or build NVIDIA's nvbandwidth and put "
                "it on PATH; or import earlier outputs: gpualloc calibrate --from FILE",
            )
        self.path = path

    def matrix(self, count: int) -> list[list[float]]:
        output = _run_tool([self.path, "-t", NVBANDWIDTH_TESTCASE])
        recording = read_recording(output, source="nvbandwidth")
        if recording is None:
            raise CalibrationUnavailable("nvbandwidth printed nothing gpualloc can read")
        matrix = pairwise_copy(recording).matrix
        if len(matrix) != count:
            raise CalibrationUnavailable(
                f"nvbandwidth measured {count_of(len(matrix), 'GPU')}, NVML sees {count}",
                hint="unset CUDA_VISIBLE_DEVICES so that every GPU is measured",
            )
        return matrix


def measure_with_nvbandwidth(
    key: CacheKey, ordinals: Mapping[int, int] | None = None
) -> Calibration:
    """nvbandwidth's copy matrix, its CUDA devices (bus order) put back in NVML's order by
    ``ordinals`` (:meth:`~gpualloc.model.topology.Topology.cuda_ordinals`)."""
    measured = Nvbandwidth().matrix(len(key.gpu_uuids))
    ordinal = ordinals or {}
    count = len(measured)
    cuda = [ordinal.get(gpu, gpu) for gpu in range(count)]
    matrix = [[measured[cuda[a]][cuda[b]] for b in range(count)] for a in range(count)]
    return Calibration(
        gpu_uuids=key.gpu_uuids,
        driver_version=key.driver_version,
        method=f"nvbandwidth {NVBANDWIDTH_TESTCASE}",
        size_bytes=0,
        repeats=0,
        measured_at=_now(),
        matrix=[[round(v, 3) for v in row] for row in matrix],
        sources=["nvbandwidth"],
    )


def collective_sets(topology: Topology) -> list[tuple[int, ...]]:
    """The GPU sets whose all-reduce placement weighs: every pair, each NUMA node's GPUs (when
    more than two), and all of them."""
    gpus = [g.index for g in topology.gpus]
    sets: list[tuple[int, ...]] = [(a, b) for i, a in enumerate(gpus) for b in gpus[i + 1 :]]
    by_node: dict[int, list[int]] = {}
    for gpu in topology.gpus:
        if gpu.numa_node is not None:
            by_node.setdefault(gpu.numa_node, []).append(gpu.index)
    sets += [tuple(members) for members in by_node.values() if 2 < len(members) < len(gpus)]
    if len(gpus) > 2:
        sets.append(tuple(gpus))
    return list(dict.fromkeys(sets))


def all_reduce_perf() -> str | None:
    return shutil.which("all_reduce_perf")


def measure_collectives(
    tool: str,
    sets: Sequence[tuple[int, ...]],
    *,
    progress: Callable[[tuple[int, ...]], None] = lambda gpus: None,
    ordinals: Mapping[int, int] | None = None,
) -> list[MeasuredCollective]:
    """``all_reduce_perf`` over each set of GPUs (one process driving them, ``-g K``), each
    named to CUDA by its number in bus order (``ordinals``; default its index)."""
    found = []
    number = ordinals or {}
    for gpus in sets:
        progress(gpus)
        size = str(ALL_REDUCE_BYTES)
        visible = [number.get(g, g) for g in gpus]
        output = _run_tool([tool, "-b", size, "-e", size, "-g", str(len(gpus))], visible)
        recording = read_recording(output, source="all_reduce_perf")
        if recording is None or not recording.collectives:
            raise CalibrationUnavailable("all_reduce_perf printed no result gpualloc can read")
        run = recording.collectives[-1]
        found.append(
            MeasuredCollective(
                gpus=tuple(gpus), busbw_gbps=run.largest.busbw, source="all_reduce_perf"
            )
        )
    return found


def from_recordings(
    texts: Sequence[tuple[str, str]], key: CacheKey, estimated: Topology
) -> Calibration:
    """A calibration of this host from tool outputs (``(name, text)`` pairs) saved on it.

    The copy matrix is the first file's that has one; nccl-tests runs become collectives (a run
    whose GPUs are not printed counts only when it used them all); ``estimated`` (this host's
    topology, estimated bandwidths) is what the degraded-pair check compares with.
    """
    count = len(key.gpu_uuids)
    matrix: list[list[float]] = []
    method = ""
    collectives: list[MeasuredCollective] = []
    findings: list[Finding] = []
    for name, text in texts:
        recording = read_recording(text, source=name)
        if recording is None:
            raise TopologyParseError(
                "not an output of nvbandwidth, p2pBandwidthLatencyTest or nccl-tests",
                source=name,
            )
        collectives += _collectives(recording, count, name)
        if recording.tool == "nccl-tests":
            continue
        findings += p2p_slower_than_staged(recording)
        copy = pairwise_copy(recording)
        if len(copy.matrix) != count:
            raise TopologyError(
                f"{name}: {count_of(len(copy.matrix), 'GPU')} measured, this host has {count}",
                hint="import outputs made on this host with every GPU visible",
            )
        findings += below_link_class(recording, estimated)
        if not matrix:
            matrix, method = copy.matrix, f"{recording.tool} {copy.used} from {name}"
    if not matrix and not collectives:
        raise TopologyError("the files hold no GPU pair and no collective of this host")
    return Calibration(
        gpu_uuids=key.gpu_uuids,
        driver_version=key.driver_version,
        method=method or "collectives only",
        size_bytes=0,
        repeats=0,
        measured_at=_now(),
        matrix=matrix,
        collectives=collectives,
        findings=list({(f.kind, f.gpus): f for f in findings}.values()),
        sources=[name for name, _ in texts],
    )


def _collectives(recording: Recording, count: int, name: str) -> list[MeasuredCollective]:
    found = []
    for run in recording.collectives:
        if not run.single_host:
            continue
        gpus = run.gpus if run.gpus is not None else None
        if gpus is None and run.gpu_count == count:
            gpus = tuple(range(count))
        if gpus is None or any(g >= count for g in gpus):
            continue
        found.append(
            MeasuredCollective(
                gpus=gpus,
                busbw_gbps=run.largest.busbw,
                operation=run.operation or "all_reduce",
                p2p_disabled=run.p2p_disabled,
                source=name,
            )
        )
    return found
