"""Slurm integration: node hooks and gres.conf, with gpualloc as the per-node placement brain."""
