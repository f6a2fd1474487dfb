"""This host's GPUs as they are now: who runs on them and whether they are healthy, asked in one
NVML session (initialising NVML is the slow part of asking, and ``run`` asks every time)."""

from __future__ import annotations

from contextlib import ExitStack

from msgspec import Struct, field

from gpualloc.discovery.health import live_faults
from gpualloc.discovery.processes import ProcessReport, live_processes
from gpualloc.errors import DiscoveryError
from gpualloc.model.topology import GpuFault, Topology


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
