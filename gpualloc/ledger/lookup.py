"""Finding leases in a ledger transaction by what people type: an id, a prefix of one, or the
lease's name (``alloc --name``, ``run --name``)."""

from __future__ import annotations

from collections.abc import Iterable

from gpualloc.errors import NoSuchLease
from gpualloc.ledger.schema import Lease
from gpualloc.ledger.store import LedgerTransaction
from gpualloc.model.printable import printable
from gpualloc.user_files import shown_text, shown_value

MIN_PREFIX = 4
"""The shortest id prefix taken for a lease: fewer hex digits name one lease of many by luck."""


def find_leases(
    txn: LedgerTransaction, selectors: Iterable[str], problems: list, *, uid: int | None = None
) -> list[Lease]:
    """The leases ``selectors`` name, each once (see :func:`find_lease`); a selector that names
    none, or several, adds its :class:`NoSuchLease` to ``problems``."""
    found: list[Lease] = []
    for selector in selectors:
        try:
            lease = find_lease(txn, selector, uid=uid)
        except NoSuchLease as missing:
            problems.append(missing)
            continue
        if lease is not None and lease not in found:
            found.append(lease)
    return found


def find_lease(txn: LedgerTransaction, selector: str, *, uid: int | None = None) -> Lease | None:
    """The lease ``selector`` names: its id, a unique prefix of one (4 characters or more), or
    its name. A name is looked up among ``uid``'s leases (everyone's for root or None), and
    among everyone's when none of theirs has it, so that another user's lease of that name is
    refused as theirs rather than not found. A selector that fits several leases is refused
    with their ids, never guessed. A lease this very transaction reaped counts as found and
    already gone (None)."""
    text = selector.strip()
    wanted = text.lower()
    exact = [x for x in txn.ledger.leases if x.id == wanted]
    if exact:
        return exact[0]  # an id is the lease's, whatever another lease is called
    named = _named(txn.ledger.leases, text, uid)
    prefixed = [x for x in txn.ledger.leases if x.id.startswith(wanted)]
    if len(wanted) < MIN_PREFIX:
        prefixed = []
    matches = [*named, *(x for x in prefixed if x not in named)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise NoSuchLease(
            f"{shown_value(text)} names {len(matches)} leases: "
            + ", ".join(_labelled(x) for x in matches[:8])
            + (", ..." if len(matches) > 8 else ""),
            hint="give the lease's id (or more characters of it)",
        )
    if any(x.id.startswith(wanted) or x.name == text for x in txn.reaped):
        return None
    if len(wanted) < MIN_PREFIX:
        raise NoSuchLease(
            f"no lease is named {shown_value(text)}, and {MIN_PREFIX} characters are the "
            "shortest id prefix",
            hint=f"give the lease's name, or at least {MIN_PREFIX} characters of its id",
        )
    raise NoSuchLease(
        f"no lease {shown_text(text)}",
        hint="'gpualloc status' lists the leases and their names; it may have ended",
    )


def _named(leases: Iterable[Lease], name: str, uid: int | None) -> list[Lease]:
    """The leases called ``name``: ``uid``'s own when one of theirs is, else anyone's."""
    called = [x for x in leases if x.name is not None and x.name == name]
    own = [x for x in called if uid in (None, 0) or x.uid == uid]
    return own or called


def _labelled(lease: Lease) -> str:
    """``1fa56bbefd17 (notebook, alice)``: a lease as a refusal lists it."""
    about = [printable(lease.name, 40)] if lease.name else []
    return f"{lease.id} ({', '.join([*about, lease.user])})"
