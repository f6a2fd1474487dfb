"""The ledger's on-disk model: which GPUs are held, by whom, since when (pydantic, versioned).

One JSON document per host. ``schema_version`` says how to read it: a file written by a newer
gpualloc is refused, never half-understood. ``generation`` grows by one with every committed
write, so that the freshest of several copies can be told apart (see :mod:`.store`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

SCHEMA_VERSION = 1

LeaseSource = Literal["run", "alloc", "slurm"]


class LeasedGpu(BaseModel):
    """One GPU of a lease: its index on this host and, when known, its UUID (indices can move
    when a GPU fails or the driver is reloaded; the UUID does not)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int = Field(ge=0)
    uuid: str | None = None


class Lease(BaseModel):
    """GPUs held by one job or one allocation.

    A lease is alive while its process is (``pid`` and ``pid_start_time``, so that a reused pid is
    not mistaken for the job), or while some process still holds its lease lock (the exec'd job
    and its children inherit it), or, with ``hold``, until it is released.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=r"^[0-9a-f]{12}$")
    gpus: tuple[LeasedGpu, ...] = Field(min_length=1)
    uid: int = Field(ge=0)
    user: str
    pid: int | None = Field(default=None, gt=0)
    pid_start_time: float | None = None
    """The process's start time as psutil reports it (seconds since the epoch)."""
    lock: bool = False
    """True when the job holds the lease lock file (``lease-<id>.lock``)."""
    hold: bool = False
    """Alive until released, whatever happens to ``pid``."""
    command: tuple[str, ...] = ()
    name: str | None = None
    policy: str | None = None
    sensitive: bool | None = None
    """The job's bandwidth sensitivity, for DRB's interference term (None: unknown)."""
    scores: dict[str, float | None] = Field(default_factory=dict)
    created: datetime
    source: LeaseSource

    @property
    def indices(self) -> tuple[int, ...]:
        return tuple(gpu.index for gpu in self.gpus)


class Ledger(BaseModel):
    """The whole state file."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    generation: int = Field(default=0, ge=0)
    host: str
    leases: list[Lease] = Field(default_factory=list)

    @field_validator("leases")
    @classmethod
    def _no_gpu_held_twice(cls, leases: list[Lease]) -> list[Lease]:
        held: dict[int, str] = {}
        for lease in leases:
            for index in lease.indices:
                if index in held:
                    raise ValueError(f"GPU {index} is held by leases {held[index]} and {lease.id}")
                held[index] = lease.id
        ids = [lease.id for lease in leases]
        if len(set(ids)) != len(ids):
            raise ValueError("two leases share an id")
        return leases

    def held_gpus(self) -> dict[int, Lease]:
        """GPU index -> the lease holding it."""
        return {index: lease for lease in self.leases for index in lease.indices}

    def find(self, lease_id: str) -> Lease | None:
        return next((lease for lease in self.leases if lease.id == lease_id), None)
