"""gpualloc: a topology-aware GPU allocator and job launcher for one shared multi-GPU host."""

__version__ = "0.2.0"
