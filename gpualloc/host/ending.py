"""How leases end at their owner's word: released (``release``, an exec that failed) or
exited (a submitted job's supervisor saying how its job ended), on the embedded ledger and,
for the broker, on the ledger it owns. Only a lease's owner or root may end it."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from gpualloc.errors import NotPermitted
from gpualloc.host.terms import ReleaseResult
from gpualloc.ledger.lookup import find_leases

if TYPE_CHECKING:
    from gpualloc.ledger.schema import Lease
    from gpualloc.ledger.store import LedgerStore


def release_leases(
    store: LedgerStore,
    selectors: Iterable[str],
    *,
    mine: bool = False,
    include_running: bool = False,
    uid: int | None = None,
) -> ReleaseResult:
    """:meth:`gpualloc.host.local.LocalHost.release_leases`, on ``store``."""
    uid = os.geteuid() if uid is None else uid
    result = ReleaseResult()
    with store.transaction() as txn:
        targets = find_leases(txn, selectors, result.problems, uid=uid)
        for lease in txn.ledger.leases if mine else ():
            if lease.uid != uid or lease in targets:
                continue
            if keeps_its_job(lease) and not include_running:
                result.kept.append(lease)
            else:
                targets.append(lease)
        for lease in targets:
            refusal = not_yours(lease, uid, "may release it")
            if refusal is not None:
                result.problems.append(refusal)
                continue
            txn.remove(lease.id)
            result.released.append(lease)
        if result.problems and not result.released:
            txn.changed = False
    for lease in result.released:
        remove_file(store.directory.lease_lock(lease.id))
    return result


def end_exited(
    store: LedgerStore,
    lease_id: str,
    status: int,
    *,
    cancelled: bool = False,
    uid: int | None = None,
    running: bool | None = None,
) -> bool:
    """End the lease whose job exited with ``status`` (``cancelled``: by ``cancel``): the
    store's history record of it keeps both (:mod:`gpualloc.ledger.history`). Where processes
    of the job still run (``running``; None: some process holds the lease lock, which its
    holder closed when it forked the job), the lease lives on with them and its record waits
    for their end. Whether it ended; a lease gone already is left so; another user's is
    refused (exit 12)."""
    from gpualloc.ledger.liveness import lock_held

    uid = os.geteuid() if uid is None else uid
    with store.transaction() as txn:
        lease = txn.ledger.find(lease_id)
        if lease is None:
            return False
        refuse_others(lease, uid, "says how its job ended")
        store.exit_statuses[lease_id] = (status, cancelled)
        if running is None:
            running = lease.lock and lock_held(store.directory.lease_lock(lease_id))
        if running:
            return False
        txn.remove(lease_id)
    remove_file(store.directory.lease_lock(lease_id))
    return True


def adopted(lease: Lease | None, lease_id: str, pid: int, *, uid: int | None) -> Lease | None:
    """``lease`` bound to the process group ``pid`` leads (:meth:`Host.adopt
    <gpualloc.host.protocol.Host.adopt>`), or None where nothing changes: no such lease any
    more, or ``pid`` leads no group. Exit 12 for another user's lease or process."""
    from msgspec.structs import replace

    from gpualloc.ledger.liveness import process_start_time, stat_fields

    uid = os.geteuid() if uid is None else uid
    if lease is None:
        return None
    refuse_others(lease, uid, "binds it to a process")
    try:
        fields = stat_fields(pid)
        owner = Path(f"/proc/{pid}").stat().st_uid
    except OSError:
        return None  # ended already: its lease lives as it would have
    if owner != lease.uid or int(fields[1]) != lease.pid or os.getpgid(pid) != pid:
        raise NotPermitted(
            f"process {pid} is not a child of lease {lease_id}'s process leading its own group",
            hint="adopt binds a lease to the job its holder has just started",
        )
    started = process_start_time(pid)
    if started is None or (lease.process_group == pid and lease.process_group_start == started):
        return None  # ended already, or bound to it already: nothing to write
    if lease.process_group_start is not None:
        raise NotPermitted(
            f"lease {lease_id} is bound to its job (process {lease.process_group}) already",
            hint="a lease is bound once, to the job its holder started",
        )
    return replace(lease, process_group=pid, process_group_start=started)


def not_yours(lease: Lease, uid: int, may: str) -> NotPermitted | None:
    """The refusal (exit 12) of ``uid``'s word on ``lease`` where it is neither the lease's
    owner nor root: only they ``may`` (``"may release it"``)."""
    if lease.uid == uid or uid == 0:
        return None
    return NotPermitted(
        f"lease {lease.id} belongs to {lease.user} (uid {lease.uid})",
        hint=f"only its owner or root {may}",
    )


def refuse_others(lease: Lease, uid: int, may: str) -> None:
    """Raise :func:`not_yours`'s refusal, if any."""
    refusal = not_yours(lease, uid, may)
    if refusal is not None:
        raise refusal


def keeps_its_job(lease: Lease) -> bool:
    """Whether ``release --mine`` leaves ``lease`` unless asked (``--include-running``): the
    lease of a job that runs (``run``; a Slurm job's, which its Epilog releases). Its GPUs
    would go to the next job while it still runs on them. An ``alloc`` lease, ``--hold`` or
    tied to a pid, is what ``--mine`` is for. Dead leases are reaped before this is asked."""
    return lease.source != "alloc"


def remove_file(path: Path) -> bool:
    """Remove ``path`` whoever holds it (the lease is gone); False if it could not be."""
    try:
        path.unlink()
    except OSError:
        return False  # gone already, or another user's file in a sticky directory
    return True
