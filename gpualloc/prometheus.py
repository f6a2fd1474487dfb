"""The host's GPUs, leases and queue as Prometheus metrics.

Rendered in the text exposition format (version 0.0.4) from one read of the ledger, as
``status`` reads it: nothing is kept between scrapes but what the ledger keeps
(:mod:`gpualloc.ledger.stats`). Every metric is listed, with its type and labels, in
:data:`METRICS`, which docs/metrics.md's table is checked against.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpualloc.host.protocol import Host
    from gpualloc.ledger.idle import IdlePolicy
    from gpualloc.ledger.occupancy import Occupancy
    from gpualloc.ledger.stats import Histogram
    from gpualloc.ledger.store import LedgerTransaction

GPU_STATES = ("free", "held", "shared", "foreign", "unhealthy", "lost", "mig", "outside")
METRICS: dict[str, tuple[str, str]] = {
    "gpualloc_gpus": ("gauge", "GPUs of the host by state (label state)."),
    "gpualloc_gpu_info": (
        "gauge",
        "1 per GPU, labelled gpu, uuid, state, user (the lease holder, or empty) and lease.",
    ),
    "gpualloc_gpu_memory_used_bytes": (
        "gauge",
        "Memory in use per GPU (label gpu), as NVML reports it; absent where unknown.",
    ),
    "gpualloc_gpu_utilization_percent": (
        "gauge",
        "Percent of NVML's last sample period a kernel ran, per GPU (label gpu); absent where "
        "unknown.",
    ),
    "gpualloc_leases": ("gauge", "Live leases by source (run, alloc, slurm) and user."),
    "gpualloc_lease_gpus": ("gauge", "Whole GPUs held by each lease (labels lease, user)."),
    "gpualloc_lease_idle_seconds": (
        "gauge",
        "How long each lease's GPUs have been idle (labels lease, user; 0 while busy); absent "
        "where no utilisation is known.",
    ),
    "gpualloc_lease_mismatches": (
        "gauge",
        "Processes off their lease's GPUs (kind misplaced) and others' processes on leased GPUs "
        "(kind intruder).",
    ),
    "gpualloc_lease_slurm_conflicts": (
        "gauge",
        "1 per lease holding GPUs that Slurm gave a job (labels lease, user, slurm_job).",
    ),
    "gpualloc_shared_jobs": ("gauge", "Shared jobs (run --share) running, by GPU."),
    "gpualloc_shared_fraction": (
        "gauge",
        "The part of each GPU its shared jobs hold (their --sm-share, else their memory or "
        "1/share.max_jobs), 0..1.",
    ),
    "gpualloc_mig_devices": ("gauge", "MIG devices by state (free, held, foreign)."),
    "gpualloc_queue_length": ("gauge", "Jobs waiting (run/alloc --wait) by priority."),
    "gpualloc_queue_oldest_wait_seconds": (
        "gauge",
        "How long the longest-waiting job has waited (0 with an empty queue).",
    ),
    "gpualloc_placements_total": ("counter", "Leases made, by placement policy."),
    "gpualloc_decision_seconds": (
        "histogram",
        "Time to choose GPUs for a job that did not wait, inside the ledger transaction.",
    ),
    "gpualloc_wait_seconds": (
        "histogram",
        "Time each job waited in the queue before it started (0 if it did not wait).",
    ),
}


def render(host: Host, txn: LedgerTransaction, occupancy: Occupancy, idle: IdlePolicy) -> str:
    """The metrics text for one scrape (``idle``: the system's idle policy)."""
    from gpualloc.ledger.attribution import attribute
    from gpualloc.ledger.idle import lease_uses

    now = datetime.now(timezone.utc)
    ledger = txn.ledger
    out: list[str] = []

    def family(name: str, samples: Iterable[tuple[dict[str, str], float]]) -> None:
        kind, about = METRICS[name]
        out.append(f"# HELP {name} {about}")
        out.append(f"# TYPE {name} {kind}")
        out.extend(_sample(name, labels, value) for labels, value in samples)

    states = Counter(occupancy.state(g) for g in range(host.topology.gpu_count))
    family("gpualloc_gpus", (({"state": state}, states[state]) for state in GPU_STATES))
    family(
        "gpualloc_gpu_info",
        ((_gpu_labels(host, occupancy, g.index), 1) for g in host.topology.gpus),
    )
    family(
        "gpualloc_gpu_memory_used_bytes",
        (({"gpu": str(g)}, used) for g, used in sorted(occupancy.memory_used.items())),
    )
    family(
        "gpualloc_gpu_utilization_percent",
        (({"gpu": str(g)}, busy) for g, busy in sorted(host.processes.utilization.items())),
    )
    by_source = Counter((x.source, x.user) for x in ledger.leases)
    family(
        "gpualloc_leases",
        (({"source": s, "user": u}, n) for (s, u), n in sorted(by_source.items())),
    )
    family(
        "gpualloc_lease_gpus",
        (({"lease": x.id, "user": x.user}, len(x.gpus)) for x in ledger.whole_leases()),
    )
    uses = lease_uses(ledger.leases, host.processes.utilization, idle, now)
    family(
        "gpualloc_lease_idle_seconds",
        (
            ({"lease": x.id, "user": x.user}, _seconds(uses[x.id].idle))
            for x in ledger.leases
            if uses[x.id].busy is not None
        ),
    )
    found = attribute(ledger.leases, host.processes.processes)
    family(
        "gpualloc_lease_mismatches",
        [
            ({"kind": "misplaced"}, len(found.misplaced)),
            ({"kind": "intruder"}, len(found.intruders)),
        ],
    )
    family(
        "gpualloc_lease_slurm_conflicts",
        (
            ({"lease": x.id, "user": x.user, "slurm_job": str(x.slurm_conflict)}, 1)
            for x in ledger.leases
            if x.slurm_conflict is not None
        ),
    )
    family(
        "gpualloc_shared_jobs",
        (({"gpu": str(g)}, len(found)) for g, found in sorted(occupancy.shares.items())),
    )
    family(
        "gpualloc_shared_fraction",
        (({"gpu": str(g)}, occupancy.shared_fraction(g)) for g in sorted(occupancy.shares)),
    )
    foreign = {} if occupancy.ignore_foreign else occupancy.mig_foreign
    mig = Counter(
        "held" if key in occupancy.mig_leases else "foreign" if key in foreign else "free"
        for key in ((m.gpu, m.device) for m in host.topology.mig_instances)
    )
    family("gpualloc_mig_devices", (({"state": s}, mig[s]) for s in ("free", "held", "foreign")))
    queued = Counter(w.priority for w in ledger.queue)
    family(
        "gpualloc_queue_length",
        (({"priority": p}, queued[p]) for p in ("high", "normal", "low")),
    )
    oldest = max(((now - w.created).total_seconds() for w in ledger.queue), default=0.0)
    family("gpualloc_queue_oldest_wait_seconds", [({}, max(0.0, oldest))])
    stats = ledger.stats
    family(
        "gpualloc_placements_total",
        (({"policy": p}, n) for p, n in sorted(stats.placements.items())),
    )
    out += _histogram("gpualloc_decision_seconds", stats.decision_seconds)
    out += _histogram("gpualloc_wait_seconds", stats.wait_seconds)
    return "\n".join(out) + "\n"


def _seconds(idle: timedelta | None) -> float:
    return idle.total_seconds() if idle is not None else 0.0


def _gpu_labels(host: Host, occupancy: Occupancy, gpu: int) -> dict[str, str]:
    lease = occupancy.leases.get(gpu)
    return {
        "gpu": str(gpu),
        "uuid": host.topology.gpu(gpu).uuid or "",
        "state": occupancy.state(gpu),
        "user": lease.user if lease else "",
        "lease": lease.id if lease else "",
    }


def _histogram(name: str, histogram: Histogram) -> list[str]:
    kind, about = METRICS[name]
    lines = [f"# HELP {name} {about}", f"# TYPE {name} {kind}"]
    lines += [_sample(f"{name}_bucket", {"le": le}, n) for le, n in histogram.cumulative()]
    lines.append(_sample(f"{name}_sum", {}, histogram.total))
    lines.append(_sample(f"{name}_count", {}, histogram.count))
    return lines


def _sample(name: str, labels: dict[str, str], value: float) -> str:
    text = ",".join(f'{key}="{_escape(val)}"' for key, val in labels.items())
    number = repr(float(value)) if isinstance(value, float) else str(value)
    return f"{name}{{{text}}} {number}" if text else f"{name} {number}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
