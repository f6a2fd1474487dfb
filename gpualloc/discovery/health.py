"""Which GPUs are unhealthy now (issue 21, point 2): never hand out a broken GPU.

Checked on every allocation on this host, like the process lists (a GPU's health changes while
the topology does not), from two sources:

- NVML, per GPU: the GPU is lost (``NVMLError_GpuIsLost``, fallen off the bus);
  uncorrectable ECC errors since the driver loaded (``nvmlDeviceGetTotalEccErrors``,
  uncorrected, volatile); retired pages waiting for a reset
  (``nvmlDeviceGetRetiredPagesPendingStatus``); row remapping pending or failed
  (``nvmlDeviceGetRemappedRows``, A100 and later). A check the GPU does not support is skipped.
- The kernel log (``/dev/kmsg``, readable by root, or by everyone where ``dmesg_restrict`` is
  0): ``NVRM: Xid (PCI:0000:3b:00): 79, ...`` lines since boot with one of the Xid codes that
  NVIDIA's Xid catalogue says need a GPU reset or mean a hardware fault (:mod:`.xid`).
  NVML has no query for past Xids (only an event stream while one waits), so the log is the one
  place they persist; DCGM, which watches the stream, is not assumed.

A recorded or bundled topology declares its faults (``faults`` in its file) instead.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

from gpualloc.discovery.xid import xid_faults
from gpualloc.model.topology import GpuFault, Topology

if TYPE_CHECKING:
    from gpualloc.discovery.nvml import NvmlSession

KMSG = "/dev/kmsg"


def read_kernel_log(path: str = KMSG) -> str:
    """Every record of the kernel's log buffer (non-blocking). Raises OSError when it cannot be
    read (``dmesg_restrict``)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    records = []
    try:
        while True:
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overwritten while reading: skip to the next
                    continue
                raise
            if not record:
                break
            records.append(record.decode(errors="replace").split(";", 1)[-1])
    finally:
        os.close(fd)
    return "".join(records)


def live_faults(
    topology: Topology, session: NvmlSession | None = None
) -> tuple[list[GpuFault], list[str]]:
    """This host's faults now (NVML, in ``session`` when one is open; the kernel log), and
    notes on what could not be checked."""
    from gpualloc.discovery.nvml import NvmlSession
    from gpualloc.errors import DiscoveryError

    faults: list[GpuFault] = []
    notes: list[str] = []
    try:
        if session is not None:
            faults += _by_uuid(topology, session.health_faults())
        else:
            with NvmlSession() as opened:
                faults += _by_uuid(topology, opened.health_faults())
    except DiscoveryError as problem:
        notes.append(f"GPU health not checked with NVML ({problem})")
    try:
        faults += xid_faults(topology, read_kernel_log())
    except OSError as exc:
        notes.append(
            f"Xid errors not checked: cannot read {KMSG} ({exc.strerror}; root can, or "
            "sysctl kernel.dmesg_restrict=0)"
        )
    return _one_per_kind(faults), notes


def _by_uuid(topology: Topology, found: Iterable[tuple[str | None, int, str, str]]) -> list:
    """NVML's (uuid, nvml index, kind, detail) placed on the topology's GPUs."""
    index_of = {gpu.uuid: gpu.index for gpu in topology.gpus if gpu.uuid}
    faults = []
    for uuid, nvml_index, kind, detail in found:
        gpu = index_of.get(uuid) if uuid else None
        if gpu is None and 0 <= nvml_index < topology.gpu_count:
            gpu = nvml_index
        if gpu is not None:
            faults.append(GpuFault(gpu=gpu, kind=kind, detail=detail))  # type: ignore[arg-type]
    return faults


def _one_per_kind(faults: list[GpuFault]) -> list[GpuFault]:
    unique = {(f.gpu, f.kind): f for f in faults}
    return sorted(unique.values(), key=lambda f: (f.gpu, f.kind))
