"""Which host a command is on: the one place that decides between the host's broker, a Slurm
job's own ledger, this host's embedded ledger, and a recorded topology's ledger.

- **The broker** (:class:`~gpualloc.host.brokered.BrokeredHost`) when the host has one (its
  socket exists, or ``host.broker`` names it), unless the command runs inside a Slurm job with
  GPUs (the job's GPUs have a ledger of their own) or on a named topology that is not this
  host (a trial on another host's topology).
- Otherwise the embedded ledger (:class:`~gpualloc.host.local.LocalHost`) of the topology: this
  host's, limited to the Slurm job's GPUs inside one, or the named topology's own.

The command line, the Python API and ``plan`` all ask :func:`open_host`; it decides with
:func:`broker_for`, which imports nothing heavy, so a command through the broker loads no
topology to find it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpualloc.config import Config
    from gpualloc.host.protocol import Host
    from gpualloc.model.topology import Topology


def broker_for(
    configured: Path | None,
    env: Mapping[str, str],
    named_topology: Callable[[], Topology] | None = None,
    *,
    node_hook: bool = False,
) -> Path | None:
    """The broker's socket when the ledger of this request is the broker's, else None.

    ``configured`` is the ``host.broker`` setting; ``named_topology`` loads the topology the
    request names (``--topology``, ``$GPUALLOC_TOPOLOGY``, the API's ``topology=``), None when it
    names none (this host). ``node_hook``: Slurm's Prolog or Epilog, which runs with the job's
    variables but records the job in the host's ledger, not in the job's own."""
    from gpualloc.wire.address import broker_socket

    socket = broker_socket(configured)
    if socket is None or passed_by(env, named_topology, node_hook=node_hook):
        return None
    return socket


def passed_by(
    env: Mapping[str, str],
    named_topology: Callable[[], Topology] | None = None,
    *,
    node_hook: bool = False,
) -> str | None:
    """Why a request does not go to the host's broker, in words (None when it does, if there
    is one): inside a Slurm job, or on a named topology that is not this host. A front end
    tells a user who configured a broker themselves (``tests/test_broker_clients.py``)."""
    from gpualloc.config import no_slurm

    if env.get("SLURM_JOB_ID") and not no_slurm(env) and not node_hook:
        return "inside a Slurm job the job's GPUs have a ledger of their own"
    if named_topology is not None:
        from gpualloc.discovery.this_host import describes_this_host

        topology = named_topology()
        if not describes_this_host(topology):
            return (
                f"the topology named ({topology.name or topology.provenance.source}) is not this "
                "host, so it has a ledger of its own"
            )
    return None


def open_host(
    load_topology: Callable[[], Topology],
    config: Config,
    *,
    named: bool,
    env: Mapping[str, str] | None = None,
    ignore_foreign: bool = False,
    create: bool = True,
    check_health: bool = True,
    allow_unhealthy: bool = False,
    full: bool = True,
    reconnect_s: float | None = None,
) -> Host:
    """The host a request is on (module docstring).

    ``load_topology`` gives the topology named, else this host's; ``named`` says whether one
    was named. ``ignore_foreign``: GPUs used outside gpualloc count as free. ``create``: make
    the state directory if missing. ``check_health``: ask which GPUs are unhealthy (placing and
    showing need it, releasing does not). ``full``: through the broker, fetch its ledger,
    processes and faults too (``run`` and ``alloc`` need only the topology). ``reconnect_s``:
    how long a broker that went away is tried again (None: the client's default)."""
    env = os.environ if env is None else env
    socket = broker_for(config.value("host.broker"), env, load_topology if named else None)
    host: Host
    if socket is not None:
        from gpualloc.host.brokered import BrokeredHost

        host = BrokeredHost.open(
            socket,
            full=full,
            answer_s=config.value("host.broker_timeout"),
            reconnect_s=reconnect_s,
        )
    else:
        from gpualloc.host.local import LocalHost
        from gpualloc.host.time_rules import TimeRules

        topology = load_topology()
        job = None
        if env.get("SLURM_JOB_ID"):  # else no job (slurm_job's first test), nothing to import
            from gpualloc.slurm.job import slurm_job

            job = slurm_job(topology, env)
        local = LocalHost.open(
            topology,
            ignore_foreign=ignore_foreign,
            create=create,
            slurm_job=job,
            state_dir=config.value("state_dir"),
            lock_timeout_s=config.value("lock_timeout"),
            check_health=check_health,
        )
        local.take_share_settings(config)
        local.placement_budget_s = config.value("placement.time_budget")
        local.time_rules = TimeRules.from_config(config)
        host = local
    host.allow_unhealthy = allow_unhealthy
    return host
