"""Who occupies each GPU: a live lease, processes that never asked gpualloc, or nobody.

Built from the ledger (after reaping) and the GPUs' running-process lists. A GPU is busy when a
live lease holds it, when it was lost (fell off the bus), or when compute processes run on it
while no lease holds it ("foreign" use; ``--ignore-foreign`` disregards it). Processes on a GPU
that a lease holds belong to that lease's job.

The result feeds the placement engine, which reads it as a
:class:`~gpualloc.model.occupancy_view.OccupancyView` (:meth:`Occupancy.host_state`, with every
lease as a running job for DRB's interference term; the shared jobs on each GPU, by count, part
and memory), and the messages that say who holds what.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta, timezone
from functools import cached_property
from typing import Any

from msgspec import Struct, field

from gpualloc.config import DEFAULT_MAX_SHARED_JOBS
from gpualloc.ledger.schema import Lease, Ledger
from gpualloc.ledger.stats import MIX_MEMORY, MIX_MIN_REQUESTS
from gpualloc.model.cpuset import format_cpulist, format_ranks
from gpualloc.model.mig import mig_label
from gpualloc.model.printable import printable
from gpualloc.model.request import HostState, RunningJob
from gpualloc.model.topology import GpuFault, GpuProcess, Health, Topology, faults_by_gpu


class Occupancy(Struct, frozen=True, dict=True):
    """The occupation of every GPU of one topology at one moment; placement's
    :class:`~gpualloc.model.occupancy_view.OccupancyView` of it (a test holds it to that)."""

    gpu_count: int
    leases: dict[int, Lease] = field(default_factory=dict)
    """GPU index -> the live lease holding it."""
    processes: dict[int, tuple[GpuProcess, ...]] = field(default_factory=dict)
    """GPU index -> the compute processes running on it (leased GPUs included)."""
    unusable: frozenset[int] = frozenset()
    """GPUs never handed out: lost (fell off the bus) or unhealthy (see ``unhealthy``)."""
    ignore_foreign: bool = False
    outside: frozenset[int] = frozenset()
    """GPUs this scope may not use: inside a Slurm job, the host's GPUs that are not the
    job's."""
    mig: frozenset[int] = frozenset()
    """GPUs in MIG mode: never leased whole, only by their MIG devices."""
    mig_leases: dict[tuple[int, int], Lease] = field(default_factory=dict)
    """(parent GPU, MIG device index) -> the live lease holding that MIG device."""
    shares: dict[int, tuple[Lease, ...]] = field(default_factory=dict)
    """GPU index -> the shared jobs on it (``run --share``), oldest first."""
    memory_used: dict[int, int] = field(default_factory=dict)
    """GPU index -> memory in use as the driver reports it (NVML), else the sum of its
    processes' memory; absent when nothing says."""
    max_shared_jobs: int = DEFAULT_MAX_SHARED_JOBS
    """Shared jobs a GPU may run at once (the system config's ``share.max_jobs``)."""
    share_placement: str = "fgd"
    """How a shared job's GPU is chosen (the system config's ``share.placement``)."""
    share_mix: dict[tuple[int, float], float] | None = None
    """The workload's task types and their shares, for ``fgd`` (None: the default mix)."""
    mig_mix: dict[str, float] | None = None
    """The host's recent MIG requests by profile (None: too few counted)."""
    share_mix_source: str = "the default mix"
    """Where :attr:`share_mix` comes from, in words (``run --share --dry-run`` says it)."""
    unhealthy: dict[int, str] = field(default_factory=dict)
    """GPU index -> why it is not handed out (its faults); such GPUs are also ``unusable``."""
    lost: frozenset[int] = frozenset()
    """GPUs that fell off the bus (discovery marked them, or NVML says so now): their state is
    ``lost``, not ``unhealthy``, so that ``gpualloc_gpus{state="lost"}`` counts them
    (tests/test_launcher.py::test_occupancy_tells_leases_foreign_processes_and_lost_gpus_apart)."""
    mig_foreign: dict[tuple[int, int], tuple[GpuProcess, ...]] = field(default_factory=dict)
    """(parent GPU, MIG device index) -> processes on that MIG device that no lease accounts
    for (NVML names their GPU and compute instance)."""
    known_state: HostState | None = None
    """The host state, where the caller keeps it as leases come and go (the simulator, which would
    otherwise make it anew from the leases after every start and end); it must be what
    :meth:`host_state` makes of the rest (a test holds the simulator to it). None: made from the
    leases when first asked."""

    @classmethod
    def build(
        cls,
        topology: Topology,
        ledger: Ledger,
        processes: Iterable[GpuProcess] = (),
        *,
        ignore_foreign: bool = False,
        outside: frozenset[int] = frozenset(),
        memory_used: Mapping[int, int] | None = None,
        max_shared_jobs: int = DEFAULT_MAX_SHARED_JOBS,
        faults: Iterable[GpuFault] = (),
        share_placement: str = "fgd",
        share_mix: dict[tuple[int, float], float] | None = None,
    ) -> Occupancy:
        by_gpu: dict[int, list[GpuProcess]] = {}
        for process in processes:
            by_gpu.setdefault(process.gpu, []).append(process)
        used = {
            gpu: sum(p.used_memory_bytes or 0 for p in found)
            for gpu, found in by_gpu.items()
            if any(p.used_memory_bytes is not None for p in found)
        }
        used.update(memory_used or {})
        faults = tuple(faults)
        unhealthy = {
            gpu: text for gpu, text in faults_by_gpu(faults).items() if gpu < topology.gpu_count
        }
        lost = frozenset(g.index for g in topology.gpus if g.health == Health.LOST) | frozenset(
            f.gpu for f in faults if f.kind == "lost" and f.gpu < topology.gpu_count
        )
        return cls(
            gpu_count=topology.gpu_count,
            leases={i: lease for i, lease in ledger.held_gpus().items() if i < topology.gpu_count},
            processes={gpu: tuple(found) for gpu, found in by_gpu.items()},
            unusable=frozenset(g.index for g in topology.gpus if g.health == Health.LOST)
            | frozenset(unhealthy),
            unhealthy=unhealthy,
            lost=lost,
            ignore_foreign=ignore_foreign,
            outside=outside,
            mig=frozenset(g.index for g in topology.gpus if g.mig_enabled),
            mig_leases={
                key: lease
                for key, lease in ledger.held_mig().items()
                if key[0] < topology.gpu_count
            },
            shares={
                gpu: tuple(found)
                for gpu, found in ledger.shares().items()
                if gpu < topology.gpu_count
            },
            memory_used=used,
            max_shared_jobs=max_shared_jobs,
            share_placement=share_placement,
            **_mix(ledger, share_mix),
            mig_mix=ledger.stats.recent_mig_mix()[0],
            mig_foreign=_mig_foreign(topology, ledger, by_gpu),
        )

    def mig_taken(self) -> dict[tuple[int, int], str]:
        """MIG devices a new lease may not take, with who has them: held by a lease, or (unless
        foreign processes are ignored) running processes that did not come through gpualloc."""
        taken = {key: describe_lease(lease) for key, lease in self.mig_leases.items()}
        if not self.ignore_foreign:
            for key, processes in self.mig_foreign.items():
                taken.setdefault(
                    key,
                    f"{mig_label(*key)} runs {describe_processes(processes)}, not through gpualloc",
                )
        return taken

    # ---- per GPU ---------------------------------------------------------------------------

    def foreign(self, gpu: int) -> tuple[GpuProcess, ...]:
        """Processes on ``gpu`` that no lease accounts for (ignored ones included)."""
        if gpu in self.leases or gpu in self.shares:
            return ()
        return self.processes.get(gpu, ())

    def state(self, gpu: int) -> str:
        """``held``, ``shared`` (only shared jobs run on it), ``outside``, ``unhealthy`` (a
        fault: see :mod:`gpualloc.discovery.health`), ``lost``, ``mig``
        (in MIG mode: only its MIG devices are leased), ``foreign`` or ``free``."""
        if gpu in self.leases:
            return "held"
        if gpu in self.shares:
            return "shared"
        if gpu in self.outside:
            return "outside"
        if gpu in self.lost:
            return "lost"
        if gpu in self.unhealthy or gpu in self.unusable:
            return "unhealthy"
        if gpu in self.mig:
            return "mig"
        if self.foreign(gpu):
            return "free" if self.ignore_foreign else "foreign"
        return "free"

    @cached_property
    def busy(self) -> frozenset[int]:
        """GPUs not free (cached: an occupancy is frozen, and a queue asks it per waiter)."""
        if self._leases_alone:  # the simulator's, and an idle host's: held means busy
            return frozenset(g for g in self.leases if g < self.gpu_count)
        return frozenset(g for g in range(self.gpu_count) if self.state(g) != "free")

    @cached_property
    def _leases_alone(self) -> bool:
        """Whether nothing but whole-GPU leases occupies a GPU (no process, share, fault, MIG
        mode or scope): then :meth:`state` is ``held`` or ``free``, and :attr:`busy` is the
        leased GPUs: the simulator builds an occupancy after every start and end, and takes
        this short way then."""
        return not (
            self.processes
            or self.shares
            or self.outside
            or self.lost
            or self.unhealthy
            or self.unusable
            or self.mig
        )

    @cached_property
    def free(self) -> frozenset[int]:
        if self.known_state is not None:
            return self.known_state.free
        return frozenset(range(self.gpu_count)) - self.busy

    def host_state(self) -> HostState:
        """Free GPUs and running jobs, as the placement engine takes them: one job per lease
        (with its sensitivity when recorded) and one of unknown sensitivity per foreign GPU.
        Made once per occupancy (a queue's look asks it for every waiter), or given
        (:attr:`known_state`)."""
        if self.known_state is not None:
            return self.known_state
        return self._host_state

    @cached_property
    def _host_state(self) -> HostState:
        running: list[RunningJob] = []
        seen: set[str] = set()
        n = self.gpu_count
        for lease in self.leases.values():  # by GPU: a lease of k GPUs comes k times
            if lease.id not in seen and lease.gpus:
                seen.add(lease.id)
                held = frozenset(gpu.index for gpu in lease.gpus if gpu.index < n)
                running.append(RunningJob(gpus=held, sensitive=lease.sensitive))
        if self._leases_alone:
            return HostState(free=self.free, running=tuple(running))
        for gpu in sorted(self.busy - frozenset(self.leases) - self.outside - self.mig):
            if gpu in self.shares:
                found = self.shares[gpu]
                running.append(RunningJob(gpus=frozenset({gpu}), sensitive=found[0].sensitive))
                continue
            running.append(RunningJob(gpus=frozenset({gpu})))
        return HostState(free=self.free, running=tuple(running))

    # ---- shared jobs -------------------------------------------------------------------------

    def shared_jobs(self, gpu: int) -> int:
        """Shared jobs on ``gpu`` now."""
        return len(self.shares.get(gpu, ()))

    def shareable(self, gpu: int) -> bool:
        """Whether a lease holds ``gpu`` and lets shared jobs run beside it (``--shareable``)."""
        holder = self.leases.get(gpu)
        return holder is not None and holder.shareable

    def shared_fraction(self, gpu: int) -> float:
        """The part of ``gpu`` its shared jobs hold (their leased fractions, summed; 0..)."""
        shares = self.shares.get(gpu, ())
        return round(sum(lease.share.fraction for lease in shares if lease.share is not None), 6)

    def declared_memory(self, gpu: int) -> int:
        """The memory the lease and the shared jobs on ``gpu`` declared (``--mem``), summed."""
        holders = (self.leases.get(gpu), *self.shares.get(gpu, ()))
        return sum(lease.memory_bytes or 0 for lease in holders if lease is not None)

    # ---- words -----------------------------------------------------------------------------

    def describe(self, gpus: Iterable[int], *, now: datetime | None = None) -> list[str]:
        """One line per holder of any of ``gpus``: who, which GPUs, since when, doing what."""
        now = now or datetime.now(timezone.utc)
        wanted = sorted(set(gpus))
        lines: list[str] = []
        outside = [g for g in wanted if g in self.outside and g not in self.leases]
        if outside:
            lines.append(f"GPU {format_cpulist(outside)}: not this Slurm job's")
            wanted = [g for g in wanted if g not in outside]
        seen: set[str] = set()
        for gpu in wanted:
            lease = self.leases.get(gpu)
            if lease is not None or gpu in self.shares:
                for holder in (lease, *self.shares.get(gpu, ())):
                    if holder is not None and holder.id not in seen:
                        seen.add(holder.id)
                        lines.append(describe_lease(holder, now=now))
            elif gpu in self.unhealthy:
                lines.append(f"GPU {gpu} is unhealthy: {self.unhealthy[gpu]}")
            elif gpu in self.unusable:
                lines.append(f"GPU {gpu} was lost (fell off the bus); check 'dmesg' for Xid errors")
            elif gpu in self.mig:
                lines.append(f"GPU {gpu} is in MIG mode: it is leased by MIG device (--mig)")
            elif self.foreign(gpu) and not self.ignore_foreign:
                lines.append(
                    f"GPU {gpu} runs {describe_processes(self.foreign(gpu))}, not through gpualloc"
                )
        return lines


def _mig_foreign(
    topology: Topology, ledger: Ledger, by_gpu: Mapping[int, list[GpuProcess]]
) -> dict[tuple[int, int], tuple[GpuProcess, ...]]:
    """Processes on MIG devices no lease holds, by MIG device (matched by GI and CI id)."""
    held = ledger.held_mig()
    device_of: dict[tuple[int, int | None, int | None], tuple[int, int]] = {
        (m.gpu, m.gpu_instance, m.compute_instance): (m.gpu, m.device)
        for m in topology.mig_instances
        if m.gpu_instance is not None and m.compute_instance is not None
    }
    found: dict[tuple[int, int], list[GpuProcess]] = {}
    for gpu, processes in by_gpu.items():
        for process in processes:
            key = device_of.get((gpu, process.gpu_instance, process.compute_instance))
            if key is not None and key not in held:
                found.setdefault(key, []).append(process)
    return {key: tuple(found[key]) for key in sorted(found)}


ORPHANED = "its id was never printed: the alloc that made it was killed; 'release --mine' frees it"


def orphaned(lease: Lease) -> bool:
    """The gpualloc that made ``lease`` died before it printed the lease's id: nobody knows
    the id, so ``status`` marks the lease, and ``release --mine`` (or
    ``release`` with the id ``status`` shows) frees it."""
    if lease.announced or lease.creator_pid is None:
        return False
    from gpualloc.ledger.liveness import process_alive

    return not process_alive(lease.creator_pid, lease.creator_start_time)


def describe_lease(lease: Lease, *, now: datetime | None = None) -> str:
    """``GPU 0,1 held by alice since 14:02 (2h 5m), lease 1a2b3c4d5e6f, pid 4242: python
    train.py``."""
    now = now or datetime.now(timezone.utc)
    text = f"{held_devices(lease)} {'shared' if lease.share else 'held'} by {lease.user}"
    text += f" for {format_age(now - lease.created)}, lease {lease.id}"
    if lease.name:
        text += f" ({printable(lease.name, 40)})"
    if lease.shareable:
        text += ", shareable"
    ends = lease.ends
    if lease.hold:
        text += ", until released" if ends is None else f", until {_when(ends, now)}"
    elif lease.pid is not None:
        text += f", pid {lease.pid}"
        if ends is not None:
            text += f" until {_when(ends, now)}"
    if lease.command:
        text += f": {printable(' '.join(lease.command), 60)}"
    if orphaned(lease):
        text += f" ({ORPHANED})"
    return text


def _when(ends: datetime, now: datetime) -> str:
    """When a time limit runs out, for people: ``14:05 (in 25m 10s)``, or that it has."""
    if ends <= now:
        return "its time limit (passed)"
    local = ends.astimezone().strftime("%H:%M" if ends - now < timedelta(days=1) else "%b %d %H:%M")
    return f"{local} (its time limit, in {format_age(ends - now)})"


def held_devices(lease: Lease, *, ranked: bool = False) -> str:
    """``GPU 0-3,6``, ``GPU0/MIG3 (1g.5gb)``, or both. ``ranked``: the GPUs in rank order,
    as the job's CUDA_VISIBLE_DEVICES has them (``GPU 3,1``), for what is said of a job as it
    starts; elsewhere (who holds what, releases) the set, sorted, reads better: a 7-GPU ring's
    order squeezed into ranges read ``0-1,3-5,2,6``."""
    listed = format_ranks(lease.indices) if ranked else format_cpulist(lease.indices)
    parts = [f"GPU {listed}"] if lease.indices else []
    parts += [m.label + (f" ({m.profile})" if m.profile else "") for m in lease.mig]
    return ", ".join(parts)


def describe_processes(processes: Iterable[GpuProcess]) -> str:
    """``pid 812 (python, bob)`` for each process."""
    parts = []
    for process in processes:
        details = ", ".join(part for part in (process.name, process.user) if part)
        parts.append(f"pid {process.pid}" + (f" ({details})" if details else ""))
    return "; ".join(parts)


def format_age(delta: timedelta) -> str:
    """A timedelta as ``45s``, ``12m``, ``3h 5m`` or ``2d 4h``."""
    seconds = max(0, int(delta.total_seconds()))
    if seconds < 60:
        return f"{seconds}s"
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if hours == 0:
        return f"{minutes}m"
    if days == 0:
        return f"{hours}h {minutes % 60}m"
    return f"{days}d {hours % 24}h"


def _mix(ledger: Ledger, given: dict[tuple[int, float], float] | None) -> dict[str, Any]:
    """The mix FGD weighs: the one given (a simulation's jobs), else the host's recent requests
    (``Ledger.stats.request_mix``), else, with too few of those, the default mix."""
    if given is not None:
        return {"share_mix": given, "share_mix_source": "the workload's own mix"}
    recent, weight = ledger.stats.recent_mix()
    if recent is not None:
        return {
            "share_mix": recent,
            "share_mix_source": f"this host's recent requests ({weight:.0f} by weight; older "
            f"ones fade over about {MIX_MEMORY})",
        }
    return {
        "share_mix": None,
        "share_mix_source": f"the Alibaba trace's mix (this host has recorded {weight:.0f} "
        f"of the {MIX_MIN_REQUESTS} requests its own mix needs)",
    }
