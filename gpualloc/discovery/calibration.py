"""Measured GPU-to-GPU bandwidth on this host (``gpualloc calibrate``).

What placement and the simulator's runtime model need is the bandwidth of each pair; the
estimate from link classes (:mod:`gpualloc.model.bandwidth`) can be off several-fold on PCIe
hosts, where peer traffic may be staged through host memory. ``calibrate`` copies a buffer from
every GPU to every other with torch (``tensor.copy_`` across devices: cudaMemcpyPeer, with peer
access where the driver grants it) and times it, giving a one-way matrix in GB/s (10^9 B/s);
without torch, NVIDIA's ``nvbandwidth`` does it when it is on PATH (:class:`Nvbandwidth`). With
``all_reduce_perf`` (nccl-tests) on PATH it also measures the all-reduce bus bandwidth of the
GPU sets placement weighs (:func:`measure_collectives`). ``calibrate --from FILE...`` stores
outputs of those tools made earlier on this host instead (:func:`from_recordings`), and what
they show wrong (:mod:`gpualloc.measurements.degraded`) is kept for ``doctor``.

The result is saved beside the topology cache, keyed by the GPUs' UUIDs and the driver
version, and applied to this host's topology whenever it is discovered: every link's bandwidth
becomes the slower of its two measured directions (:func:`~gpualloc.discovery.bandwidth_matrix.
apply_measured_bandwidth`), so ``plan``, ``run`` and ``simulate`` use it. A calibration of other
GPUs, or of another driver, is ignored.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from msgspec import Struct, field

from gpualloc.discovery.cache import CALIBRATION_FILE, CacheKey, cache_dir
from gpualloc.errors import DiscoveryError
from gpualloc.measurements.records import Finding
from gpualloc.model.printable import count_of

DEFAULT_SIZE_MIB = 256
DEFAULT_REPEATS = 5


class CalibrationUnavailable(DiscoveryError):
    """Nothing on this host can measure (no torch with CUDA)."""


class MeasuredCollective(Struct, frozen=True, kw_only=True):
    """An all-reduce's bus bandwidth over a set of this host's GPUs (nccl-tests)."""

    gpus: tuple[int, ...]
    busbw_gbps: float
    """At the largest message measured."""
    operation: str = "all_reduce"
    p2p_disabled: bool = False
    source: str = ""


class Calibration(Struct, frozen=True, kw_only=True):
    """A measured one-way copy-bandwidth matrix of this host's GPUs, the collectives measured
    on them, and what the measurements show wrong."""

    gpu_uuids: tuple[str | None, ...]
    driver_version: str | None
    method: str
    size_bytes: int
    repeats: int
    measured_at: str
    matrix: list[list[float]]
    """``matrix[a][b]``: GB/s copying from GPU a to GPU b; the diagonal is 0 (not measured).
    Empty when only collectives were measured."""
    collectives: list[MeasuredCollective] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    """Pairs that measured wrong (P2P slower than staged copies, far below the link class)."""
    sources: list[str] = field(default_factory=list)
    """The files (``--from``) or tools the figures came from."""

    def matches(self, key: CacheKey) -> bool:
        return self.gpu_uuids == key.gpu_uuids and self.driver_version == key.driver_version


def calibration_path() -> Path:
    return cache_dir() / CALIBRATION_FILE


def load_calibration() -> Calibration | None:
    """The saved calibration, or None when there is none or it cannot be read."""
    from gpualloc.model.validation import decode_json

    try:
        return decode_json(calibration_path().read_bytes(), Calibration)
    except (OSError, ValueError):
        return None


def saved_for(key: CacheKey) -> Calibration | None:
    """The saved calibration when it was made on these GPUs with this driver, else None."""
    if not calibration_path().exists():
        return None
    calibration = load_calibration()
    return calibration if calibration is not None and calibration.matches(key) else None


def save_calibration(calibration: Calibration) -> Path:
    from gpualloc.atomic import write_text_atomic
    from gpualloc.model.validation import to_builtins

    path = calibration_path()
    write_text_atomic(path, json.dumps(to_builtins(calibration), indent=1) + "\n")
    return path


def forget_calibration() -> bool:
    """Remove the saved calibration; whether there was one."""
    with contextlib.suppress(FileNotFoundError):
        calibration_path().unlink()
        return True
    return False


class TorchCopy:
    """Times device-to-device copies with torch (imported only when measuring)."""

    name = "torch"

    def __init__(self) -> None:
        # Number devices as NVML does (CUDA's default puts the fastest first), before CUDA starts.
        os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        try:
            import torch
        except ImportError:
            raise CalibrationUnavailable(
                "cannot measure: torch is not installed (nor nvbandwidth on PATH)",
                hint="pip install torch (a CUDA build), or put NVIDIA's nvbandwidth on PATH; "
                "then run gpualloc calibrate again",
            ) from None
        if not torch.cuda.is_available():
            raise CalibrationUnavailable(
                "cannot measure: torch sees no CUDA device",
                hint="install a CUDA build of torch, and check CUDA_VISIBLE_DEVICES is unset",
            )
        self.torch = torch

    def device_count(self) -> int:
        return int(self.torch.cuda.device_count())

    def device_uuid(self, index: int) -> str | None:
        """The device's UUID as NVML writes it (``GPU-...``), where torch tells it."""
        uuid = getattr(self.torch.cuda.get_device_properties(index), "uuid", None)
        return None if uuid is None else f"GPU-{uuid}"

    def copy_gbps(self, source: int, target: int, size_bytes: int, repeats: int) -> float:
        torch = self.torch
        sent = torch.empty(size_bytes, dtype=torch.uint8, device=f"cuda:{source}")
        received = torch.empty(size_bytes, dtype=torch.uint8, device=f"cuda:{target}")
        received.copy_(sent)  # warm-up: peer mappings, allocator
        self._synchronise(source, target)
        started = time.perf_counter()
        for _ in range(repeats):
            received.copy_(sent, non_blocking=True)
        self._synchronise(source, target)
        elapsed = time.perf_counter() - started
        return size_bytes * repeats / elapsed / 1e9

    def _synchronise(self, *devices: int) -> None:
        for device in devices:
            self.torch.cuda.synchronize(device)


def measure(
    backend: TorchCopy,
    key: CacheKey,
    *,
    size_bytes: int = DEFAULT_SIZE_MIB * 2**20,
    repeats: int = DEFAULT_REPEATS,
    progress: Callable[[], None] = lambda: None,
) -> Calibration:
    """Every ordered pair of the host's GPUs, copied ``repeats`` times ``size_bytes``.

    torch numbers devices as CUDA does, in PCI bus order (gpualloc sets
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` before torch starts), which is not NVML's order on every
    host: each NVML GPU is matched to its torch device by UUID where torch tells them
    (tests/test_calibrate.py::test_devices_numbered_otherwise_than_nvml_are_matched_by_uuid),
    else device ``i`` is taken for GPU ``i``.
    """
    count = len(key.gpu_uuids)
    if backend.device_count() != count:
        raise CalibrationUnavailable(
            f"torch sees {count_of(backend.device_count(), 'GPU')}, NVML {count}",
            hint="unset CUDA_VISIBLE_DEVICES so that every GPU can be measured",
        )
    seen = [backend.device_uuid(index) for index in range(count)]
    device = list(range(count))
    if all(seen) and all(key.gpu_uuids) and set(seen) == set(key.gpu_uuids):
        where = {uuid: index for index, uuid in enumerate(seen)}
        device = [where[uuid] for uuid in key.gpu_uuids]
    else:
        for index, expected in enumerate(key.gpu_uuids):
            if seen[index] is not None and expected is not None and seen[index] != expected:
                raise CalibrationUnavailable(
                    f"torch's device {index} is {seen[index]}, NVML's GPU {index} is {expected}",
                    hint="unset CUDA_VISIBLE_DEVICES so that torch sees the GPUs NVML sees",
                )
    matrix = [[0.0] * count for _ in range(count)]
    for source in range(count):
        for target in range(count):
            if source != target:
                gbps = backend.copy_gbps(device[source], device[target], size_bytes, repeats)
                matrix[source][target] = round(gbps, 3)
                progress()
    return Calibration(
        gpu_uuids=key.gpu_uuids,
        driver_version=key.driver_version,
        method=f"{backend.name} device-to-device copy",
        size_bytes=size_bytes,
        repeats=repeats,
        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        matrix=matrix,
        sources=[backend.name],
    )
