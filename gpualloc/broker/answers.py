"""What the broker answers from the ledger's records: a lease's placement, said again to a
request sent twice, and a release's receipt."""

from __future__ import annotations

from typing import Any

from gpualloc.ledger.schema import Lease
from gpualloc.model.request import Placement, Scores
from gpualloc.model.validation import to_builtins


def placement_of(lease: Lease) -> Placement:
    """The placement a lease records (for a request sent again: its first answer is gone)."""
    scores = lease.scores
    return Placement(
        policy=lease.policy or "",
        gpus=() if lease.mig else lease.indices,
        scores=Scores(
            aggregated_gbps=scores.get("aggregated_gbps"),
            effective_gbps=scores.get("effective_gbps"),
            preserved_gbps=scores.get("preserved_gbps") or 0.0,
            bottleneck_gbps=scores.get("bottleneck_gbps"),
            utility=scores.get("utility") or 0.0,
        ),
        objective="the lease this request made before",
        mig_devices=lease.mig_keys,
        shared=lease.share is not None,
    )


def release_answer(result: Any, problems: list[Any] | None) -> dict[str, Any]:
    """A release's (or an eviction's) answer: the leases, and their receipt, as the client
    prints them (:mod:`gpualloc.host.receipt`)."""
    from gpualloc.host.receipt import receipt_answer

    return {
        "released": [to_builtins(lease) for lease in result.released],
        "kept": [to_builtins(lease) for lease in result.kept],
        **receipt_answer(result),
        "problems": [
            {"code": int(p.exit_code), "message": p.message, "hint": p.hint}
            for p in (result.problems if problems is None else problems)
        ],
    }
