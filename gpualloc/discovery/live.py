"""This host's GPUs as they are now: who runs on them and whether they are healthy, asked in one
NVML session (initialising NVML is the slow part of asking, and ``run`` asks every time)."""

from __future__ import annotations

from contextlib import ExitStack
from typing import TYPE_CHECKING

from msgspec import Struct, field

from gpualloc.discovery.health import live_faults
from gpualloc.discovery.processes import ProcessReport, from_nvidia_smi, from_nvml
from gpualloc.errors import DiscoveryError
from gpualloc.model.topology import GpuFault, Topology

if TYPE_CHECKING:
    from gpualloc.discovery.nvml import NvmlSession


class GpusNow(Struct):
    processes: ProcessReport
    faults: list[GpuFault] = field(default_factory=list)
    health_notes: list[str] = field(default_factory=list)
    """What could not be checked of the GPUs' health (``status`` says it, ``run`` does not)."""


def observe(topology: Topology, *, processes: bool = True, health: bool = True) -> GpusNow:
    """The processes (``processes``) and faults (``health``) of this host's GPUs now."""
    from gpualloc.discovery.nvml import NvmlSession

    with ExitStack() as stack:
        session: NvmlSession | None = None
        if processes or health:
            try:
                session = stack.enter_context(NvmlSession())
            except DiscoveryError:
                session = None  # each probe says what it could not see
        report = live_processes(topology, session) if processes else ProcessReport(source="none")
        faults, notes = live_faults(topology, session) if health else ([], [])
    return GpusNow(report, faults, notes)


def live_processes(topology: Topology, session: NvmlSession | None = None) -> ProcessReport:
    """This host's compute processes: NVML (in ``session`` when one is open, else in one opened
    here), else nvidia-smi, else a note saying that none could be seen (foreign use then goes
    undetected, and the caller says so)."""
    from gpualloc.discovery.nvml import NvmlSession

    problems: list[str] = []
    try:
        if session is not None:
            return from_nvml(topology, session)
        with NvmlSession() as opened:
            return from_nvml(topology, opened)
    except DiscoveryError as problem:  # DiscoveryUnavailable included
        problems.append(str(problem))
    try:
        return from_nvidia_smi(topology)
    except DiscoveryError as problem:
        problems.append(str(problem))
    return ProcessReport(
        notes=[
            f"cannot list GPU processes ({'; '.join(problems)}): GPUs used outside gpualloc "
            "are not detected"
        ]
    )
