"""Slurm's node hooks: what ``gpualloc slurm prolog|epilog|taskprolog`` do.

- Prolog (root, no PATH, before the job): record the job's GPUs (``SLURM_JOB_GPUS``, global
  indices) in the host ledger as a lease of ``SLURM_JOB_UID`` tagged with the job id, so that
  ``gpualloc run`` outside Slurm on a shared node avoids them. Running it twice for one job
  replaces the lease. A GPU a gpualloc lease already holds outside Slurm is reported, not
  taken: Slurm has given it to the job anyway, and the ledger never lists a GPU twice.
- Epilog (root, after the job, also when the Prolog never ran): release the job's leases; a job
  with none is fine. ``SLURM_JOB_EXIT_CODE`` is not consulted (it reads 0 after ``scancel``).
- TaskProlog (the job's user, once per task): ``export CUDA_DEVICE_ORDER=PCI_BUS_ID`` (Slurm never
  sets it) and ``CUDA_VISIBLE_DEVICES`` reordered along the best ring through the step's GPUs,
  so that NCCL's ring follows NVLinks. slurmstepd reads ``export NAME=value`` literally to the
  end of the line, so values are never quoted (and anything that would need quotes is left
  out).

Prolog and Epilog never depend on another user: when the ledger's lock stays held (a user may hold
it by hand), they record the change in root's journal, which only root can write and every gpualloc
applies (:mod:`gpualloc.ledger.journal`). The hooks return lines for the log; the command turns
every failure into a logged line and exit status 0 (a failing Prolog or Epilog drains the node).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime, timezone

from gpualloc.boot import boot_id
from gpualloc.errors import LedgerLocked, RequestError
from gpualloc.host.local import LocalHost
from gpualloc.ledger.journal import JournalEntry, append_entry, record_job_lease, release_job
from gpualloc.ledger.occupancy import held_devices
from gpualloc.ledger.schema import Lease, LeasedGpu, LeasedMig
from gpualloc.ledger.shared_files import owner_name
from gpualloc.ledger.statedir import StateDirectory
from gpualloc.ledger.store import new_lease_id
from gpualloc.model.cpuset import format_cpulist
from gpualloc.model.printable import count_of
from gpualloc.model.topology import Topology
from gpualloc.slurm.gres import slurm_gpu_numbers
from gpualloc.slurm.job import check_job_id
from gpualloc.user_files import shown_value

_SAFE_VALUE = re.compile(r"^[A-Za-z0-9,._:-]*$")
HOOK_LOCK_TIMEOUT_S = 5.0
"""How long the Prolog and Epilog wait for the ledger's lock before writing root's journal
instead (slurmd's PrologEpilogTimeout is far longer; a transaction takes milliseconds)."""


def gpu_indices(text: str | None) -> tuple[int, ...]:
    """``SLURM_JOB_GPUS`` / ``SLURM_STEP_GPUS``: ``0,1`` (global indices, in Slurm's order)."""
    if not text or not text.strip():
        return ()
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise RequestError(f"GPU list {shown_value(text)} is not a list of indices") from None


def _job_id(env: Mapping[str, str]) -> str:
    job = env.get("SLURM_JOB_ID", "").strip()
    if not job:
        raise RequestError("SLURM_JOB_ID is not set: not run by slurmd as a Prolog/Epilog")
    return check_job_id(job)


def prolog(host: LocalHost, env: Mapping[str, str]) -> list[str]:
    """Record the job's GPUs as a lease of the job's user; returns log lines."""
    job = _job_id(env)
    gpus = gpu_indices(env.get("SLURM_JOB_GPUS"))
    if not gpus:
        return [f"job {job}: no GPUs allocated; nothing to record"]
    try:
        uid = int(env.get("SLURM_JOB_UID", ""))
    except ValueError:
        raise RequestError(f"job {job}: SLURM_JOB_UID is not a number") from None
    user = env.get("SLURM_JOB_USER") or owner_name(uid)
    records = slurm_gpu_numbers(host.topology)
    outside = [g for g in gpus if g not in records]
    lines = []
    if outside:
        lines.append(
            f"job {job}: GPU {format_cpulist(outside)} is not in the topology "
            f"({count_of(len(records), 'GPU')} in gres.conf); check GPUALLOC_TOPOLOGY and gres.conf"
        )
    mine = [records[g] for g in gpus if g in records]
    if not mine:
        return lines
    topology = host.topology
    lease = Lease(
        id=new_lease_id(),
        gpus=tuple(
            LeasedGpu(index=r.gpu, uuid=topology.gpu(r.gpu).uuid) for r in mine if r.mig is None
        ),
        mig=tuple(
            LeasedMig(gpu=r.gpu, device=r.mig.device, uuid=r.mig.uuid, profile=r.mig.profile)
            for r in mine
            if r.mig is not None
        ),
        uid=uid,
        user=user,
        hold=True,
        name=f"slurm job {job}",
        created=datetime.now(timezone.utc),
        source="slurm",
        slurm_job=job,
        boot_id=boot_id(),
    )
    add = JournalEntry(seq=1, op="add", slurm_job=job, lease=lease)
    return lines + _record(host, add)


def epilog(host: LocalHost, env: Mapping[str, str]) -> list[str]:
    """Release the job's leases (none is fine); returns log lines."""
    job = _job_id(env)
    if host.store is None:
        return [f"job {job}: no ledger on this host; nothing to release"]
    lines = _record(host, JournalEntry(seq=1, op="release", slurm_job=job))
    return lines + forget_job_ledger(host.store.directory, job)


def _record(host: LocalHost, entry: JournalEntry) -> list[str]:
    """Make the Prolog's or Epilog's change in the ledger; when another process holds the
    ledger's lock past :data:`HOOK_LOCK_TIMEOUT_S`, in root's journal, which every later
    gpualloc applies (:mod:`gpualloc.ledger.journal`)."""
    store = host.ledger_store()
    job = entry.slurm_job
    try:
        with host.transaction(lock_timeout_s=min(store.lock_timeout_s, HOOK_LOCK_TIMEOUT_S)) as txn:
            if entry.lease is not None:
                lines = record_job_lease(txn.ledger, entry.lease)
            else:
                lines = [
                    f"job {job}: released {held_devices(x)} ({x.id})"
                    for x in release_job(txn.ledger, job)
                ] or [f"job {job}: no lease to release"]
            txn.changed = True
        return lines
    except LedgerLocked as locked:
        directory = store.directory
        append_entry(directory.journal_file, directory.journal_lock, store.host, entry)
        change = (
            f"{held_devices(entry.lease)} for {entry.lease.user}"
            if entry.lease is not None
            else "the release of its GPUs"
        )
        return [
            f"job {job}: {locked.message}",
            f"job {job}: recorded {change} in root's journal instead; every gpualloc applies "
            "it from now on",
        ]


def forget_job_ledger(directory: StateDirectory, job: str) -> list[str]:
    """Remove the job's own ledger (what ``gpualloc run`` inside the job kept) and the lock
    files of its leases: after the job, every process of it is gone."""
    from gpualloc.ledger.scope import job_ledger_scope
    from gpualloc.ledger.store import LedgerStore

    scoped = directory.scoped(job_ledger_scope(directory.scope, job))
    if not scoped.ledger_file.exists():
        return []
    txn = LedgerStore(scoped).snapshot()
    leases = [*txn.reaped, *txn.ledger.leases]
    for path in [
        *(scoped.lease_lock(lease.id) for lease in leases),
        *scoped.good_copies(),
        scoped.ledger_file,
        scoped.lock_file,
    ]:
        path.unlink(missing_ok=True)
    return [f"job {job}: removed its own ledger ({count_of(len(leases), 'sub-job lease')})"]


def task_prolog(topology: Topology, env: Mapping[str, str]) -> list[str]:
    """The ``export`` lines for one task of a step.

    A step on MIG devices gets ``CUDA_VISIBLE_DEVICES=MIG-<uuid>`` instead of Slurm's number: a
    gres.conf without NVML detection gives Slurm no UUID, and its number means nothing to CUDA.
    A step on three or more whole GPUs gets them in the order of the best ring.
    """
    lines = ["export CUDA_DEVICE_ORDER=PCI_BUS_ID"]
    numbers = gpu_indices(env.get("SLURM_STEP_GPUS") or env.get("SLURM_JOB_GPUS"))
    records = slurm_gpu_numbers(topology)
    if not numbers or not all(n in records for n in numbers):
        return lines
    step = [records[n] for n in numbers]
    if any(record.mig is not None for record in step):
        uuids = [
            record.mig.uuid if record.mig else topology.gpu(record.gpu).uuid for record in step
        ]
        if all(uuid and _SAFE_VALUE.match(uuid) for uuid in uuids):
            lines.append("export CUDA_VISIBLE_DEVICES=" + ",".join(uuids))  # type: ignore[arg-type]
        return lines
    visible = [part for part in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if part]
    if (
        len(numbers) < 3  # a pair (or one GPU) has one order
        or len(visible) != len(numbers)
        or not all(_SAFE_VALUE.match(v) for v in visible)
    ):
        return lines
    physical = tuple(record.gpu for record in step)
    order = best_ring(topology, physical)
    position = {gpu: i for i, gpu in enumerate(physical)}
    lines.append("export CUDA_VISIBLE_DEVICES=" + ",".join(visible[position[g]] for g in order))
    return lines


def best_ring(topology: Topology, gpus: tuple[int, ...]) -> tuple[int, ...]:
    """The order of ``gpus`` whose ring carries the most bandwidth (MAPA Eq. 1)."""
    from gpualloc.placement.host_graph import HostGraph
    from gpualloc.placement.mapa.exact import best_order_of_set
    from gpualloc.placement.mapa.objectives import AggregatedObjective
    from gpualloc.placement.mapa.patterns import build_pattern

    host = HostGraph.from_topology(topology)
    pattern = build_pattern("ring", len(gpus))
    return best_order_of_set(host, pattern, AggregatedObjective(), sorted(gpus))
