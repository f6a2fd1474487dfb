"""The MIG devices of a GPU, as NVML lists them.

A GPU in MIG mode has up to ``nvmlDeviceGetMaxMigDeviceCount`` MIG device slots; each configured
one answers ``nvmlDeviceGetMigDeviceHandleByIndex`` (an empty slot raises NotFound) and its
handle answers the usual device queries (UUID, name, memory) plus its GPU and compute instance
ids and ``nvmlDeviceGetAttributes`` (slice counts, memory). The name ends in the profile
(``NVIDIA A100-SXM4-40GB MIG 1g.5gb``). The GI's placement needs a privileged user
(``nvmlDeviceGetGpuInstanceById``): without it the placement stays unknown and a note says so.

The NVML module is passed in, as in :mod:`.nvml`, so that tests use the fake.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from functools import partial
from types import ModuleType
from typing import Any, TypeVar

from gpualloc.discovery.text import text_of
from gpualloc.model.mig import MigInstance, parse_mig_profile

T = TypeVar("T")
_MIB = 1024 * 1024
_NAME_PROFILE = re.compile(r"\bMIG\s+(\S+)\s*$")


def mig_enabled(nvml: ModuleType, handle: Any) -> bool:
    """Whether MIG mode is on now (the current mode, not the pending one); False when the GPU
    cannot tell (no MIG support)."""
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except nvml.NVMLError:
        return False
    return bool(current)


def mig_modes(nvml: ModuleType, count: int) -> tuple[str, ...]:
    """Each GPU's MIG mode now and after its next reset, for the discovery cache key: cheap,
    and an administrator's ``nvidia-smi -mig 1`` changes them without any UUID changing."""
    modes = []
    for index in range(count):
        try:
            current, pending = nvml.nvmlDeviceGetMigMode(nvml.nvmlDeviceGetHandleByIndex(index))
        except nvml.NVMLError:
            modes.append("")
            continue
        modes.append(mode_key(bool(current), bool(pending)))
    return tuple(modes)


def mode_key(current: bool | None, pending: bool | None) -> str:
    """``on>off``: a GPU's MIG mode now and after its next reset, as the cache key holds it."""
    words = ("?" if mode is None else ("on" if mode else "off") for mode in (current, pending))
    return ">".join(words)


def mig_handles(nvml: ModuleType, handle: Any) -> list[tuple[int, Any]]:
    """(MIG device index, handle) of every configured MIG device of a GPU in MIG mode."""
    try:
        slots = int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))
    except nvml.NVMLError:
        return []
    found = []
    for slot in range(slots):
        try:
            found.append((slot, nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)))
        except nvml.NVMLError:  # NotFound: an empty slot
            continue
    return found


def mig_device_uuids(nvml: ModuleType, handle: Any) -> tuple[str | None, ...]:
    """The MIG device UUIDs of one GPU, in device order: cheap, for the discovery cache key
    (a MIG layout changes without any GPU UUID changing)."""
    if not mig_enabled(nvml, handle):
        return ()
    uuids: list[str | None] = []
    for _slot, mig in mig_handles(nvml, handle):
        try:
            uuids.append(text_of(nvml.nvmlDeviceGetUUID(mig)))
        except nvml.NVMLError:
            uuids.append(None)
    return tuple(uuids)


def probe_mig_devices(
    nvml: ModuleType, gpu: int, handle: Any, notes: list[str]
) -> list[MigInstance]:
    """Every MIG device of GPU ``gpu``; fields NVML does not give are None, with a note."""
    instances = []
    for slot, mig in mig_handles(nvml, handle):
        label = f"GPU{gpu}/MIG{slot}"

        def query(what: str, call: Callable[[], T], label: str = label) -> T | None:
            try:
                return call()
            except nvml.NVMLError as exc:
                notes.append(f"{label} {what}: {exc}")
                return None

        attributes = query("attributes", partial(nvml.nvmlDeviceGetAttributes, mig))
        name = text_of(query("name", partial(nvml.nvmlDeviceGetName, mig)))
        profile = _profile(name, attributes)
        if profile is None:
            notes.append(f"{label}: profile unknown (NVML gave neither name nor sizes); skipped")
            continue
        memory = query("memory", partial(nvml.nvmlDeviceGetMemoryInfo, mig))
        gi = query("GPU instance id", partial(nvml.nvmlDeviceGetGpuInstanceId, mig))
        ci = query("compute instance id", partial(nvml.nvmlDeviceGetComputeInstanceId, mig))
        start, size = _placement(nvml, handle, gi, notes, gpu)
        total = int(memory.total) if memory is not None else None
        if total is None and attributes is not None:
            total = int(attributes.memorySizeMB) * _MIB
        instances.append(
            MigInstance(
                gpu=gpu,
                device=slot,
                profile=profile,
                uuid=text_of(query("UUID", partial(nvml.nvmlDeviceGetUUID, mig))),
                gpu_instance=gi,
                compute_instance=ci,
                memory_total_bytes=total,
                placement_start=start,
                placement_size=size,
            )
        )
    return instances


def _profile(name: str | None, attributes: Any) -> str | None:
    """The profile from the device name, else rebuilt from the slice counts and memory."""
    if name and (match := _NAME_PROFILE.search(name)):
        try:
            return parse_mig_profile(match[1]).name
        except ValueError:
            pass
    if attributes is None:
        return None
    slices = int(attributes.gpuInstanceSliceCount)
    compute = int(attributes.computeInstanceSliceCount)
    gigabytes = math.ceil(int(attributes.memorySizeMB) / 1024)
    if slices < 1 or gigabytes < 1:
        return None
    prefix = f"{compute}c." if 0 < compute < slices else ""
    return f"{prefix}{slices}g.{gigabytes}gb"


def _placement(
    nvml: ModuleType, handle: Any, gpu_instance: int | None, notes: list[str], gpu: int
) -> tuple[int | None, int | None]:
    """The GI's (start, size) in memory slices; (None, None) without privileges or support,
    with one note per GPU."""
    if gpu_instance is None:
        return None, None
    try:
        info = nvml.nvmlGpuInstanceGetInfo(nvml.nvmlDeviceGetGpuInstanceById(handle, gpu_instance))
    except nvml.NVMLError as exc:
        note = f"GPU{gpu}: MIG placements unknown ({exc}; NVML needs root for them)"
        if note not in notes:
            notes.append(note)
        return None, None
    return int(info.placement.start), int(info.placement.size)
