"""Slurm integration: the job a process runs in (:mod:`.job`) and ``gres.conf`` (:mod:`.gres`),
with gpualloc as the per-node placement brain. The node hooks that record Slurm's jobs in the
ledger are an application of the host: :mod:`gpualloc.host.slurm_hooks`."""
