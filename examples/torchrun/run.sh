#!/usr/bin/env bash
# A PyTorch DDP job under torchrun on the best N GPUs of this host: gpualloc chooses the GPUs
# (an NVLinked set for a bandwidth-sensitive job), queues until they are free, and hands them
# to torchrun in ring order as CUDA_VISIBLE_DEVICES, so local rank i drives the i-th GPU and
# NCCL's ring follows the links chosen for it. numactl binds the job to the GPUs' NUMA nodes.
#
#   ./run.sh allreduce.py             # 2 GPUs (NGPUS=4 ./run.sh train.py --epochs 10)
set -euo pipefail
ngpus=${NGPUS:-2}
exec gpualloc run -n "$ngpus" --sensitive --wait -- \
  torchrun --standalone --nproc-per-node "$ngpus" "$@"
