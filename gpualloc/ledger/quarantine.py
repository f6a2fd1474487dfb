"""Records of the ledger that cannot be read: set aside, never a reason for every command to fail.

The ledger is one JSON document that every user's gpualloc reads. One lease that did not
validate (a lone surrogate, the stand-in for a byte that was not UTF-8, in a name; a field of
the wrong type from a hand edit) made the whole document unreadable, and every command of every
user failed with it until someone edited the file. Now a document that does not validate as a
whole is read record by record (:func:`salvage`): each lease and queue entry that does not
validate on its own is left out, with a note that ``status`` shows, and the rest is the ledger.
The next transaction that writes keeps what it left out in its writer's quarantine file beside
the ledger (:func:`keep`: ``ledger.<uid>.quarantine.jsonl``, one JSON object a line, the newest
:data:`MAX_KEPT`), then writes the ledger without them. A lease left out no longer holds its
GPUs: they look free until its processes are seen on them, as after any lost lease.

Only leases and waiters are records. Anything else that does not validate (the header, the
statistics, two leases holding one GPU) still makes the document damaged, to be recovered from
a good copy or refused as before (:mod:`.store`), and a document of a newer schema is refused
before any of this.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, TypeVar

from msgspec import Struct

from gpualloc.atomic import write_text_atomic
from gpualloc.ledger.schema import Lease, Ledger, Waiter
from gpualloc.ledger.shared_files import UnsafeFile, read_shared
from gpualloc.model.printable import has_surrogates
from gpualloc.model.validation import ValidationError, describe_validation_error, from_builtins

T = TypeVar("T")

MAX_KEPT = 64
"""Entries a quarantine file keeps (the newest): what a hostile writer can make it grow to."""
QUARANTINE_MODE = 0o644
_ID_CHARS = frozenset("0123456789abcdef")


class Unreadable(ValueError):
    """A value that is not the document asked for; the message says where and why."""


class SetAside(Struct, frozen=True):
    """One record of the ledger left out because it cannot be read."""

    kind: Literal["lease", "waiter"]
    label: str
    """Its id when it has a well-formed one, else its place (``#2``)."""
    reason: str
    record: Any
    """The record as the JSON held it."""

    def note(self, ledger_name: str, kept_in: str) -> str:
        """What ``status`` says about it."""
        lost = "; its GPUs look free until its processes are seen" if self.kind == "lease" else ""
        return (
            f"{self.kind} {self.label} in {ledger_name} cannot be read ({self.reason}): left out "
            f"of the ledger, its record kept in {kept_in}{lost}"
        )


def convert(data: Any, kind: type[T]) -> T:
    """The ``kind`` that parsed JSON ``data`` holds, as :func:`from_builtins` reads it;
    :class:`Unreadable` for anything else, text that is not UTF-8 included (which msgspec
    cannot even encode: a ``UnicodeEncodeError`` that no reader expected)."""
    try:
        return from_builtins(data, kind)
    except ValidationError as exc:
        raise Unreadable(describe_validation_error(exc)) from None
    except UnicodeEncodeError:
        raise Unreadable(f"{surrogate_at(data) or '(top level)'}: text that is not UTF-8") from None


def surrogate_at(value: Any, where: str = "") -> str | None:
    """Where in parsed JSON ``value`` text holds a lone surrogate (``leases[0].name``), if
    anywhere."""
    if isinstance(value, str):
        return where if has_surrogates(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            place = f"{where}.{key}" if where else str(key)
            if has_surrogates(str(key)):
                return f"{place} (a key)"
            found = surrogate_at(item, place)
            if found is not None:
                return found
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = surrogate_at(item, f"{where}[{index}]")
            if found is not None:
                return found
    return None


def salvage(data: dict[str, Any]) -> tuple[Ledger, list[SetAside]] | None:
    """The ledger that ``data`` holds once every lease and waiter that does not validate on its
    own is left out, and those left out; None when none is, or when the rest still does not
    validate (the damage is elsewhere)."""
    kept = dict(data)
    aside: list[SetAside] = []
    sections: tuple[tuple[str, Literal["lease", "waiter"], type[Struct]], ...] = (
        ("leases", "lease", Lease),
        ("queue", "waiter", Waiter),
    )
    for key, kind, model in sections:
        records = data.get(key)
        if not isinstance(records, list):
            continue
        good = []
        for position, record in enumerate(records):
            try:
                convert(record, model)
            except Unreadable as problem:
                aside.append(SetAside(kind, _label(record, position), str(problem), record))
            else:
                good.append(record)
        kept[key] = good
    if not aside:
        return None
    try:
        return convert(kept, Ledger), aside
    except Unreadable:
        return None


def _label(record: Any, position: int) -> str:
    found = record.get("id") if isinstance(record, dict) else None
    if isinstance(found, str) and len(found) == 12 and set(found) <= _ID_CHARS:
        return found
    return f"#{position + 1}"


def keep(path: Path, aside: list[SetAside], ledger_name: str) -> None:
    """Add ``aside`` to the quarantine file ``path`` (its writer's own: replaced by rename, as
    the good copies are), keeping the newest :data:`MAX_KEPT` entries. ``OSError`` when it
    cannot be written (another user's file of that name in a sticky directory)."""
    try:
        text, info = read_shared(path)
        earlier = text.splitlines() if info.st_uid == os.geteuid() else []
    except (OSError, UnsafeFile):
        earlier = []  # none yet, or not a file of this writer's: start it again (or fail)
    at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    # ensure_ascii writes a lone surrogate as the escape "\udcff": Python's json reads it back,
    # and gpualloc never reads this file (it is for the people who mend the ledger).
    entries = [
        json.dumps(
            {
                "at": at,
                "ledger": ledger_name,
                "kind": record.kind,
                "label": record.label,
                "reason": record.reason,
                "record": record.record,
            },
            sort_keys=True,
        )
        for record in aside
    ]
    lines = [line for line in earlier if line.strip()] + entries
    write_text_atomic(path, "\n".join(lines[-MAX_KEPT:]) + "\n", mode=QUARANTINE_MODE)
