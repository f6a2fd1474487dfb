"""Naming a GPU that fell off the bus, so that an administrator knows which card to pull.

NVML answers nothing about a lost GPU once it has tripped (``NVML_ERROR_GPU_IS_LOST`` from the
handle, the UUID, even the PCI info), while it still counts it. What names the card comes, in
this order, from:

- NVML itself, when the GPU was lost while it was read: discovery asks its bus id, UUID, name
  and serial first (:meth:`gpualloc.discovery.nvml.NvmlSession._identity`);
- the kernel: ``/sys/bus/pci/drivers/nvidia`` lists every PCI device the driver holds, a lost
  GPU included (it stays bound until it is removed); the one display controller there that no
  answering GPU is, is the lost one (only when exactly one GPU is unnamed: NVML's order is not
  always bus order, so two could not be told apart);
- the last discovery of this host (the topology cache): the same bus id, or, where no UUID of
  the GPUs that answer has moved, the same NVML index. Its UUID and serial are the card's.
"""

from __future__ import annotations

import re
from pathlib import Path

from msgspec.structs import replace

from gpualloc.model.topology import Gpu, Health, Topology

NVIDIA_DRIVER = Path("/sys/bus/pci/drivers/nvidia")
_BDF = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_DISPLAY_CLASS = "0x03"
"""PCI base class 03 (display controller): GPUs are 0x0300 (VGA) or 0x0302 (3D); NVSwitches,
which the driver may also hold, are bridges (0x0680)."""


def nvidia_gpu_bus_ids() -> list[str]:
    """The bus ids of the display controllers the nvidia driver holds (empty where
    :data:`NVIDIA_DRIVER` cannot be read: no driver, a container without /sys)."""
    from gpualloc.discovery.nvml import normalise_bus_id

    try:
        entries = sorted(NVIDIA_DRIVER.iterdir())
    except OSError:
        return []
    found = []
    for entry in entries:
        if not _BDF.match(entry.name):
            continue
        try:
            pci_class = (entry / "class").read_text().strip().lower()
        except OSError:
            continue
        if pci_class.startswith(_DISPLAY_CLASS):
            found.append(normalise_bus_id(entry.name))
    return found


def name_lost_gpus(
    topology: Topology,
    previous: Topology | None,
    bound: list[str],
    *,
    same_boot: bool = False,
) -> Topology:
    """``topology`` with each lost GPU's bus id, UUID, serial and name filled from what can
    still tell them (see the module), and a note per lost GPU naming it and whence. ``bound``:
    :func:`nvidia_gpu_bus_ids`; ``previous``: the last discovered topology of this host, of
    this boot when ``same_boot``."""
    lost = [g.index for g in topology.gpus if g.health == Health.LOST]
    if not lost:
        return topology
    gpus = list(topology.gpus)
    unnamed = [i for i in lost if not gpus[i].pci_bus_id]
    claimed = {g.pci_bus_id for g in gpus if g.pci_bus_id}
    spare = [bus for bus in bound if bus not in claimed]
    kept = _same_enumeration(topology, previous, same_boot)
    notes = []
    for index in lost:
        gpu, whence = gpus[index], []
        if gpu.pci_bus_id:
            whence.append("NVML named it before it fell off")
        elif len(unnamed) == 1 and len(spare) == 1:
            gpu = replace(gpu, pci_bus_id=spare[0])
            whence.append(f"bus id from {NVIDIA_DRIVER}, the one GPU there no other is")
        before = _before(gpu, index, previous, kept)
        if before is not None and previous is not None:
            gpu = _filled(gpu, before)
            when = previous.provenance.captured_at
            whence.append(
                "the rest from the discovery"
                + (f" of {when:%Y-%m-%d %H:%M %Z}".rstrip() if when else " before")
            )
        gpus[index] = gpu
        notes.append(f"GPU{index} is lost: {gpu.identity()} ({'; '.join(whence) or 'no source'})")
    provenance = replace(topology.provenance, notes=[*topology.provenance.notes, *notes])
    return replace(topology, gpus=gpus, provenance=provenance)


def _same_enumeration(topology: Topology, previous: Topology | None, same_boot: bool) -> bool:
    """Whether NVML's index N is still the GPU it was in ``previous``: as many GPUs, no UUID of
    an answering GPU moved, and one of them seen at its place (or the same boot, whose order
    the driver keeps)."""
    if previous is None or previous.gpu_count != topology.gpu_count:
        return False
    pairs = [
        (now.uuid, then.uuid)
        for now, then in zip(topology.gpus, previous.gpus, strict=True)
        if now.health != Health.LOST and now.uuid and then.uuid
    ]
    if any(a != b for a, b in pairs):
        return False
    return bool(pairs) or same_boot


def _before(gpu: Gpu, index: int, previous: Topology | None, kept: bool) -> Gpu | None:
    """The GPU of ``previous`` that ``gpu`` (at NVML ``index``) was."""
    if previous is None:
        return None
    if gpu.pci_bus_id:
        return next((g for g in previous.gpus if g.pci_bus_id == gpu.pci_bus_id), None)
    return previous.gpus[index] if kept else None


def _filled(gpu: Gpu, before: Gpu) -> Gpu:
    """``gpu`` with the identity it lacks taken from ``before``."""
    return replace(
        gpu,
        pci_bus_id=gpu.pci_bus_id or before.pci_bus_id,
        uuid=gpu.uuid or before.uuid,
        serial=gpu.serial or before.serial,
        name=gpu.name or before.name,
        minor_number=gpu.minor_number if gpu.minor_number is not None else before.minor_number,
        memory_total_bytes=gpu.memory_total_bytes or before.memory_total_bytes,
    )
