"""gpualloc as a Python library: plan placements, and hold GPUs through the shared ledger.

For Python programs that launch work themselves (a sweep driver, a notebook, a Ray or Dask
worker) and want what ``gpualloc plan`` and ``gpualloc run`` give the shell::

    import gpualloc.api as gpualloc

    topology = gpualloc.load_topology("dgx1-v100")      # None: probe this host
    placement = gpualloc.plan(topology, 2, busy={0})     # what would be chosen, nothing held
    print(placement.gpus, placement.scores.effective_gbps)

    with gpualloc.hold(2, topology=topology, wait=True) as lease:   # in the ledger, for us
        subprocess.run(["python", "train.py"], env={**os.environ, **lease.environment})

The job's options are the command line's, by the same names (the table of
:mod:`gpualloc.job_options`): ``hold(2, policy="drb", min_bandwidth=100)``, a MIG device with
``hold(1, mig="1g.10gb")``, a shared place on a GPU with ``hold(1, share=True, mem=8 * 2**30)``.

A held lease belongs to this process (its pid): it is released when the ``with`` block ends,
and reaped by the next gpualloc that looks if the process dies first. Defaults (policy, state
directory, queue bounds) come from the configuration files, as on the command line. Errors are
:class:`gpualloc.errors.GpuallocError` subclasses with ``message``, ``hint`` and ``exit_code``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from msgspec import Struct, field

__all__ = ["HeldGpus", "hold", "load_topology", "plan"]

if TYPE_CHECKING:
    from gpualloc.config import Config
    from gpualloc.host.protocol import Host
    from gpualloc.ledger.schema import Lease
    from gpualloc.model.request import Placement
    from gpualloc.model.topology import Topology


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
    **job: Any,
) -> Placement:
    """The placement the policy chooses for a job of ``gpus`` GPUs with ``busy`` taken (the
    ledger is not consulted; see :func:`hold`). ``job`` takes the command line's job options
    by name, as :func:`hold` does (``pattern``: ring, all, tree, star or a JSON edge-list
    file; ``policy``, ``sensitive``, ``exclude``, ``require``, ...). It decides as ``run``
    does, through the placement's front door (:func:`gpualloc.placement.choose.choose`) on
    an idle host with ``busy`` laid over it. Raises NoFeasiblePlacement when no set fits the
    host, GpusBusy when one would were the ``busy`` GPUs free."""
    from msgspec.structs import replace

    from gpualloc.config import Config
    from gpualloc.ledger.occupancy import Occupancy
    from gpualloc.ledger.schema import Ledger
    from gpualloc.model.request import HostState
    from gpualloc.placement.choose import choose
    from gpualloc.placement.options import want_of

    want = want_of(_job_options(gpus, job), Config.load())
    idle = Occupancy.build(topology, Ledger(host="plan"))
    state = HostState.with_busy(topology.gpu_count, frozenset(busy))
    return choose(topology, replace(idle, known_state=state), want)


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
    gpus: int = 1,
    *,
    topology: Topology | None = None,
    name: str | None = None,
    wait: bool = False,
    timeout_s: float | None = None,
    time_limit_s: float | None = None,
    **job: Any,
) -> Iterator[HeldGpus]:
    """Hold the best free GPUs for the ``with`` block, through the ledger every user of the
    host shares (its broker's, where it has one; inside a Slurm job: the job's GPUs and its
    own ledger). ``job`` takes the command line's job options by name (``pattern``,
    ``sensitive``, ``policy``, ``exclude``, ``require``, ``score``, ``drb_weights``,
    ``min_utility``, ``min_bandwidth``, ``mig``, ``mem``, ``share``, ``shareable``,
    ``background``, ``sm_share``; ``explicit`` for ``--gpus``). Without ``wait``, raises
    GpusBusy when they are taken now; with it, queues like ``run --wait`` (WaitTimedOut after
    ``timeout_s``). ``time_limit_s`` is ``--time`` in seconds (None: the host's default; 0:
    none): at the limit this process gets SIGTERM, and SIGKILL ``limits.kill_wait`` later."""
    from gpualloc.config import Config
    from gpualloc.durations import seconds_given
    from gpualloc.host.lease_terms import LeaseTerms
    from gpualloc.host.queue_policy import WaitOptions
    from gpualloc.launcher.environment import job_variables
    from gpualloc.launcher.sharing import share_mode
    from gpualloc.placement.options import want_of

    config = Config.load()  # read once: the topology, the policy, the state directory, the queue
    options = _job_options(gpus, job)
    want = want_of(options, config)  # as plan, run and alloc turn their options into a request
    terms = LeaseTerms(
        source="alloc",
        pid=os.getpid(),
        name=name,
        shareable=options.shareable,
        memory_bytes=options.declared_memory_bytes(),
        share_mode=share_mode(os.environ) if options.share else "time-sliced",
        time_limit_s=seconds_given(time_limit_s, "time_limit_s"),
    )
    waiting = WaitOptions.from_config(config, timeout_s=timeout_s) if wait else None
    host = _host(config, topology)
    allocation = host.allocate(want, terms, wait=waiting)
    placement, lease = allocation.placement, allocation.lease
    if lease.time_limit_s and host.broker_socket is None:  # a broker keeps limits itself
        from gpualloc.host.grant import grant_of

        this_host = host.this_host
        host.start_time_limit_watch(
            grant_of(host.topology, allocation, want, uuid=False, this_host=this_host)
        )
    held = HeldGpus(
        lease,
        placement,
        job_variables(
            host.topology, lease.indices, lease.mig_keys, lease_id=lease.id, uuid=False,
            share=lease.share,
        ),
    )  # fmt: skip
    try:
        yield held
    finally:
        host.release(lease.id)


def _job_options(count: int, given: dict[str, Any]) -> Any:
    """The JobOptions of ``hold`` and ``plan``: ``count`` GPUs (one where a MIG device or a
    shared place is asked for), and the command line's job options by name."""
    from gpualloc.errors import RequestError
    from gpualloc.model.job import JobOptions, gpu_indices

    names = set(JobOptions.__struct_fields__) - {"count", "gpus"}
    unknown = sorted(set(given) - names - {"explicit"})
    if unknown:
        raise RequestError(
            f"unknown job option {unknown[0]!r}", hint="one of: " + ", ".join(sorted(names))
        )
    values = {key: value for key, value in given.items() if key != "explicit"}
    if given.get("explicit") is not None:
        values["gpus"] = gpu_indices(given["explicit"], "--gpus")
    for key in ("exclude", "require"):
        if values.get(key) is not None and not isinstance(values[key], str):
            values[key] = gpu_indices(values[key], f"--{key}")
    single = (
        given.get("mig") is not None
        or given.get("share")
        or (given.get("mem") is not None and not given.get("shareable"))
    )
    return JobOptions(count=None if single and count == 1 else count, **values)


_BROKERED: dict[tuple[int, str], Host] = {}
"""One connection to the broker per process (keyed by pid: a forked child makes its own, so
the kernel names the right process), with the broker's topology."""


def _host(config: Config, topology: Topology | None) -> Host:
    """The host ``hold`` is on: :func:`gpualloc.host.open.open_host` decides, as on the command
    line; a brokered host is opened once per process and kept."""
    from gpualloc.host.open import broker_for, open_host

    named = topology is not None or bool(os.environ.get("GPUALLOC_TOPOLOGY"))

    def load() -> Topology:
        return topology or _load_topology(None, config)

    socket = broker_for(config.value("host.broker"), os.environ, load if named else None)
    key = (os.getpid(), str(socket))
    if socket is not None and key in _BROKERED:
        return _BROKERED[key]
    host = open_host(load, config, named=named, full=False)
    if socket is not None:
        _BROKERED[key] = host
    return host
