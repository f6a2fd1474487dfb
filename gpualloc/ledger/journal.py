"""Root's journal: Slurm's hooks record a job even while someone else holds the ledger's lock.

Any user who can open ``ledger.lock`` can hold it (``flock ledger.lock sleep 1000``), and every
other gpualloc then waits. A Slurm Prolog cannot wait (slurmd gives it a time limit, and a
failing Prolog drains the node), and must not give up either: a job whose GPUs are not recorded
is invisible to ``gpualloc run`` outside Slurm, which hands them out again.

So when the lock does not come within a few seconds, root's hooks write the change to a journal
that only root can write, ``ledger.root-journal.json`` (owned by root, mode 0644, replaced
atomically; guarded by ``ledger.root-journal.lock``, mode 0600, which no user can open), and
every later transaction, whoever runs it, applies the entries its ledger does not include yet
(``Ledger.root_journal_seq``) before it looks at anything. ``status`` applies them too, so the
job's GPUs show as held at once. Root's next transaction folds the applied entries away.

An entry is either the Prolog's lease for a job (it replaces the job's earlier lease; a GPU
another lease holds stays with that lease and is reported, as the Prolog does directly) or the
Epilog's release of a job's leases. Entries are numbered by the time in nanoseconds, so their
numbers grow even after the journal was folded to nothing; a ledger whose mark lies in the
future (a forged one) has its mark ignored.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from msgspec import Struct, field
from msgspec.structs import replace

from gpualloc.atomic import write_text_atomic
from gpualloc.errors import LedgerError
from gpualloc.ledger.schema import Lease, Ledger
from gpualloc.ledger.shared_files import UnsafeFile, open_shared, read_shared, replace_planted
from gpualloc.model.cpuset import format_cpulist
from gpualloc.model.validation import DecodeError, PositiveInt, decode_json, to_builtins

JOURNAL_SCHEMA_VERSION = 1
FUTURE_SLACK_NS = 86_400 * 10**9
"""A mark more than a day ahead of the clock was not written by root's journal."""


class JournalEntry(Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    seq: PositiveInt
    op: Literal["add", "release"]
    slurm_job: str
    lease: Lease | None = None
    """The Prolog's lease (``add``)."""


class Journal(Struct, kw_only=True, forbid_unknown_fields=True):
    schema_version: int = JOURNAL_SCHEMA_VERSION
    host: str
    entries: list[JournalEntry] = field(default_factory=list)


# ---- the changes an entry makes (the Prolog and Epilog make them directly, too) -----------------


def record_job_lease(ledger: Ledger, lease: Lease) -> list[str]:
    """Put the Slurm job's ``lease`` in ``ledger``, replacing its earlier one. Slurm is
    authoritative (slurmctld has already started the job on them): the lease records every GPU Slurm
    gave the job, also one another lease holds; that lease is marked conflicting
    (:attr:`Lease.slurm_conflict`) and its GPUs stay the job's when it is released. Returns log
    lines."""
    from gpualloc.ledger.occupancy import describe_lease, held_devices

    job = lease.slurm_job
    if job is None:
        raise ValueError(f"lease {lease.id} is not a Slurm job's")
    release_job(ledger, job)
    held = ledger.held_gpus()
    held_mig = ledger.held_mig()
    shares = ledger.shares()
    holders = [
        (what, holder)
        for what, found in [
            *(
                (f"GPU {g.index}", [held.get(g.index), *shares.get(g.index, [])])
                for g in lease.gpus
            ),
            *((f"MIG device {m.label}", [held_mig.get(m.key)]) for m in lease.mig),
        ]
        for holder in found
        if holder is not None
    ]
    lines = [
        f"job {job}: Slurm gave it {what}, which is also held outside Slurm: "
        f"{describe_lease(holder)}; marked conflicting, the GPU stays the job's"
        for what, holder in holders
    ]
    conflicting = {holder.id for _, holder in holders}
    ledger.leases = [
        replace(x, slurm_conflict=job) if x.id in conflicting else x for x in ledger.leases
    ]
    ledger.leases.append(lease)
    lines.append(f"job {job}: recorded {held_devices(lease)} for {lease.user} ({lease.id})")
    return lines


def release_job(ledger: Ledger, job: str) -> list[Lease]:
    """Remove the Slurm job's leases from ``ledger``; returns them."""
    gone = [x for x in ledger.leases if x.slurm_job == job]
    ledger.leases = [
        replace(x, slurm_conflict=None) if x.slurm_conflict == job else x
        for x in ledger.leases
        if x.slurm_job != job
    ]
    return gone


# ---- reading and applying ---------------------------------------------------------------------


def read_journal(path: Path, host: str) -> tuple[Journal | None, list[str]]:
    """Root's journal at ``path`` if there is a trustworthy one: a regular file owned by root
    that nobody else may write. Anything else is ignored, with a note."""
    try:
        text, info = read_shared(path)
    except FileNotFoundError:
        return None, []
    except (UnsafeFile, OSError) as problem:
        return None, [f"ignored {path}: {problem}"]
    if info.st_uid != 0 or stat.S_IMODE(info.st_mode) & 0o022:
        return None, [f"ignored {path}: not root's (only root's Slurm hooks write it)"]
    try:
        journal = decode_json(text, Journal)
    except DecodeError:
        return None, [f"ignored {path}: not a valid journal"]
    if journal.host != host:
        return None, [f"ignored {path}: written on host {journal.host!r}"]
    return journal, []


def apply_journal(ledger: Ledger, journal: Journal, *, now_ns: int | None = None) -> list[str]:
    """Apply the entries of ``journal`` that ``ledger`` does not include yet; returns what was
    done, for the notes. Advances ``ledger.root_journal_seq``."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    mark = ledger.root_journal_seq
    notes = []
    if mark > now_ns + FUTURE_SLACK_NS:
        notes.append(
            f"the ledger claims root's journal entry {mark}, which lies in the future; "
            "applying the whole journal again"
        )
        mark = 0
    for entry in sorted(journal.entries, key=lambda e: e.seq):
        if entry.seq <= mark:
            continue
        if entry.op == "add" and entry.lease is not None:
            lines = record_job_lease(ledger, entry.lease)
            notes += [f"from root's journal: {line}" for line in lines]
        else:
            for lease in release_job(ledger, entry.slurm_job):
                notes.append(
                    f"from root's journal: job {entry.slurm_job}: released GPU "
                    f"{format_cpulist(lease.indices)} ({lease.id})"
                )
        ledger.root_journal_seq = max(ledger.root_journal_seq, entry.seq)
    return notes


# ---- writing (root only) ----------------------------------------------------------------------


def append_entry(path: Path, lock_path: Path, host: str, entry: JournalEntry) -> JournalEntry:
    """Add ``entry`` to root's journal (numbered now); returns it as written."""
    with _root_lock(lock_path):
        journal, _ = read_journal(path, host)
        journal = journal or Journal(host=host)
        last = max((e.seq for e in journal.entries), default=0)
        entry = replace(entry, seq=max(time.time_ns(), last + 1))
        journal.entries.append(entry)
        _write(path, journal)
    return entry


def fold_applied(path: Path, lock_path: Path, host: str, upto_seq: int) -> None:
    """Drop the entries up to ``upto_seq`` (a ledger written by root includes them)."""
    if not path.exists():
        return
    with _root_lock(lock_path):
        journal, _ = read_journal(path, host)
        if journal is None:
            replace_planted(path)  # a user's planted file: root removes it
            return
        keep = [e for e in journal.entries if e.seq > upto_seq]
        if not keep:
            path.unlink(missing_ok=True)
        elif len(keep) != len(journal.entries):
            journal.entries = keep
            _write(path, journal)


def _write(path: Path, journal: Journal) -> None:
    text = json.dumps(to_builtins(journal), indent=1, sort_keys=True) + "\n"
    write_text_atomic(path, text, mode=0o644)  # root may rename over anything, planted or not


@contextmanager
def _root_lock(path: Path) -> Iterator[None]:
    """Hold root's private journal lock (only root can open it, so no user can hold it),
    replacing anything a user planted at its name."""
    import fcntl

    if os.geteuid() != 0:
        raise LedgerError("only root writes root's journal", hint="run the hook as root")
    for _ in range(3):
        descriptor, info = open_shared(path, os.O_RDWR, create_mode=0o600, replace_as_root=True)
        if info.st_uid != 0 or stat.S_IMODE(info.st_mode) & 0o077:
            os.close(descriptor)  # a user's file: others could open and lock it
            replace_planted(path)
            continue
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            yield
        finally:
            os.close(descriptor)
        return
    raise LedgerError(
        f"cannot make {path} root's own: something keeps replacing it",
        hint="look for a process of another user writing in the state directory",
    )
