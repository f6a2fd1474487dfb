"""All-reduce bus bandwidth with torch.distributed (NCCL), where nccl-tests is not installed
(``gpualloc calibrate``).

One process per GPU of the set (this module run as ``python -m gpualloc.discovery.
torch_collectives BYTES``, ranks told by the usual ``RANK`` / ``WORLD_SIZE`` / ``MASTER_ADDR`` /
``MASTER_PORT`` variables, each seeing only its own GPU through ``CUDA_VISIBLE_DEVICES``), each
all-reducing one float32 buffer: warm-up, then timed iterations between two barriers. Rank 0
prints one JSON line. The figures are nccl-tests' (its PERFORMANCE.md): algorithm bandwidth =
bytes / time per all-reduce, bus bandwidth = algorithm bandwidth x 2(n-1)/n, so that they
compare with ``all_reduce_perf``'s and with link rates.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from gpualloc.discovery.calibration import CalibrationUnavailable, MeasuredCollective

WARMUP = 5
ITERATIONS = 20
TIMEOUT_S = 300


def nccl_available(torch: Any) -> bool:
    """Whether ``torch`` (the imported module, or None) can run NCCL collectives."""
    try:
        return bool(torch.distributed.is_available() and torch.distributed.is_nccl_available())
    except AttributeError:
        return False


def bus_bandwidth(size_bytes: int, seconds: float, ranks: int) -> float:
    """nccl-tests' bus bandwidth of one all-reduce of ``size_bytes`` over ``ranks`` GPUs."""
    return size_bytes / seconds / 1e9 * 2 * (ranks - 1) / ranks


def measure_sets(
    sets: Sequence[tuple[int, ...]],
    size_bytes: int,
    *,
    worker: Sequence[str] = (sys.executable, "-m", "gpualloc.discovery.torch_collectives"),
    ordinals: Mapping[int, int] | None = None,
) -> list[MeasuredCollective]:
    """Every set's all-reduce, one set at a time (``worker`` is the rank's command line;
    ``ordinals``, each GPU's CUDA number in bus order, default its index)."""
    return [_one_set(gpus, size_bytes, worker, ordinals or {}) for gpus in sets]


def _one_set(
    gpus: tuple[int, ...], size_bytes: int, worker: Sequence[str], ordinals: Mapping[int, int]
) -> MeasuredCollective:
    port = _free_port()
    ranks = []
    for rank, gpu in enumerate(gpus):
        env = dict(
            os.environ,
            CUDA_DEVICE_ORDER="PCI_BUS_ID",
            CUDA_VISIBLE_DEVICES=str(ordinals.get(gpu, gpu)),
            RANK=str(rank),
            WORLD_SIZE=str(len(gpus)),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        ranks.append(
            subprocess.Popen(
                [*worker, str(size_bytes)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outputs = []
    try:
        for process in ranks:
            try:
                out, err = process.communicate(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise CalibrationUnavailable(
                    f"torch all-reduce on GPUs {gpus} did not finish in {TIMEOUT_S} s"
                ) from None
            if process.returncode != 0:
                last = (err.strip().splitlines() or ["no output"])[-1]
                raise CalibrationUnavailable(f"torch all-reduce on GPUs {gpus} failed: {last}")
            outputs.append(out)
    finally:
        for process in ranks:  # a rank left waiting for a failed peer
            if process.poll() is None:
                process.kill()
            process.communicate()
    try:
        found = json.loads(outputs[0].strip().splitlines()[-1])
        busbw = float(found["busbw_gbps"])
    except (ValueError, KeyError, IndexError):
        raise CalibrationUnavailable("torch all-reduce printed no result") from None
    return MeasuredCollective(
        gpus=tuple(gpus), busbw_gbps=round(busbw, 3), source="torch.distributed"
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _worker() -> None:  # pragma: no cover - runs on a GPU host, one process per rank
    import torch
    import torch.distributed as dist

    size_bytes = int(sys.argv[1])
    ranks = int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(0)  # the one GPU CUDA_VISIBLE_DEVICES shows this rank
    dist.init_process_group("nccl")
    buffer = torch.ones(size_bytes // 4, dtype=torch.float32, device="cuda")
    for _ in range(WARMUP):
        dist.all_reduce(buffer)
    torch.cuda.synchronize()
    dist.barrier()
    started = time.perf_counter()
    for _ in range(ITERATIONS):
        dist.all_reduce(buffer)
    torch.cuda.synchronize()
    dist.barrier()
    seconds = (time.perf_counter() - started) / ITERATIONS
    if dist.get_rank() == 0:
        busbw = bus_bandwidth(buffer.numel() * 4, seconds, ranks)
        print(json.dumps({"busbw_gbps": busbw, "seconds": seconds}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":  # pragma: no cover
    _worker()
