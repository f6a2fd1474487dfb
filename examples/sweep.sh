#!/usr/bin/env bash
# A hyper-parameter sweep on one shared host: one 2-GPU job per learning rate, all submitted at
# once with --wait. gpualloc starts each job as soon as a good pair of GPUs is free (first come,
# first served; NVLinked pairs first for --sensitive jobs), so the sweep never oversubscribes a
# GPU and never takes GPUs other users hold. Each job's GPUs are free again when it exits.
#
#   TRAIN="python train.py" ./sweep.sh               # the command each job runs (gets --lr X)
#   LEARNING_RATES="1e-3 1e-4" GPUS_PER_JOB=4 ./sweep.sh
#   GPUALLOC_TOPOLOGY=dgx1-v100 TRAIN=echo ./sweep.sh # try it without a GPU
set -euo pipefail
read -r -a train <<< "${TRAIN:-python train.py}"
declare -A jobs=()
for lr in ${LEARNING_RATES:-1e-3 3e-4 1e-4 3e-5}; do
  gpualloc run -n "${GPUS_PER_JOB:-2}" --sensitive --wait --timeout "${TIMEOUT:-24h}" \
    --name "sweep lr=$lr" -- "${train[@]}" --lr "$lr" &
  jobs[$!]=$lr
done
failed=0
for pid in "${!jobs[@]}"; do  # the sweep fails if any of its jobs did (or never started)
  status=0
  wait "$pid" || status=$?
  if [ "$status" -ne 0 ]; then
    echo "sweep: the job with --lr ${jobs[$pid]} failed (exit $status)" >&2
    failed=$((failed + 1))
  fi
done
if [ "$failed" -gt 0 ]; then
  echo "sweep: $failed of ${#jobs[@]} jobs failed" >&2
  exit 1
fi
