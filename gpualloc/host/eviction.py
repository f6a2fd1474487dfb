"""Evicting shared jobs (``release --evict-shared``): marking them in the
ledger, for their watchers (:mod:`gpualloc.launcher.sharing`) to end them.

Nobody but root may signal another user's processes, so the owner of a ``--shareable`` lease
cannot end the shared jobs beside it directly: this marks each one (``LeasedShare.evict_by``)
in one ledger transaction, after checking who may, and each job's own watcher, a process of the
job's user, sends the signals.
"""

from __future__ import annotations

from collections.abc import Iterable

from msgspec.structs import replace

from gpualloc.errors import NotPermitted, RequestError
from gpualloc.host.terms import ReleaseResult
from gpualloc.ledger.lookup import find_leases
from gpualloc.ledger.schema import Lease, Ledger
from gpualloc.ledger.shared_files import owner_name
from gpualloc.ledger.store import LedgerTransaction


def mark_shared_jobs(
    txn: LedgerTransaction,
    selectors: Iterable[str],
    *,
    mine: bool,
    grace_s: float | None,
    uid: int,
) -> ReleaseResult:
    """Ask the shared jobs on the GPUs of the leases ``selectors`` name (or of all the
    caller's with ``mine``) to leave; a selector may also name one shared job. Only the
    owner of the lease they share, the shared job's owner, or root may. The jobs' watchers
    end them (:mod:`gpualloc.launcher.sharing`); their leases go when they have ended.
    ``released`` lists the shared jobs marked. ``uid`` is the caller; ``txn`` the ledger
    transaction the marks are made in."""
    result = ReleaseResult()
    named = find_leases(txn, selectors, result.problems)
    if mine:
        named += [x for x in txn.ledger.leases if x.uid == uid and x.shareable]
    for lease in named:
        try:
            targets = _shared_jobs_of(txn.ledger, lease, uid)
        except (RequestError, NotPermitted) as problem:
            result.problems.append(problem)
            continue
        for share in targets:
            if share.share is None or any(x.id == share.id for x in result.released):
                continue
            marked = replace(
                share,
                share=replace(share.share, evict_by=owner_name(uid), evict_grace_s=grace_s),
            )
            txn.replace(marked)
            result.released.append(marked)
    return result


def _shared_jobs_of(ledger: Ledger, lease: Lease, uid: int) -> list[Lease]:
    """The shared jobs ``uid`` evicts by naming ``lease``: those beside a ``--shareable``
    lease of theirs, or the shared job named (theirs, or beside their lease). Raises
    RequestError for a lease that shares nothing, NotPermitted for someone else's."""
    if lease.share is not None:
        beside = ledger.held_gpus().get(lease.gpus[0].index)
        owners = {lease.uid, *([beside.uid] if beside else [])}
        whose = f"shared job {lease.id} belongs to {lease.user}" + (
            f" and runs beside {beside.user}'s lease {beside.id}" if beside else ""
        )
        targets = [lease]
    elif lease.shareable:
        shares = ledger.shares()
        owners = {lease.uid}
        whose = f"lease {lease.id} belongs to {lease.user} (uid {lease.uid})"
        targets = [x for g in lease.indices for x in shares.get(g, [])]
    else:
        raise RequestError(
            f"lease {lease.id} is not shareable: no shared job runs beside it",
            hint="'gpualloc status' shows the shared jobs",
        )
    if uid not in owners and uid != 0:
        raise NotPermitted(
            whose, hint="only the owner of the shared lease, the job's owner or root may evict"
        )
    return targets
