"""The ledger's transactions: lock, read (recovering if needed), reap, change, write.

Every read-modify-write holds ``ledger.lock`` (a ``flock`` through :mod:`filelock`, which the
kernel drops when its holder dies, so a killed gpualloc never blocks the host).

Writing must be crash-safe *and* work when several Unix users share the directory. The usual
temp file + ``rename`` does not: in a sticky directory (mode 1777, like ``/tmp``) nobody may
rename over another user's file. So a write has two steps:

1. the new ledger goes to the writer's own copy, ``ledger.<uid>.good.json``, by temp file, fsync
   and rename (a user may always replace their own file);
2. then ``ledger.json`` (mode 0666, shared) is rewritten in place: truncate to nothing, write,
   fsync.

A crash during step 1 leaves ``ledger.json`` untouched. A crash during step 2 leaves it empty or
holding a strict prefix of a JSON object, which no JSON parser accepts (truncating first matters:
writing over the old text could leave its tail behind a new prefix and form a valid, wrong
ledger), and the next transaction recovers the newest valid good copy, which holds everything
the interrupted write had. A file from a newer schema is refused; a torn file with no good copy
left is reported with what to do, never silently emptied.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock, Timeout
from pydantic import ValidationError

from gpualloc.atomic import write_text_atomic
from gpualloc.boot import boot_id
from gpualloc.errors import FileAccessError, LedgerError
from gpualloc.ledger.liveness import lock_held, process_alive
from gpualloc.ledger.schema import SCHEMA_VERSION, Lease, Ledger, Waiter
from gpualloc.ledger.statedir import StateDirectory
from gpualloc.model.validation import describe_validation_error

LOCK_TIMEOUT_S = 30.0
"""How long a transaction waits for another one; a transaction takes milliseconds."""

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class LedgerFromNewerVersion(LedgerError):
    """The ledger was written by a newer gpualloc: refused, never recovered over."""


def lease_alive(lease: Lease, directory: StateDirectory) -> bool:
    """The liveness rule of :class:`~gpualloc.ledger.schema.Lease`."""
    if lease.boot_id is not None and lease.boot_id != boot_id():
        return False  # nothing survives a reboot: a held lease of a crashed node included
    if lease.hold:
        return True
    if lease.lock and lock_held(directory.lease_lock(lease.id)):
        return True
    return lease.pid is not None and process_alive(lease.pid, lease.pid_start_time)


def new_lease_id() -> str:
    return secrets.token_hex(6)


@dataclass
class LedgerTransaction:
    """The ledger as one transaction sees it; changes are written when the transaction ends."""

    ledger: Ledger
    reaped: list[Lease] = field(default_factory=list)
    reaped_waiters: list[Waiter] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """Things the user should hear about (a recovered ledger)."""
    changed: bool = False

    def add(self, lease: Lease) -> None:
        held = self.ledger.held_gpus()
        taken = [index for index in lease.indices if index in held]
        if taken:
            raise LedgerError(f"GPU {taken[0]} is already held by lease {held[taken[0]].id}")
        if self.ledger.find(lease.id) is not None:
            raise LedgerError(f"a lease with id {lease.id} exists already")
        self.ledger.leases.append(lease)
        self.changed = True

    def remove(self, lease_id: str) -> Lease | None:
        lease = self.ledger.find(lease_id)
        if lease is not None:
            self.ledger.leases = [other for other in self.ledger.leases if other.id != lease_id]
            self.changed = True
        return lease

    # ---- the waiting queue -----------------------------------------------------------------

    def enqueue(self, waiter: Waiter) -> Waiter:
        """Add ``waiter`` at the back of its priority class; returns it with its arrival number."""
        if self.ledger.waiter(waiter.id) is not None:
            raise LedgerError(f"a waiter with id {waiter.id} exists already")
        queued = waiter.model_copy(update={"seq": self.ledger.next_seq})
        self.ledger.next_seq += 1
        self.ledger.queue.append(queued)
        self.changed = True
        return queued

    def dequeue(self, waiter_id: str) -> Waiter | None:
        waiter = self.ledger.waiter(waiter_id)
        if waiter is not None:
            self.ledger.queue = [w for w in self.ledger.queue if w.id != waiter_id]
            self.changed = True
        return waiter

    def count_passed_over(self, waiter_ids: Iterable[str]) -> None:
        """Record that a job started before each of these waiters (backfill)."""
        passed = set(waiter_ids)
        if passed:
            self.ledger.queue = [
                w.model_copy(update={"passed_over": w.passed_over + 1}) if w.id in passed else w
                for w in self.ledger.queue
            ]
            self.changed = True


class LedgerStore:
    """The ledger of one host in one state directory."""

    def __init__(
        self,
        directory: StateDirectory,
        *,
        host: str | None = None,
        alive: Callable[[Lease, StateDirectory], bool] = lease_alive,
        lock_timeout_s: float = LOCK_TIMEOUT_S,
    ) -> None:
        self.directory = directory
        self.host = host or socket.gethostname()
        self.alive = alive
        self.lock_timeout_s = lock_timeout_s

    @contextmanager
    def transaction(self) -> Iterator[LedgerTransaction]:
        """Lock, load, reap dead leases, hand the ledger over; write it back if it changed."""
        with self._locked():
            ledger, notes = self._load()
            txn = LedgerTransaction(ledger, notes=notes, changed=bool(notes))
            self._reap(txn)
            yield txn
            if txn.changed:
                self._write(txn.ledger)
                for lease in txn.reaped:
                    _unlink_quietly(self.directory.lease_lock(lease.id))

    def read(self) -> LedgerTransaction:
        """One transaction that changes nothing but the reaping; its result."""
        with self.transaction() as txn:
            return txn

    def snapshot(self) -> LedgerTransaction:
        """The ledger as it stands, dead leases left out (listed in ``reaped``), written nowhere:
        for ``status`` and ``--dry-run``, which must not change the host."""
        with self._locked():
            ledger, notes = self._load()
        txn = LedgerTransaction(ledger, notes=notes)
        self._reap(txn)
        txn.changed = False
        return txn

    def _reap(self, txn: LedgerTransaction) -> None:
        for lease in list(txn.ledger.leases):
            if not self.alive(lease, self.directory):
                txn.remove(lease.id)
                txn.reaped.append(lease)
        for waiter in list(txn.ledger.queue):
            if not process_alive(waiter.pid, waiter.pid_start_time):
                txn.dequeue(waiter.id)
                txn.reaped_waiters.append(waiter)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        lock = FileLock(self.directory.lock_file, timeout=self.lock_timeout_s, mode=0o666)
        try:
            lock.acquire()
        except Timeout:
            raise LedgerError(
                f"the ledger in {self.directory.path} stayed locked for {self.lock_timeout_s:g} s",
                hint="another gpualloc is stuck in a transaction; find it with "
                f"'fuser -v {self.directory.lock_file}'",
            ) from None
        except OSError as exc:
            raise FileAccessError(
                f"cannot lock {self.directory.lock_file}: {exc.strerror}",
                hint="the lock file must be readable and writable by every user (mode 0666)",
            ) from exc
        try:
            yield
        finally:
            lock.release()

    # ---- reading -----------------------------------------------------------------------------

    def _load(self) -> tuple[Ledger, list[str]]:
        path = self.directory.ledger_file
        notes: list[str] = []
        try:
            text = _read_nofollow(path)
        except FileNotFoundError:
            text = None
        except OSError as exc:  # ELOOP: a symlink planted in its place; EACCES: wrong mode
            raise FileAccessError(
                f"cannot read the ledger {path}: {exc.strerror}",
                hint="ledger.json must be a regular file (not a symlink) that every user of "
                "the host can read and write (mode 0666)",
            ) from exc
        if text is None:
            ledger = self._newest_good_copy() or Ledger(host=self.host)
            if ledger.generation:
                notes.append(f"{path} was missing; restored generation {ledger.generation}")
        else:
            try:
                ledger = parse_ledger(text, str(path))
            except LedgerFromNewerVersion:
                raise
            except LedgerError as problem:
                recovered = self._newest_good_copy()
                if recovered is None:
                    raise LedgerError(
                        f"{problem.message}, and no good copy is left to recover from",
                        hint=f"move it away ('mv {path} {path}.broken'): gpualloc starts a new "
                        "ledger, and the GPUs of running jobs look free until they are seen",
                    ) from None
                ledger = recovered
                notes.append(
                    f"{path} was damaged ({problem.message}); recovered generation "
                    f"{ledger.generation} from a good copy"
                )
        if ledger.host != self.host:
            raise LedgerError(
                f"the ledger in {self.directory.path} belongs to host {ledger.host!r}, not "
                f"{self.host!r}",
                hint="each host needs its own state directory on local disk, never a shared "
                "(NFS) one; set GPUALLOC_STATE_DIR",
            )
        return ledger, notes

    def _newest_good_copy(self) -> Ledger | None:
        best: Ledger | None = None
        for copy in self.directory.good_copies():
            try:
                candidate = parse_ledger(_read_nofollow(copy), str(copy))
            except (LedgerError, OSError):
                continue
            if candidate.host != self.host:
                continue
            if best is None or candidate.generation > best.generation:
                best = candidate
        return best

    # ---- writing -----------------------------------------------------------------------------

    def _write(self, ledger: Ledger) -> None:
        ledger.generation += 1
        text = json.dumps(ledger.model_dump(mode="json"), indent=1, sort_keys=True) + "\n"
        data = text.encode()
        try:
            own = self.directory.good_copy(os.geteuid())
            write_text_atomic(own, text, mode=0o644)  # others recover from it
            _overwrite_in_place(self.directory.ledger_file, data)
        except OSError as exc:
            raise FileAccessError(
                f"cannot write the ledger in {self.directory.path}: {exc.strerror}",
                hint="ledger.json must be writable by every user of the host (mode 0666)",
            ) from exc


def parse_ledger(text: str, source: str) -> Ledger:
    """A ledger from its JSON text; :class:`LedgerError` if damaged or from a newer gpualloc."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LedgerError(f"{source} is not valid JSON (line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise LedgerError(f"{source} is not a ledger (a JSON object)")
    version = data.get("schema_version")
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise LedgerFromNewerVersion(
            f"{source} was written by a newer gpualloc (schema {version}; this one reads "
            f"{SCHEMA_VERSION})",
            hint="upgrade gpualloc on this host; every user must run the same version",
        )
    if version == 1:
        data = {**data, "schema_version": SCHEMA_VERSION}  # 2 only added fields with defaults
    try:
        return Ledger.model_validate(data)
    except ValidationError as exc:
        raise LedgerError(
            f"{source} is not a valid ledger ({describe_validation_error(exc)})"
        ) from None


def _read_nofollow(path: Path) -> str:
    descriptor = os.open(path, os.O_RDONLY | _NOFOLLOW)
    with os.fdopen(descriptor, encoding="utf-8", errors="replace") as handle:
        return handle.read()


def _overwrite_in_place(path: Path, data: bytes) -> None:
    """Write ``data`` over ``path`` without replacing the inode (see the module docstring)."""
    try:
        descriptor = os.open(path, os.O_WRONLY | _NOFOLLOW)
    except FileNotFoundError:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o666)
        os.fchmod(descriptor, 0o666)
    try:
        os.ftruncate(descriptor, 0)
        view = memoryview(data)
        while view:
            view = view[os.write(descriptor, view) :]
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _unlink_quietly(path: Path) -> None:
    try:
        if not lock_held(path):
            path.unlink()
    except OSError:
        pass  # another user's file in a sticky directory: harmless, its owner removes it
