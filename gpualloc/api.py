"""gpualloc as a Python library: plan placements, and hold GPUs through the shared ledger.

For Python programs that launch work themselves (a sweep driver, a notebook, a Ray or Dask
worker) and want what ``gpualloc plan`` and ``gpualloc run`` give the shell::

    import gpualloc.api as gpualloc

    topology = gpualloc.load_topology("dgx1-v100")      # None: probe this host
    placement = gpualloc.plan(topology, 2, busy={0})     # what would be chosen, nothing held
    print(placement.gpus, placement.scores.effective_gbps)

    with gpualloc.hold(2, topology=topology, wait=True) as lease:   # in the ledger, for us
        subprocess.run(["python", "train.py"], env={**os.environ, **lease.environment})

A held lease belongs to this process (its pid): it is released when the ``with`` block ends,
and reaped by the next gpualloc that looks if the process dies first. Defaults (policy, state
directory, queue bounds) come from the configuration files, as on the command line. Errors are
:class:`gpualloc.errors.GpuallocError` subclasses with ``message``, ``hint`` and ``exit_code``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from msgspec import Struct, field

if TYPE_CHECKING:
    from gpualloc.broker.remote import RemoteLedger
    from gpualloc.config import Config
    from gpualloc.launcher.allocate import LeaseTerms
    from gpualloc.launcher.queue import WaitOptions
    from gpualloc.ledger.schema import Lease
    from gpualloc.model.request import Placement
    from gpualloc.model.topology import Topology
    from gpualloc.placement.want import Want


def load_topology(name_or_path: str | None = None) -> Topology:
    """A bundled topology by name, a topology file (JSON or ``nvidia-smi topo -m`` text), or,
    with None, this host (NVML, else nvidia-smi; ``$GPUALLOC_TOPOLOGY`` when set)."""
    from gpualloc.config import Config

    return _load_topology(name_or_path, Config.load())


def _load_topology(name_or_path: str | None, config: Config) -> Topology:
    from gpualloc.discovery.resolve import configured_bandwidth_table, resolve_topology

    return resolve_topology(name_or_path, table=configured_bandwidth_table(config))


def plan(
    topology: Topology,
    gpus: int,
    *,
    busy: Iterable[int] = (),
    pattern: str = "ring",
    sensitive: bool | None = None,
    policy: str | None = None,
    exclude: Iterable[int] = (),
    require: Iterable[int] = (),
) -> Placement:
    """The placement ``policy`` chooses for a job of ``gpus`` GPUs with ``busy`` taken (the
    ledger is not consulted; see :func:`hold`). ``pattern`` is ring, all, tree, star or a JSON
    edge-list file. Raises NoFeasiblePlacement when no set fits."""
    from gpualloc.config import Config
    from gpualloc.model.request import HostState
    from gpualloc.placement.decide import decision_context
    from gpualloc.placement.options import JobOptions
    from gpualloc.placement.registry import get_policy

    options = JobOptions(
        count=gpus, pattern=pattern, sensitive=sensitive, policy=policy,
        exclude=tuple(exclude), require=tuple(require),
    )  # fmt: skip
    want = options.want(Config.load())
    state = HostState.with_busy(topology.gpu_count, frozenset(busy))
    return get_policy(want.policy).place(decision_context(topology, want.request, state))


class HeldGpus(Struct):
    """GPUs held in the ledger for this process."""

    lease: Lease
    placement: Placement
    environment: dict[str, str] = field(default_factory=dict)
    """CUDA_VISIBLE_DEVICES (rank order), CUDA_DEVICE_ORDER, GPUALLOC_LEASE_ID, GPUALLOC_GPUS."""

    @property
    def gpus(self) -> tuple[int, ...]:
        return self.placement.gpus


@contextmanager
def hold(
    gpus: int,
    *,
    topology: Topology | None = None,
    pattern: str = "ring",
    sensitive: bool | None = None,
    policy: str | None = None,
    exclude: Iterable[int] = (),
    require: Iterable[int] = (),
    name: str | None = None,
    wait: bool = False,
    timeout_s: float | None = None,
) -> Iterator[HeldGpus]:
    """Hold the best free GPUs for the ``with`` block, through the ledger every user of the
    host shares (inside a Slurm job: the job's GPUs and its own ledger). Without ``wait``,
    raises GpusBusy when they are taken now; with it, queues like ``run --wait`` (WaitTimedOut
    after ``timeout_s``)."""
    from gpualloc.config import Config
    from gpualloc.launcher.allocate import HostLedger, LeaseTerms
    from gpualloc.launcher.environment import gpu_variables
    from gpualloc.launcher.queue import WaitOptions
    from gpualloc.launcher.wait import wait_and_allocate
    from gpualloc.placement.options import JobOptions
    from gpualloc.slurm.job import slurm_job

    config = Config.load()  # read once: the topology, the policy, the state directory, the queue
    options = JobOptions(
        count=gpus, pattern=pattern, sensitive=sensitive, policy=policy,
        exclude=tuple(exclude), require=tuple(require),
    )  # fmt: skip
    want = options.want(config)  # as plan, run and alloc turn their options into a request
    terms = LeaseTerms(source="alloc", pid=os.getpid(), name=name)
    waiting = WaitOptions.from_config(config, timeout_s=timeout_s) if wait else None
    remote = _broker(config, topology)
    if remote is not None:
        with _held_through_broker(remote, want, terms, waiting) as held:
            yield held
        return
    topology = topology or _load_topology(None, config)
    host = HostLedger.open(
        topology,
        slurm_job=slurm_job(topology, os.environ),
        state_dir=config.value("state_dir"),
        lock_timeout_s=config.value("lock_timeout"),
    )
    host.take_share_settings(config)  # as open_host_ledger does
    if waiting is not None:
        allocation = wait_and_allocate(host, want, terms, waiting)
    else:
        allocation = host.allocate(want, terms)
    chosen = [topology.gpu(g) for g in allocation.placement.gpus]
    held = HeldGpus(
        allocation.lease,
        allocation.placement,
        gpu_variables(chosen, lease_id=allocation.lease.id),
    )
    try:
        yield held
    finally:
        host.release(allocation.lease.id)


# ---- through the host's broker -----------------------------------------------------------------

_BROKERS: dict[tuple[int, str], tuple[RemoteLedger, Topology]] = {}
"""One connection to the broker per process (keyed by pid: a forked child makes its own, so
the kernel names the right process), with the broker's topology."""


def _broker(config: Config, topology: Topology | None) -> tuple[RemoteLedger, Topology] | None:
    """The broker's connection and topology when this host has a broker and ``hold`` is not
    for another host's topology or inside a Slurm job (as on the command line)."""
    from gpualloc.broker.address import broker_socket

    socket = broker_socket(config.value("host.broker"))
    if socket is None:
        return None
    if os.environ.get("SLURM_JOB_ID") and os.environ.get("GPUALLOC_NO_SLURM", "") in ("", "0"):
        return None
    if topology is not None:
        from gpualloc.discovery.this_host import describes_this_host

        if not describes_this_host(topology):
            return None
    key = (os.getpid(), str(socket))
    if key not in _BROKERS:
        from gpualloc.broker.remote import RemoteLedger
        from gpualloc.model.topology import Topology
        from gpualloc.model.validation import from_builtins

        remote = RemoteLedger(socket)
        _BROKERS[key] = (remote, from_builtins(remote.view(full=False)["topology"], Topology))
    return _BROKERS[key]


@contextmanager
def _held_through_broker(
    broker: tuple[RemoteLedger, Topology],
    want: Want,
    terms: LeaseTerms,
    waiting: WaitOptions | None,
) -> Iterator[HeldGpus]:
    from gpualloc.launcher.environment import job_variables

    remote, topology = broker
    allocation = remote.allocate(want, terms, waiting=waiting)
    placement = allocation.placement
    held = HeldGpus(
        allocation.lease,
        placement,
        job_variables(
            topology, placement.gpus, placement.mig_devices, lease_id=allocation.lease.id,
            uuid=False,
        ),
    )  # fmt: skip
    try:
        yield held
    finally:
        remote.release(allocation.lease.id)
