"""Who runs compute work on the GPUs now: NVML's running-process lists, or a recorded list.

The ledger knows what gpualloc handed out; this module sees what actually runs, so that a GPU
used by someone who never asked gpualloc counts as busy. On this host the
answer comes from NVML (``nvmlDeviceGetComputeRunningProcesses`` per GPU), else from
``nvidia-smi --query-compute-apps``; a recorded or bundled topology answers with the processes
its file declares (``processes``), so that all of this is testable without a GPU.

Processes are matched to the topology's GPUs by UUID, so a topology recorded earlier on this
host still lines up; by NVML index when a GPU has no UUID.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from msgspec import Struct, field

from gpualloc.discovery.running_process import RunningProcess
from gpualloc.model.topology import GpuProcess, Topology

if TYPE_CHECKING:
    from gpualloc.discovery.nvml import NvmlSession

MIB = 1024 * 1024


class ProcessReport(Struct):
    """The compute processes seen on the GPUs, and what could not be seen."""

    processes: list[GpuProcess] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    source: str = "none"
    """``nvml``, ``nvidia-smi``, ``topology`` (declared in a recorded file) or ``none``."""
    memory_used: dict[int, int] = field(default_factory=dict)
    """GPU index -> memory in use as NVML reports it (``nvmlDeviceGetMemoryInfo``), for GPUs
    it could be asked about; shared jobs check their memory against it."""
    utilization: dict[int, int] = field(default_factory=dict)
    """GPU index -> percent of the last sample period a kernel ran
    (``nvmlDeviceGetUtilizationRates``), for GPUs that could be asked; idle leases are found
    with it."""

    def on_gpu(self, index: int) -> list[GpuProcess]:
        return [p for p in self.processes if p.gpu == index]


def declared_processes(topology: Topology) -> ProcessReport:
    """The processes a recorded or bundled topology declares."""
    return ProcessReport(
        processes=list(topology.processes),
        source="topology",
        utilization={u.gpu: u.percent for u in topology.utilization},
    )


def from_nvml(topology: Topology, session: NvmlSession) -> ProcessReport:
    """The processes, memory in use and utilisation NVML reports in ``session`` (the caller
    opens it: :mod:`.live` asks NVML once per command for all of it)."""
    processes = match_processes(topology, session.compute_processes())
    by_uuid = {gpu.uuid: gpu.index for gpu in topology.gpus if gpu.uuid}
    memory, busy = {}, {}
    for uuid, (used, percent) in session.gpu_usage().items():
        if uuid in by_uuid and used is not None:
            memory[by_uuid[uuid]] = used
        if uuid in by_uuid and percent is not None:
            busy[by_uuid[uuid]] = percent
    return ProcessReport(processes, source="nvml", memory_used=memory, utilization=busy)


def from_nvidia_smi(topology: Topology) -> ProcessReport:
    """The processes ``nvidia-smi --query-compute-apps`` lists (no memory or utilisation)."""
    from gpualloc.discovery.smi import run_nvidia_smi

    text = run_nvidia_smi(
        "--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits"
    )
    return ProcessReport(
        match_processes(topology, parse_compute_apps_csv(text)), source="nvidia-smi"
    )


def parse_compute_apps_csv(text: str) -> list[RunningProcess]:
    """``nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader,
    nounits`` (memory in MiB; ``[N/A]`` where unknown)."""
    import csv  # not on the path of a recorded or bundled topology
    import io

    found: list[RunningProcess] = []
    for row in csv.reader(io.StringIO(text)):
        cells = [cell.strip() for cell in row]
        if len(cells) < 2 or not cells[1].isdigit():
            continue
        memory = cells[2] if len(cells) > 2 else ""
        found.append(
            RunningProcess(
                nvml_index=-1,
                uuid=cells[0] or None,
                pid=int(cells[1]),
                used_memory_bytes=int(memory) * MIB if memory.isdigit() else None,
            )
        )
    return found


def match_processes(topology: Topology, running: Iterable[RunningProcess]) -> list[GpuProcess]:
    """Place NVML's entries on the topology's GPUs (by UUID, else by index) and name them."""
    by_uuid = {gpu.uuid: gpu.index for gpu in topology.gpus if gpu.uuid}
    processes: list[GpuProcess] = []
    for entry in running:
        index = by_uuid.get(entry.uuid) if entry.uuid else None
        if index is None and 0 <= entry.nvml_index < topology.gpu_count:
            index = entry.nvml_index
        if index is None:
            continue
        name, user = describe_pid(entry.pid)
        processes.append(
            GpuProcess(
                gpu=index,
                pid=entry.pid,
                name=name,
                user=user,
                used_memory_bytes=entry.used_memory_bytes,
                gpu_instance=entry.gpu_instance,
                compute_instance=entry.compute_instance,
            )
        )
    return processes


def describe_pid(pid: int) -> tuple[str | None, str | None]:
    """The command name and user of ``pid``, where this process may see them."""
    import psutil

    try:
        process = psutil.Process(pid)
        with process.oneshot():
            name = process.name()
            try:
                user = process.username()
            except (psutil.AccessDenied, KeyError):
                user = None
        return name, user
    except psutil.Error:
        return None, None  # another pid namespace (a container), or gone meanwhile
