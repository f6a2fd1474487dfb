"""What placement reads of a host's occupancy: the GPUs it may not use, who holds the others, and
the host's settings for shared jobs and MIG devices.

Placement takes this view, never the ledger (house style: ``placement`` never imports
``ledger``). :class:`gpualloc.ledger.occupancy.Occupancy` provides it, built from the ledger and
the GPUs' processes; a test, a benchmark or another front end may provide it otherwise. Leases
stay behind it: placement sees counts, memory and words about them, not their records.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol, runtime_checkable

from gpualloc.model.request import HostState


@runtime_checkable
class OccupancyView(Protocol):
    """The occupation of every GPU of one topology at one moment, as placement reads it."""

    # ---- GPUs placement may not use --------------------------------------------------------

    @property
    def unusable(self) -> frozenset[int]:
        """GPUs never handed out: lost, or unhealthy (see :attr:`unhealthy`)."""

    @property
    def unhealthy(self) -> Mapping[int, str]:
        """GPU index -> why it is not handed out (its faults)."""

    @property
    def outside(self) -> frozenset[int]:
        """GPUs this scope may not use (inside a Slurm job, the host's GPUs not the job's)."""

    @property
    def mig(self) -> frozenset[int]:
        """GPUs in MIG mode: never placed whole, only by their MIG devices."""

    @property
    def busy(self) -> frozenset[int]:
        """GPUs that are not free, whatever the reason."""

    @property
    def free(self) -> frozenset[int]:
        """GPUs a whole-GPU job may take now."""

    def state(self, gpu: int) -> str:
        """``held``, ``shared``, ``outside``, ``unhealthy``, ``lost``, ``mig``, ``foreign`` or
        ``free``."""

    def host_state(self) -> HostState:
        """Free GPUs and running jobs, as the whole-GPU policies take them."""

    def describe(self, gpus: Iterable[int]) -> list[str]:
        """One line per holder of any of ``gpus`` (for the messages of a busy host)."""

    # ---- shared jobs (run --share) ---------------------------------------------------------

    def shared_jobs(self, gpu: int) -> int:
        """Shared jobs on ``gpu`` now."""

    def shareable(self, gpu: int) -> bool:
        """Whether a lease holds ``gpu`` and lets shared jobs run beside it (``--shareable``)."""

    def shared_fraction(self, gpu: int) -> float:
        """The part of ``gpu`` its shared jobs hold (their fractions, summed)."""

    def declared_memory(self, gpu: int) -> int:
        """The memory the lease and the shared jobs on ``gpu`` declared (``--mem``), summed."""

    @property
    def memory_used(self) -> Mapping[int, int]:
        """GPU index -> memory in use as the driver reports it; absent when nothing says."""

    @property
    def max_shared_jobs(self) -> int:
        """Shared jobs a GPU may run at once (the system config's ``share.max_jobs``)."""

    @property
    def share_placement(self) -> str:
        """The share placement rule's name (:mod:`gpualloc.placement.sharing.rules`)."""

    @property
    def share_mix(self) -> Mapping[tuple[int, float], float] | None:
        """The workload's task types and their shares, for ``fgd`` (None: the default mix)."""

    @property
    def share_mix_source(self) -> str:
        """Where :attr:`share_mix` comes from, in words."""

    # ---- MIG devices -----------------------------------------------------------------------

    def mig_taken(self) -> Mapping[tuple[int, int], str]:
        """(parent GPU, MIG device index) -> who has it, for each MIG device not free."""

    @property
    def mig_mix(self) -> Mapping[str, float] | None:
        """The host's recent MIG requests by profile (None: too few counted)."""
