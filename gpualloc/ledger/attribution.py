"""Whose job each GPU process is, and whether it runs where its lease says.

A lease says which GPUs its job may use; ``CUDA_VISIBLE_DEVICES`` is only a request to the job,
which a wrapper, a library or a hard-coded ``cuda:0`` can get around (task-spooler users found
every job on GPU 0 while the tool reported GPUs 2, 3 and 0). The GPUs' running-process lists
say where the job really runs. A process belongs to a lease when it is the lease's process, one
of its descendants, or a member of the job's process group (how ``run``, ``alloc`` and Slurm
tasks record their jobs); a ``--hold`` lease's job may be started from any shell, so its
user's other processes on its GPUs are taken as its job's.

Two kinds of mismatch follow:

- *misplaced*: a lease's process on a GPU the lease does not hold;
- *intruder*: a process on a leased GPU that belongs to none of the leases on that GPU (the
  holder and its shared jobs): someone uses a GPU somebody else holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from msgspec import Struct, field

from gpualloc.ledger.liveness import stat_fields
from gpualloc.ledger.schema import Lease
from gpualloc.model.topology import GpuProcess


class Misplaced(Struct, frozen=True):
    """A lease's process running on a GPU the lease does not hold."""

    lease: Lease
    process: GpuProcess


class Intruder(Struct, frozen=True):
    """A process on a leased GPU that is none of that GPU's leases' jobs."""

    holders: tuple[Lease, ...]
    process: GpuProcess


class Attribution(Struct, frozen=True):
    """Every GPU process matched to the lease whose job it is, and what does not fit."""

    owners: dict[int, Lease] = field(default_factory=dict)
    """pid -> the lease whose job the process is (processes of nobody's job are absent)."""
    misplaced: tuple[Misplaced, ...] = ()
    intruders: tuple[Intruder, ...] = ()

    def misplaced_of(self, lease_id: str) -> list[GpuProcess]:
        return [m.process for m in self.misplaced if m.lease.id == lease_id]

    def intruders_on(self, gpu: int) -> list[GpuProcess]:
        return [i.process for i in self.intruders if i.process.gpu == gpu]

    def lines(self) -> list[str]:
        """One sentence per mismatch, as ``status``, ``doctor`` and ``run`` say them."""
        return [describe_misplaced(m) for m in self.misplaced] + [
            describe_intruder(i) for i in self.intruders
        ]


def describe_misplaced(found: Misplaced) -> str:
    """``lease 1a2b3c4d5e6f (alice): pid 4242 (python) runs on GPU 5, which the lease does not
    hold (it holds GPU 2,3)``."""
    from gpualloc.ledger.occupancy import describe_processes, held_devices

    lease = found.lease
    return (
        f"lease {lease.id} ({lease.user}): {describe_processes([found.process])} runs on GPU "
        f"{found.process.gpu}, which the lease does not hold (it holds {held_devices(lease)})"
    )


def describe_intruder(found: Intruder) -> str:
    """``GPU 2, held by lease 1a2b3c4d5e6f (alice), also runs pid 812 (python, bob), which is
    not that lease's job``."""
    from gpualloc.ledger.occupancy import describe_processes

    holders = ", ".join(f"lease {lease.id} ({lease.user})" for lease in found.holders)
    return (
        f"GPU {found.process.gpu}, held by {holders}, also runs "
        f"{describe_processes([found.process])}, which is not "
        f"{'that lease' if len(found.holders) == 1 else 'any of those leases'}'s job"
    )


def lease_gpus(lease: Lease) -> frozenset[int]:
    """The GPUs a lease's job may run on: its whole GPUs and the parents of its MIG devices."""
    return frozenset(lease.indices) | frozenset(m.gpu for m in lease.mig)


def attribute(
    leases: Iterable[Lease],
    processes: Iterable[GpuProcess],
    *,
    lineage: Mapping[int, tuple[int, ...]] | None = None,
) -> Attribution:
    """Match ``processes`` to ``leases`` and find the mismatches. ``lineage`` maps a pid to its
    process group and ancestors (read from ``/proc`` when not given; tests give it)."""
    leases = list(leases)
    processes = list(processes)
    lineage = dict(lineage) if lineage is not None else {}
    for process in processes:
        if process.pid not in lineage:
            lineage[process.pid] = process_lineage(process.pid)
    on_gpu: dict[int, list[Lease]] = {}
    for lease in leases:
        for gpu in lease_gpus(lease):
            on_gpu.setdefault(gpu, []).append(lease)
    by_pid = {lease.pid: lease for lease in leases if lease.pid is not None}
    owners: dict[int, Lease] = {}
    misplaced: list[Misplaced] = []
    intruders: list[Intruder] = []
    for process in processes:
        holders = on_gpu.get(process.gpu, [])
        owner = _owner(process, leases, by_pid, holders, lineage[process.pid])
        if owner is not None:
            owners[process.pid] = owner
            if process.gpu not in lease_gpus(owner):
                misplaced.append(Misplaced(owner, process))
        elif holders:
            intruders.append(Intruder(tuple(holders), process))
    return Attribution(owners, tuple(misplaced), tuple(intruders))


def _owner(
    process: GpuProcess,
    leases: list[Lease],
    by_pid: dict[int, Lease],
    holders: list[Lease],
    family: tuple[int, ...],
) -> Lease | None:
    """The lease whose job ``process`` is: the lease of its nearest ancestor (itself included;
    a ``gpualloc run`` in the shell of an ``alloc`` is its own lease's), else of its process
    group, else a ``--hold`` lease of the process's user on the GPU it runs on. A process whose
    nearest lease does not hold its GPU belongs to a lease that does when that lease is also
    its ancestor's or its user's hold (a shell with two leases uses both)."""
    nearest = next((by_pid[pid] for pid in family[1:] if pid in by_pid), None)
    if nearest is None:
        nearest = next(
            (x for x in leases if x.process_group is not None and family[:1] == (x.process_group,)),
            None,
        )
    if nearest is not None and process.gpu in lease_gpus(nearest):
        return nearest
    for lease in holders:
        if lease.pid is not None and lease.pid in family[1:]:
            return lease
        if lease.hold and process.user is not None and process.user == lease.user:
            return lease
    return nearest


def process_lineage(pid: int) -> tuple[int, ...]:
    """``(process group, pid, parent, grandparent, ...)`` from ``/proc`` (empty when the process
    is gone or unreadable; the group is 0 when unknown)."""
    chain: list[int] = []
    group = 0
    current = pid
    while current > 0 and current not in chain and len(chain) < 64:
        try:
            fields = stat_fields(current)  # [state, ppid, pgrp, ...]
            parent, own_group = int(fields[1]), int(fields[2])
        except (OSError, IndexError, ValueError):
            break
        if not chain:
            group = own_group
        chain.append(current)
        current = parent
    return (group, *chain) if chain else ()
