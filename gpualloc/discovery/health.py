"""Which GPUs are unhealthy now: never hand out a broken GPU.

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
from typing import TYPE_CHECKING, Any

from gpualloc.discovery.text import text_of
from gpualloc.discovery.xid import xid_faults
from gpualloc.model.printable import count_of
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
            faults += _by_uuid(topology, nvml_faults(session))
        else:
            with NvmlSession() as opened:
                faults += _by_uuid(topology, nvml_faults(opened))
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


LOST = "fell off the bus (NVML: GPU is lost)"


def nvml_faults(session: NvmlSession) -> list[tuple[str | None, int, str, str]]:
    """(UUID, NVML index, kind, detail) of every fault NVML reports now; a check a GPU does
    not support is skipped."""
    nvml = session.nvml
    found: list[tuple[str | None, int, str, str]] = []
    for index in range(session.device_count()):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = text_of(nvml.nvmlDeviceGetUUID(handle))
        except nvml.NVMLError_GpuIsLost:
            found.append((None, index, "lost", LOST))
            continue
        except nvml.NVMLError:
            continue
        found += [(uuid, index, kind, detail) for kind, detail in _faults_of(nvml, handle)]
    return found


def _faults_of(nvml: Any, handle: Any) -> list[tuple[str, str]]:
    def ask(call: Any) -> Any:
        try:
            return call()
        except nvml.NVMLError_GpuIsLost:
            raise
        except (nvml.NVMLError, AttributeError):
            return None  # not supported by this GPU, driver or nvidia-ml-py

    faults: list[tuple[str, str]] = []
    try:
        ecc = ask(
            lambda: nvml.nvmlDeviceGetTotalEccErrors(
                handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
            )
        )
        pending = ask(lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle))
        rows = ask(lambda: nvml.nvmlDeviceGetRemappedRows(handle))
    except nvml.NVMLError_GpuIsLost:
        return [("lost", LOST)]
    if ecc:
        faults.append(
            ("ecc", f"{count_of(ecc, 'uncorrectable ECC error')} since the driver loaded")
        )
    if pending == nvml.NVML_FEATURE_ENABLED:
        faults.append(("retired-pages", "retired memory pages wait for a GPU reset"))
    if rows is not None and len(rows) >= 4:
        if rows[3]:
            faults.append(("remapped-rows", "row remapping failed: the memory is faulty"))
        elif rows[2]:
            faults.append(("remapped-rows", "remapped memory rows wait for a GPU reset"))
    return faults


def _by_uuid(topology: Topology, found: Iterable[tuple[str | None, int, str, str]]) -> list:
    """NVML's (uuid, nvml index, kind, detail) placed on the topology's GPUs. A lost GPU's
    detail says which card it is (its bus id, UUID and serial as discovery last knew them), so
    that whoever reads ``status`` or ``doctor`` knows which one to pull."""
    index_of = {gpu.uuid: gpu.index for gpu in topology.gpus if gpu.uuid}
    faults = []
    for uuid, nvml_index, kind, detail in found:
        gpu = index_of.get(uuid) if uuid else None
        if gpu is None and 0 <= nvml_index < topology.gpu_count:
            gpu = nvml_index
        if gpu is not None:
            if kind == "lost":
                detail = f"{detail}: {topology.gpus[gpu].identity()}"
            faults.append(GpuFault(gpu=gpu, kind=kind, detail=detail))  # type: ignore[arg-type]
    return faults


def _one_per_kind(faults: list[GpuFault]) -> list[GpuFault]:
    unique = {(f.gpu, f.kind): f for f in faults}
    return sorted(unique.values(), key=lambda f: (f.gpu, f.kind))
