"""The host's job history: one record for every lease that ends, appended to
``<ledger>.history.jsonl`` in the state directory by whoever writes the ledger (the broker as
root, or the file ledger's writer), in the same write as the ledger: a batch of the broker's
transactions is one append (group commit), and a transaction that fails appends nothing.

A record (one JSON object a line) says who held which GPUs, the placement's predicted
bandwidth, when the lease was queued, started and ended, why it ended (``state``:
``released`` by its owner or root, or by ``gc`` under ``idle.expire_holds``; ``ended`` when
its job's last process had gone; ``cancelled`` when ``cancel`` ended a submitted job;
``timeout`` when it left the ledger past its time limit; ``rebooted``), its exit status
where the ledger was told it (a submitted job's supervisor waits for its job and says,
:meth:`gpualloc.host.protocol.Host.exited`; None for ``run``, which execs the job and waits
for nothing) and its declared limit. The file is rotated past :data:`MAX_BYTES` into ``.1``
to ``.{KEEP}`` (the oldest dropped) by a writer that may rename it: in a shared sticky
directory only its owner or root; others append.
What cannot be appended (a full disk, a file planted there) is left out: the ledger's own
write has succeeded, and the history never stands in its way.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping, Set
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from gpualloc.boot import boot_id

if TYPE_CHECKING:
    from pathlib import Path

    from gpualloc.ledger.schema import Lease, Ledger
    from gpualloc.ledger.statedir import StateDirectory

MAX_BYTES = 64 * 1024 * 1024
"""A history file's size past which it is rotated."""
KEEP = 4
"""Rotated history files kept (``.1`` the newest)."""


def history_file(directory: StateDirectory) -> Path:
    return directory.ledger_file.with_suffix(".history.jsonl")


def ended_leases(before: Mapping[str, Lease], ledger: Ledger) -> list[Lease]:
    """The leases the loaded ledger held that ``ledger`` (about to be written) holds no more."""
    now = {lease.id for lease in ledger.leases}
    return [lease for lease_id, lease in before.items() if lease_id not in now]


def record_of(
    lease: Lease, state: str, ended: datetime, exit_status: int | None = None
) -> dict[str, Any]:
    return {
        "lease": lease.id,
        "user": lease.user,
        "uid": lease.uid,
        "name": lease.name,
        "gpus": list(lease.indices),
        "mig": [f"{m.gpu}/{m.device}" for m in lease.mig],
        "source": lease.source,
        "predicted_gbps": lease.scores.get("effective_gbps"),
        "queued": lease.queued.isoformat() if lease.queued is not None else None,
        "start": lease.created.isoformat(),
        "end": ended.isoformat(),
        "state": state,
        "exit_status": exit_status,
        "time_limit_s": lease.time_limit_s,
    }


def why_ended(lease: Lease, dead: bool, now: datetime) -> str:
    """``state`` of a record; ``dead``: the reaper took it (else it was released)."""
    if lease.boot_id is not None and lease.boot_id != boot_id():
        return "rebooted"
    ends = lease.ends
    if ends is not None and now >= ends:
        return "timeout"
    return "ended" if dead else "released"


def append_ended(
    directory: StateDirectory,
    before: Mapping[str, Lease],
    ledger: Ledger,
    dead: Set[str],
    statuses: Mapping[str, tuple[int, bool]] | None = None,
    ended_at: Mapping[str, datetime] | None = None,
    *,
    mode: int,
) -> None:
    """Append a record for each lease that ``ledger``, just written, no longer holds (``dead``:
    those the reaper took or whose job's exit was told; ``statuses``: the exit statuses told,
    and whether ``cancel`` ended the job; ``ended_at``: when each left the ledger, else now);
    one write, the file created with ``mode`` (every user's, or the broker's alone)."""
    statuses, ended_at = statuses or {}, ended_at or {}
    gone = ended_leases(before, ledger)
    if not gone:
        return
    now = datetime.now(timezone.utc)
    lines = []
    for lease in gone:
        status, cancelled = statuses.get(lease.id, (None, False))
        end = ended_at.get(lease.id, now)
        state = "cancelled" if cancelled else why_ended(lease, lease.id in dead, end)
        lines.append(json.dumps(record_of(lease, state, end, status)) + "\n")
    text = "".join(lines)
    from gpualloc.errors import GpuallocError
    from gpualloc.ledger.shared_files import open_shared

    path = history_file(directory)
    with contextlib.suppress(OSError):  # another user's file in a sticky directory: append
        _rotate_if_full(path)
    with contextlib.suppress(OSError, GpuallocError):
        descriptor, _ = open_shared(path, os.O_WRONLY | os.O_APPEND, create_mode=mode)
        try:
            os.write(descriptor, text.encode())
        finally:
            os.close(descriptor)


def _rotate_if_full(path: Path) -> None:
    try:
        if os.lstat(path).st_size < MAX_BYTES:
            return
    except FileNotFoundError:
        return
    for number in range(KEEP - 1, 0, -1):
        older = path.with_name(f"{path.name}.{number}")
        if os.path.lexists(older):
            older.replace(path.with_name(f"{path.name}.{number + 1}"))
    path.replace(path.with_name(f"{path.name}.1"))


def read_history(directory: StateDirectory) -> list[dict[str, Any]]:
    """The records of the current history file, oldest first (lines that do not parse, a
    write a kill cut short, are left out)."""
    from gpualloc.errors import GpuallocError
    from gpualloc.ledger.shared_files import read_shared

    try:
        text, _ = read_shared(history_file(directory))
    except (OSError, ValueError, GpuallocError):
        return []
    records = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            found = json.loads(line)
            if isinstance(found, dict):
                records.append(found)
    return records


RECENT_BYTES = 8 * 1024 * 1024
"""How much of a history file's end :func:`recent_records` reads (some 30,000 records)."""


def recent_records(ledger_file: Path, since: datetime) -> list[dict[str, Any]]:
    """The records of the history beside ``ledger_file`` (:meth:`Host.ledger_file
    <gpualloc.host.protocol.Host.ledger_file>`: the broker's is every user's to read) of
    leases that ended at or after ``since``, oldest first, read from the file's last
    :data:`RECENT_BYTES` (a reader never parses a rotated 64 MiB to list yesterday's jobs)."""
    from gpualloc.errors import GpuallocError
    from gpualloc.ledger.shared_files import open_shared

    try:
        descriptor, info = open_shared(ledger_file.with_suffix(".history.jsonl"), os.O_RDONLY)
    except (OSError, GpuallocError):
        return []
    with os.fdopen(descriptor, "rb") as handle:
        start = max(0, info.st_size - RECENT_BYTES)
        handle.seek(start)
        text = handle.read(RECENT_BYTES).decode("utf-8", errors="replace")
    lines = text.splitlines()[1 if start else 0 :]  # a line cut by the seek is left out
    found = []
    for line in lines:
        with contextlib.suppress(ValueError, TypeError, KeyError):
            record = json.loads(line)
            if datetime.fromisoformat(record["end"]) >= since:
                found.append(record)
    return found
