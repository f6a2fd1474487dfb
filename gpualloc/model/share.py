"""Shared GPUs: jobs that run beside another lease's job on the same GPU.

A lease made with ``--shareable`` lets other jobs onto its GPUs; ``run --share`` places a job on
such a GPU (or on one only other shares use, or on a free one) when its memory fits and the GPU
has fewer than the host's ``share.max_jobs`` shared jobs. The idea is DeepPool's (seed 004,
section 3): a foreground job rarely keeps its GPU busy, and background jobs soak up the idle
capacity at low priority. How the GPU is divided is the driver's business: under CUDA MPS the
kernels of all jobs run side by side and ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` caps a job's
streaming multiprocessors; without an MPS daemon the jobs are time-sliced.
"""

from typing import Annotated, Literal

from msgspec import Meta, Struct

from gpualloc.model.mig import format_size
from gpualloc.model.validation import NonNegativeInt, PositiveInt

ShareMode = Literal["mps", "time-sliced"]
SmPercent = Annotated[int, Meta(ge=1, le=100)]


class ShareRequest(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What ``run --share`` asks for (stored whole in a waiting job's queue entry)."""

    memory_bytes: PositiveInt | None = None
    """GPU memory the job needs (``--mem``); None: it declares none."""
    background: bool = False
    """Low priority (``--background``): DeepPool's background job."""
    sm_percent: SmPercent | None = None
    """Share of the streaming multiprocessors under MPS (``--sm-share``)."""
    gpu: NonNegativeInt | None = None
    """Exactly this GPU (``--gpus N``); None: the best fit."""

    @property
    def fraction(self) -> float | None:
        """The part of a GPU the job asks for (``--sm-share`` / 100), or None when it names
        none; a GPU takes shared jobs while the parts they hold sum to at most 1."""
        return None if self.sm_percent is None else self.sm_percent / 100

    def leased(self, gpu_memory_bytes: int | None, max_jobs: int, mode: ShareMode) -> "LeasedShare":
        """How the job holds its GPU once placed: its fraction of it is ``--sm-share`` when
        given, else its declared memory over the GPU's, else one over ``max_jobs``."""
        if self.sm_percent is not None:
            fraction = self.sm_percent / 100
        elif self.memory_bytes is not None and gpu_memory_bytes:
            fraction = min(1.0, self.memory_bytes / gpu_memory_bytes)
        else:
            fraction = 1 / max(1, max_jobs)
        return LeasedShare(
            fraction=fraction,
            background=self.background,
            sm_percent=self.sm_percent,
            mode=mode,
        )

    def describe(self) -> str:
        parts = ["a shared place" + (f" on GPU {self.gpu}" if self.gpu is not None else "")]
        if self.memory_bytes is not None:
            parts.append(f"with {format_size(self.memory_bytes)}")
        if self.background:
            parts.append("(background)")
        return " ".join(parts)


class LeasedShare(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How a shared job holds its one GPU: the part of it that is its due, and how."""

    fraction: Annotated[float, Meta(gt=0, le=1)]
    """The job's part of the GPU: ``--sm-share`` when given, else its declared memory over the
    GPU's, else one over ``share.max_jobs``. Shown by ``status``; the simulator's unit."""
    background: bool = False
    sm_percent: SmPercent | None = None
    mode: ShareMode = "time-sliced"
    evict_by: str | None = None
    """Who asked the job to leave (``release --evict-shared``); its watcher then ends it."""
    evict_grace_s: Annotated[float, Meta(ge=0)] | None = None
    """Time between the watcher's SIGTERM and SIGKILL (None: the default, 10 s)."""
