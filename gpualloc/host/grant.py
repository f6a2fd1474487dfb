"""What a job started on a host gets: its lease, and all its launch and its printout need.

:meth:`gpualloc.host.protocol.Host.start` answers with a :class:`Grant`: the embedded ledger
computes it from its topology (:func:`grant_of`), the host's broker computes it the same way and
sends it, so that its client execs the job without decoding the topology or the ledger's
models (:func:`grant_from_answer`; ``tests/test_startup_imports.py`` holds what that route may
load). ``run`` (:func:`gpualloc.host.launching.launch_granted`), ``alloc`` and the API all read the
one record.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpualloc.host.terms import Allocation
    from gpualloc.model.topology import Topology
    from gpualloc.placement.want import Want


class SharedPlace:
    """How a shared job (``run --share``) holds its GPU, as its launch needs it: its share
    ``mode`` (``time-sliced`` or ``mps``), whether it runs in the ``background``, and its
    ``--sm-share`` (``sm_percent``), which only CUDA MPS enforces."""

    __slots__ = ("background", "mode", "sm_percent")

    def __init__(self, mode: str, background: bool, sm_percent: int | None) -> None:
        self.mode = mode
        self.background = background
        self.sm_percent = sm_percent


class Grant:
    """A lease just made, as plain data (a plain class: ``run`` makes one on its way to
    ``exec``).

    - ``variables``: what the job's environment gains (:mod:`gpualloc.launcher.environment`);
    - ``held``: the devices held, in words (``GPU 0,3``, ``GPU0/MIG1``);
    - ``numa_nodes``: each GPU's NUMA node, in rank order (None where unknown);
    - ``this_host``: whether the GPUs are this machine's (only then is the job bound and
      watched);
    - ``notes``: what the host said while allocating (warnings for the user);
    - ``share``: a shared job's place on its GPU (None: the GPUs are the job's alone);
    - ``record``: the host's own record of the lease, which only that host reads back
      (:meth:`~gpualloc.host.protocol.Host.start_verifier`);
    - ``views``: the lease and its placement as ``--json`` shows them (computed when asked);
    - ``lock_fd``: the lease lock's descriptor, kept open for the job to inherit (the
      embedded ledger).
    """

    __slots__ = (
        "held",
        "lease_id",
        "lock_fd",
        "notes",
        "numa_nodes",
        "record",
        "share",
        "this_host",
        "variables",
        "views",
    )  # fmt: skip

    def __init__(
        self,
        *,
        lease_id: str,
        variables: dict[str, str],
        held: str,
        numa_nodes: list[int | None],
        this_host: bool,
        notes: list[str],
        share: SharedPlace | None,
        record: object,
        views: Callable[[], tuple[dict[str, Any], dict[str, Any]]],
        lock_fd: int | None = None,
    ) -> None:
        self.lease_id = lease_id
        self.variables = variables
        self.held = held
        self.numa_nodes = numa_nodes
        self.this_host = this_host
        self.notes = notes
        self.share = share
        self.record = record
        self.views = views
        self.lock_fd = lock_fd


def grant_of(
    topology: Topology, allocation: Allocation, want: Want, *, uuid: bool, this_host: bool
) -> Grant:
    """The grant of ``allocation`` on ``topology``, whichever ledger made it."""
    from gpualloc.launcher.environment import job_variables
    from gpualloc.ledger.occupancy import held_devices

    lease, placement = allocation.lease, allocation.placement

    def views() -> tuple[dict[str, Any], dict[str, Any]]:
        from gpualloc.json_views import lease_json, placement_json

        return lease_json(lease), placement_json(topology, want.request, placement)

    return Grant(
        lease_id=lease.id,
        variables=job_variables(
            topology,
            lease.indices,
            lease.mig_keys,
            lease_id=lease.id,
            uuid=uuid,
            share=lease.share,
        ),
        held=held_devices(lease, ranked=True),
        numa_nodes=[topology.gpu(g).numa_node for g in placement.parent_gpus],
        this_host=this_host,
        notes=list(allocation.notes),
        share=None
        if lease.share is None
        else SharedPlace(lease.share.mode, lease.share.background, lease.share.sm_percent),
        record=lease,
        views=views,
        lock_fd=allocation.lock_fd,
    )


def grant_answer(grant: Grant) -> dict[str, Any]:
    """What the broker sends of ``grant`` (besides the lease and placement it always sends)."""
    lease_json, placement_json = grant.views()
    return {
        "environment": grant.variables,
        "numa_nodes": grant.numa_nodes,
        "this_host": grant.this_host,
        "held": grant.held,
        "lease_json": lease_json,
        "placement_json": placement_json,
    }


def grant_from_answer(answer: dict[str, Any]) -> Grant:
    """The grant in a broker's answer to an ``alloc`` that asked for its views; ``record`` is
    the lease as the broker sent it."""
    lease = answer["lease"]
    share = lease.get("share")
    return Grant(
        lease_id=lease["id"],
        variables=dict(answer["environment"]),
        held=answer["held"],
        numa_nodes=list(answer["numa_nodes"]),
        this_host=bool(answer["this_host"]),
        notes=list(answer.get("notes", [])),
        share=None
        if share is None
        else SharedPlace(
            share.get("mode", "time-sliced"), bool(share.get("background")), share.get("sm_percent")
        ),
        record=lease,
        views=lambda: (answer["lease_json"], answer["placement_json"]),
    )
