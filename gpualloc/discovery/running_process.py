"""One entry of a GPU's running-process list, as a source reports it.

Its one job is the record both sides share: :mod:`.nvml` builds it from
``nvmlDeviceGetComputeRunningProcesses``, :mod:`.processes` from ``nvidia-smi`` and matches
either to the topology's GPUs. Kept below both, so that neither imports the other for it.
"""

from __future__ import annotations

from msgspec import Struct


class RunningProcess(Struct, frozen=True):
    """One entry of a GPU's running-process list, before it is matched to the topology."""

    nvml_index: int
    """NVML's index of the GPU; -1 when the source gives only the UUID (nvidia-smi)."""
    uuid: str | None
    pid: int
    used_memory_bytes: int | None
    gpu_instance: int | None = None
    compute_instance: int | None = None
