"""A real CUDA process without torch: the CUDA driver API through ``ctypes`` on ``libcuda.so.1``.

Run as a program by the ``gpu`` test tier (``tests/test_gpu_real.py``) and by
``scripts/device_check.sh``. It initialises CUDA, lists the devices CUDA shows it (honouring
``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER`` as any CUDA program would), creates a context
on each and allocates memory there, so that NVML lists it as a compute process, and prints one
JSON line::

    {"pid": 123, "visible": "0", "devices": [{"ordinal": 0, "bus_id": "0000:1A:00.0", ...}]}

``--hold SECONDS`` keeps the contexts (and the memory) that long after printing, for tests that
look at the process from outside (foreign-process detection); closing its standard input ends
the hold early. Exit status: 0 on success, 3 when CUDA reports an error (printed as JSON too).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import select
import sys
import time

ALLOCATION_BYTES = 64 * 2**20


class CudaError(Exception):
    pass


def _driver() -> ctypes.CDLL:
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as missing:
        raise CudaError(f"libcuda.so.1 cannot be loaded: {missing}") from None


def _check(cuda: ctypes.CDLL, status: int, what: str) -> None:
    if status == 0:
        return
    name = ctypes.c_char_p()
    cuda.cuGetErrorName(status, ctypes.byref(name))
    label = name.value.decode() if name.value else "unknown"
    raise CudaError(f"{what} failed: CUDA error {status} ({label})")


def cuda_devices(*, allocate: bool = True) -> tuple[ctypes.CDLL, list[dict[str, object]]]:
    """Every device CUDA shows this process, each with a context (primary) and, with
    ``allocate``, 64 MiB allocated on it."""
    cuda = _driver()
    _check(cuda, cuda.cuInit(0), "cuInit")
    count = ctypes.c_int()
    _check(cuda, cuda.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
    devices: list[dict[str, object]] = []
    for ordinal in range(count.value):
        device = ctypes.c_int()
        _check(cuda, cuda.cuDeviceGet(ctypes.byref(device), ordinal), "cuDeviceGet")
        bus = ctypes.create_string_buffer(64)
        _check(cuda, cuda.cuDeviceGetPCIBusId(bus, 64, device), "cuDeviceGetPCIBusId")
        name = ctypes.create_string_buffer(256)
        _check(cuda, cuda.cuDeviceGetName(name, 256, device), "cuDeviceGetName")
        total = ctypes.c_size_t()
        _check(cuda, cuda.cuDeviceTotalMem_v2(ctypes.byref(total), device), "cuDeviceTotalMem")
        record: dict[str, object] = {
            "ordinal": ordinal,
            "bus_id": bus.value.decode(),
            "name": name.value.decode(),
            "memory_total_bytes": total.value,
        }
        if allocate:
            context = ctypes.c_void_p()
            _check(
                cuda,
                cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device),
                "cuDevicePrimaryCtxRetain",
            )
            _check(cuda, cuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")
            pointer = ctypes.c_uint64()
            _check(cuda, cuda.cuMemAlloc_v2(ctypes.byref(pointer), ALLOCATION_BYTES), "cuMemAlloc")
            record["allocated_bytes"] = ALLOCATION_BYTES
        devices.append(record)
    return cuda, devices


def _hold(seconds: float) -> None:
    """Sleep ``seconds``, or until standard input reaches its end."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select([sys.stdin], [], [], min(left, 0.5))
        if readable and not sys.stdin.buffer.read1(4096):  # type: ignore[attr-defined]
            return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hold", type=float, default=0.0, metavar="SECONDS")
    parser.add_argument("--no-allocate", action="store_true", help="list devices only")
    options = parser.parse_args(argv)
    report: dict[str, object] = {
        "pid": os.getpid(),
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "order": os.environ.get("CUDA_DEVICE_ORDER"),
        "leased": os.environ.get("GPUALLOC_GPUS"),
    }
    try:
        _, report["devices"] = cuda_devices(allocate=not options.no_allocate)
    except CudaError as problem:
        report["error"] = str(problem)
        print(json.dumps(report), flush=True)
        return 3
    print(json.dumps(report), flush=True)
    if options.hold > 0:
        _hold(options.hold)
    return 0


if __name__ == "__main__":
    sys.exit(main())
