"""go-gpuallocator's best-effort partition, found without listing every partition (NVIDIA's
``gpuallocator/besteffort_policy.go``, which the Kubernetes device plugin runs).

go-gpuallocator pads the available GPUs to a multiple of the job's size k, walks every
partition of them into groups of k (``iterateGPUPartitions``: 22 million for k = 3 of 16 GPUs),
keeps the first partition of highest total pair score, and returns its best group:

- :mod:`.partition`: :class:`~.partition.PartitionSearch`, the same walk in the same order with
  branch and bound on strict improvement, twins taken lowest first and a transposition table;
- :mod:`.best_groups`: per GPU, the best score of a group holding it, the share bound the walk
  cuts with, found by a pruned walk;
- :mod:`.two_groups`: the last two groups, a smallest cut between them (the bisection bound).

What it proves: the partition returned is the first of highest total in go-gpuallocator's own
order, so ``besteffort`` answers as the original does, ties included
(``tests/test_partition_search.py`` and ``tests/test_placement_speed_partition.py`` against the
literal enumeration on random and mesh-like scores, with twins, required GPUs and padding;
``tests/test_placement_optimality.py`` on the bundled hosts). The policy itself is
:mod:`gpualloc.placement.policies.besteffort`.
"""
