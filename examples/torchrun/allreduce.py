"""A DDP job that measures what its GPUs' links give NCCL: all-reduce bus bandwidth.

Run it through run.sh (gpualloc + torchrun). Rank 0 prints the GPUs it got and the bus
bandwidth, in nccl-tests' convention (algorithm bandwidth x 2(n-1)/n), so two placements of the
same job can be compared: an NVLinked pair against a pair across sockets, for example.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist


def main() -> None:
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)  # the local_rank-th entry of CUDA_VISIBLE_DEVICES
    dist.init_process_group("nccl")
    world = dist.get_world_size()
    size_bytes = int(os.environ.get("ALLREDUCE_BYTES", 256 * 1024 * 1024))
    tensor = torch.ones(size_bytes // 4, dtype=torch.float32, device="cuda")
    for _ in range(5):  # warm up NCCL's rings
        dist.all_reduce(tensor)
    torch.cuda.synchronize()
    iterations = int(os.environ.get("ALLREDUCE_ITERATIONS", 20))
    start = time.perf_counter()
    for _ in range(iterations):
        dist.all_reduce(tensor)
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / iterations
    if dist.get_rank() == 0:
        bus_gbps = size_bytes / seconds / 1e9 * 2 * (world - 1) / world
        print(
            f"GPUs {os.environ.get('CUDA_VISIBLE_DEVICES')} (lease "
            f"{os.environ.get('GPUALLOC_LEASE_ID')}): all-reduce of {size_bytes >> 20} MiB "
            f"in {seconds * 1000:.2f} ms, bus bandwidth {bus_gbps:.1f} GB/s"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
