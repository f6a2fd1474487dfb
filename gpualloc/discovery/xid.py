"""``NVRM: Xid`` lines of the kernel log: which ones mean the GPU must not be handed out.

The driver logs ``NVRM: Xid (PCI:<domain>:<bus>:<device>[ GPU-I:..]): <code>, <message>``
(after a ``[seconds]`` stamp in dmesg, a syslog prefix in /var/log/syslog). NVIDIA's Xid catalogue
(docs.nvidia.com/deploy/xid-errors, "Analyzing Xid Errors with the Xid Catalog"; for memory
errors "GPU Memory Error Management", "User Visible Statistics") gives each code a resolution
bucket: codes whose immediate action is a GPU reset, a node drain or support (the hardware)
are faults here (:data:`CRITICAL_XIDS`); codes whose action is to restart the application
(13 graphics exception, 31 MMU fault, 32 corrupted push buffer, 43 channel stopped, 45
preemptive teardown, 109 context-switch timeout, ...) are the program's, not the GPU's.

Checked against real lines (``tests/fixtures/measured/xid``): 13, 31, 32, 45, 109 (not faults),
48 (double-bit ECC), 63 (a row remap *recorded*: not a fault by itself; NVML's "remapping
pending" flag says when a reset is due), 119 (GSP RPC timeout), and the NVLink-5 codes 144-150,
whose message says ``Fatal`` or ``Nonfatal``: only a fatal one is a fault.
"""

from __future__ import annotations

import re

from msgspec import Struct

from gpualloc.model.topology import GpuFault, Topology

CRITICAL_XIDS: dict[int, str] = {
    48: "double-bit ECC error",
    62: "internal micro-controller halt",
    64: "ECC page retirement or row remapping failed",
    74: "NVLink error",
    79: "fell off the bus",
    92: "high single-bit ECC error rate",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}
"""Codes that are a fault whatever their message."""

NVLINK5_XIDS: dict[int, str] = {
    144: "NVLink SAW error",
    145: "NVLink RLW error",
    146: "NVLink TLW error",
    147: "NVLink TREX error",
    148: "NVLink NVLPW error",
    149: "NVLink NETIR error",
    150: "NVLink MSE error",
}
"""Blackwell-era NVLink codes: a fault when the driver calls the event ``Fatal``."""

_XID = re.compile(
    r"NVRM: Xid \(PCI:([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+)[^)]*\): (\d+),\s?([^\n]*)"
)
_FATAL = re.compile(r"\bFatal\b")


class XidEvent(Struct, frozen=True):
    device: str
    """PCI ``domain:bus:device``, upper case."""
    code: int
    message: str


def xid_events(text: str) -> list[XidEvent]:
    """Every ``NVRM: Xid`` line of kernel log text, in order."""
    return [
        XidEvent(match[1].upper(), int(match[2]), match[3].strip()) for match in _XID.finditer(text)
    ]


def parse_xid_errors(text: str) -> list[tuple[str, int]]:
    """Kernel log text -> (PCI ``domain:bus:device``, Xid) of every ``NVRM: Xid`` line."""
    return [(event.device, event.code) for event in xid_events(text)]


def fault_of(event: XidEvent) -> str | None:
    """What is wrong with the GPU, or None when the event is the program's or benign."""
    if event.code in CRITICAL_XIDS:
        return CRITICAL_XIDS[event.code]
    if event.code in NVLINK5_XIDS and _FATAL.search(event.message):
        return f"{NVLINK5_XIDS[event.code]} (fatal)"
    return None


def xid_faults(topology: Topology, log: str) -> list[GpuFault]:
    """One fault per GPU with a critical Xid in ``log`` (the latest code, and how many)."""
    by_device = {_device_of(gpu.pci_bus_id): gpu.index for gpu in topology.gpus if gpu.pci_bus_id}
    seen: dict[int, list[tuple[int, str]]] = {}
    for event in xid_events(log):
        gpu = by_device.get(_device_of(event.device))
        fault = fault_of(event)
        if gpu is not None and fault is not None:
            seen.setdefault(gpu, []).append((event.code, fault))
    faults = []
    for gpu, found in sorted(seen.items()):
        code, fault = found[-1]
        count = f" ({len(found)} critical Xid errors since boot)" if len(found) > 1 else ""
        faults.append(GpuFault(gpu=gpu, kind="xid", detail=f"Xid {code}: {fault}{count}"))
    return faults


def _device_of(bus_id: str) -> tuple[int, int, int]:
    """``00000000:3B:00.0`` or ``0000:3b:00`` -> (domain, bus, device) as numbers."""
    domain, bus, device = bus_id.split(".")[0].split(":")[-3:]
    return int(domain, 16), int(bus, 16), int(device, 16)
