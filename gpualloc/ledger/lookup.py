"""Finding leases in a ledger transaction by what people type: an id or a prefix of one."""

from __future__ import annotations

from collections.abc import Iterable

from gpualloc.errors import NoSuchLease
from gpualloc.ledger.schema import Lease
from gpualloc.ledger.store import LedgerTransaction
from gpualloc.user_files import shown_text, shown_value


def find_leases(txn: LedgerTransaction, selectors: Iterable[str], problems: list) -> list[Lease]:
    """The leases ``selectors`` name, each once (see :func:`find_lease`); a selector that names
    none adds its :class:`NoSuchLease` to ``problems``."""
    found: list[Lease] = []
    for selector in selectors:
        try:
            lease = find_lease(txn, selector)
        except NoSuchLease as missing:
            problems.append(missing)
            continue
        if lease is not None and lease not in found:
            found.append(lease)
    return found


def find_lease(txn: LedgerTransaction, selector: str) -> Lease | None:
    """The lease ``selector`` names: an id, or a unique prefix of one (4 characters or more).
    A lease this very transaction reaped counts as found and already gone (None)."""
    selector = selector.strip().lower()
    if len(selector) < 4:
        raise NoSuchLease(
            f"lease id {shown_value(selector)} is too short",
            hint="give at least 4 characters of the id",
        )
    matches = [x for x in txn.ledger.leases if x.id.startswith(selector)]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise NoSuchLease(
            f"lease id {shown_value(selector)} is ambiguous ({', '.join(x.id for x in matches)})",
            hint="give more characters of the id",
        )
    if any(x.id.startswith(selector) for x in txn.reaped):
        return None
    raise NoSuchLease(
        f"no lease {shown_text(selector)}",
        hint="'gpualloc status' lists the leases; it may have ended",
    )
