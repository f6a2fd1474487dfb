"""The documented ``--json`` shapes of a placement and of a lease."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpualloc.ledger.schema import Lease
    from gpualloc.model.request import JobRequest, Placement
    from gpualloc.model.topology import Topology


def placement_json(topology: Topology, request: JobRequest, placement: Placement) -> dict[str, Any]:
    """The documented ``plan --json`` contract, plus context fields (also in ``run``,
    ``alloc`` and ``status`` output)."""
    from gpualloc.model.mig import mig_label

    return {
        "policy": placement.policy,
        "gpus": list(placement.gpus),
        "mig_devices": [mig_label(*key) for key in placement.mig_devices],
        "scores": placement.score_values(),
        "numa_nodes": [topology.gpu(g).numa_node for g in placement.parent_gpus],
        "effective_model": placement.scores.effective_model,
        "objective": placement.objective,
        "pattern": request.pattern.name,
        "sensitive": request.sensitive,
        "cut_short": placement.cut_short,
        "decided_by": placement.decided_by,
        "notes": list(placement.notes),
    }


def lease_json(lease: Lease) -> dict[str, Any]:
    """A lease as ``status --json`` and ``alloc --format json`` print it, with ``orphaned``:
    its id never reached anyone (see :func:`gpualloc.ledger.occupancy.orphaned`), and
    ``ends``: when its time limit runs out (None: it has none)."""
    from gpualloc.ledger.occupancy import orphaned
    from gpualloc.model.validation import to_builtins

    ends = lease.ends
    return {
        **to_builtins(lease),
        "orphaned": orphaned(lease),
        "ends": ends.isoformat() if ends is not None else None,
    }
