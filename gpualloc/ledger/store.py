"""The ledger's transactions: lock, read (recovering if needed), reap, change, write.

Every read-modify-write holds ``ledger.lock`` (a ``flock``, :mod:`.locking`, which the kernel
drops when its holder dies, so a killed gpualloc never blocks the host). ``status`` reads
without waiting for it when another process holds it (:meth:`LedgerStore.snapshot`), and root's
Slurm hooks write to root's journal instead (:mod:`.journal`), which every transaction applies.

Writing must be crash-safe *and* work when several Unix users share the directory. The usual
temp file + ``rename`` does not: in a sticky directory (mode 1777, like ``/tmp``) nobody may
rename over another user's file. So a write has two steps:

1. the new ledger goes to the writer's own copy, ``ledger.<uid>.good.json`` (a user may always
   replace their own file);
2. then ``ledger.json`` (mode 0666, shared) is rewritten in place.

Both rewrite the file that is there in place, without truncating it first (:mod:`.in_place`),
since each text ends with its generation as it begins (:mod:`.document`): a writer killed in the
middle leaves the start of its text over the end of the one before, whose two generations give
it away, never a valid, wrong ledger. The first write over a file of an older gpualloc (no
trailer), or over a later generation (a ledger started anew), replaces it as before: the good
copy by temporary file and rename, ``ledger.json`` truncated first.

Nothing is synced to disk. A killed gpualloc loses nothing (the page cache outlives it); only a
crash of the machine does, and every lease and waiter dies with the machine (boot id, pids). Such a
crash may leave ``ledger.json`` torn and every good copy unwritten (a preallocated file reads as
zeros): a torn ledger last written before this boot is then replaced by a new one, saying so, since
nothing in it can be alive. Not syncing keeps a disk write out of the time each transaction holds
the lock (``fsync(2)`` of the good copy waits for the device; see :mod:`.in_place` for ext4's flush
on rename).

A writer killed during step 1 leaves ``ledger.json`` untouched. One killed during step 2 leaves
it holding the start of the new text over the old one (or, truncated first, a strict prefix of
a JSON object), which the next transaction reads as damaged, recovering the good copy its first
bytes name, which holds everything the interrupted write had. A file from a newer schema is
refused; a torn file with no good copy left is reported with what to do, never silently emptied
(but for a crash of the machine: above).

The ledger writes only what it reads back (:mod:`.document`: a change that would not is
refused, nothing written), and one record it cannot read is left out and kept aside, with a
note, instead of failing every command of every user (:mod:`.quarantine`).

On a host with a broker (``gpualloc serve``) the broker owns its state directory and its
ledger; :mod:`.owned_store` is that store.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from msgspec import Struct, field
from msgspec.structs import replace

from gpualloc import boot
from gpualloc.atomic import write_text_atomic
from gpualloc.boot import boot_id
from gpualloc.errors import LedgerError
from gpualloc.ledger.document import (
    HEADER,
    LedgerFromNewerVersion,
    ledger_text,
    parses,
    read_ledger,
)
from gpualloc.ledger.document import parse_ledger as parse_ledger  # where callers import it
from gpualloc.ledger.in_place import finish_in_place, overwrite_in_place, rewrite_own_copy
from gpualloc.ledger.liveness import (
    _boot_time,
    group_alive,
    lock_held,
    process_alive,
    started_by,
)
from gpualloc.ledger.locking import SharedLock
from gpualloc.ledger.quarantine import SetAside, keep
from gpualloc.ledger.schema import Lease, Ledger, Waiter
from gpualloc.ledger.shared_files import (
    UnsafeFile,
    access_error,
    owner_name,
    owner_or_root,
    read_shared,
)
from gpualloc.ledger.statedir import StateDirectory
from gpualloc.model.topology import GpuProcess

LOCK_TIMEOUT_S = 30.0
"""How long a transaction waits for another one; a transaction takes milliseconds."""
SHARED_LEDGER_MODE = 0o666


def lease_alive(
    lease: Lease, directory: StateDirectory, live_member: Callable[[int], bool] | None = None
) -> bool:
    """The liveness rule of :class:`~gpualloc.ledger.schema.Lease`; ``live_member`` as
    :func:`~gpualloc.ledger.liveness.group_alive` takes it."""
    if lease.boot_id is not None and lease.boot_id != boot_id():
        return False  # nothing survives a reboot: a held lease of a crashed node included
    if lease.hold:  # until released, or its time limit runs out (--time, limits.max_hold)
        ends = lease.ends
        return ends is None or datetime.now(timezone.utc) < ends
    if lease.lock and lock_held(directory.lease_lock(lease.id)):
        return True
    if lease.pid is not None and process_alive(lease.pid, lease.pid_start_time):
        return True
    group, leader_started = lease.process_group, lease.process_group_start
    if group is not None and leader_started is not None and process_alive(group, leader_started):
        return True  # the job its holder forked leads its group, and lives
    return group is not None and group_alive(group, live_member)


def new_lease_id() -> str:
    return os.urandom(6).hex()


class LedgerTransaction(Struct):
    """The ledger as one transaction sees it; changes are written when the transaction ends."""

    ledger: Ledger
    reaped: list[Lease] = field(default_factory=list)
    reaped_waiters: list[Waiter] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """Things the user should hear about (a recovered ledger)."""
    changed: bool = False
    ended: dict[str, datetime] = field(default_factory=dict)
    """When each lease this transaction removed left the ledger: the history's ``end`` (a
    broker's batch writes once, after all its changes)."""

    def add(self, lease: Lease) -> None:
        held = self.ledger.held_gpus()
        shares = self.ledger.shares()
        for index in lease.indices:
            holder = held.get(index)
            if lease.share is None and holder is not None:
                raise LedgerError(f"GPU {index} is already held by lease {holder.id}")
            if lease.share is None and index in shares:
                raise LedgerError(f"GPU {index} runs shared job {shares[index][0].id}")
            if lease.share is not None and holder is not None and not holder.shareable:
                raise LedgerError(f"GPU {index} is held by lease {holder.id}, which is not shared")
        held_mig = self.ledger.held_mig()
        for device in lease.mig:
            if device.key in held_mig:
                raise LedgerError(
                    f"MIG device {device.label} is already held by lease {held_mig[device.key].id}"
                )
        if self.ledger.find(lease.id) is not None:
            raise LedgerError(f"a lease with id {lease.id} exists already")
        self.ledger.leases.append(lease)
        self.changed = True

    def replace(self, lease: Lease) -> None:
        """Put ``lease`` in place of the lease with its id."""
        self.ledger.leases = [lease if x.id == lease.id else x for x in self.ledger.leases]
        self.changed = True

    def remove(self, lease_id: str) -> Lease | None:
        lease = self.ledger.find(lease_id)
        if lease is not None:
            self.ledger.leases = [other for other in self.ledger.leases if other.id != lease_id]
            self.changed = True
            self.ended.setdefault(lease_id, datetime.now(timezone.utc))
        return lease

    # ---- the waiting queue -----------------------------------------------------------------

    def enqueue(self, waiter: Waiter) -> Waiter:
        """Add ``waiter`` at the back of its priority class; returns it with its arrival number."""
        if self.ledger.waiter(waiter.id) is not None:
            raise LedgerError(f"a waiter with id {waiter.id} exists already")
        queued = replace(waiter, seq=self.ledger.next_seq)
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
                replace(w, passed_over=w.passed_over + 1) if w.id in passed else w
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
        gpu_processes: Callable[[], Iterable[GpuProcess]] = tuple,
    ) -> None:
        self.directory = directory
        self.host = host or boot.hostname()
        self.alive = alive
        self.lock_timeout_s = lock_timeout_s
        self.gpu_processes = gpu_processes
        """What runs on the GPUs now (NVML's process lists, or a recorded topology's)."""
        self.reap_in_transactions = True
        """Reap dead leases in every transaction (the broker's store reaps when asked)."""
        self.seen_dead: set[str] = set()
        """Leases the reaper found dead since the last write: the history's ``ended``."""
        self.exit_statuses: dict[str, tuple[int, bool]] = {}
        """Exit statuses told (:func:`gpualloc.host.ending.end_exited`), for the history."""
        self._recovered_from: Path | None = None
        """The good copy the last load recovered the ledger from (:meth:`_finish_interrupted`)."""

    def _lock(self, timeout_s: float | None = None) -> SharedLock:
        return SharedLock(self.directory.lock_file, timeout_s=timeout_s or self.lock_timeout_s)

    @contextmanager
    def transaction(
        self, *, lock_timeout_s: float | None = None, reap: bool | None = None
    ) -> Iterator[LedgerTransaction]:
        """Lock (waiting ``lock_timeout_s``, else the store's timeout), load, apply root's
        journal, reap dead leases, hand the ledger over; write it back if it changed.

        ``reap``: None reaps as the store does (:attr:`reap_in_transactions`)."""
        reap = self.reap_in_transactions if reap is None else reap
        with self._lock(lock_timeout_s):
            ledger, notes, aside = self._load()
            before = {lease.id: lease for lease in ledger.leases}  # for the history
            txn = LedgerTransaction(ledger, notes=notes, changed=bool(notes))
            self._apply_journal(txn)
            if reap:
                self._reap(txn)
            yield txn
            if txn.changed:
                self._keep_aside(aside, txn.notes)  # before the ledger without them replaces it
                self._finish_interrupted()
                # A ledger recovered (notes) or read in part (aside) may rest on this user's
                # good copy alone: that copy is replaced whole then, never rewritten in place,
                # so that a second writer stopped midway still leaves one copy to recover from.
                self._write(txn.ledger, in_place=not notes and not aside)
                self._append_history(before, txn.ledger, SHARED_LEDGER_MODE, txn.ended)
                for lease in txn.reaped:
                    _unlink_quietly(self.directory.lease_lock(lease.id))
        if os.geteuid() == 0 and os.path.lexists(self.directory.journal_file):
            from gpualloc.ledger import journal

            # What fails to fold now is folded by root's next transaction (and applying an
            # entry a ledger already includes changes nothing).
            with contextlib.suppress(OSError, LedgerError):
                journal.fold_applied(
                    self.directory.journal_file,
                    self.directory.journal_lock,
                    self.host,
                    txn.ledger.root_journal_seq,
                )

    def _append_history(
        self,
        before: dict[str, Lease],
        ledger: Ledger,
        mode: int,
        ended: dict[str, datetime] | None = None,
    ) -> None:
        """A record of each lease the ledger just written dropped (:mod:`.history`)."""
        from gpualloc.ledger.history import append_ended

        dead, self.seen_dead = self.seen_dead, set()
        held = {lease.id for lease in ledger.leases}
        statuses = {k: v for k, v in self.exit_statuses.items() if k not in held}
        self.exit_statuses = {k: v for k, v in self.exit_statuses.items() if k in held}
        append_ended(
            self.directory, before, ledger, dead | statuses.keys(), statuses, ended, mode=mode
        )

    def read(self) -> LedgerTransaction:
        """One transaction that changes nothing but the reaping; its result."""
        with self.transaction() as txn:
            return txn

    def snapshot(self) -> LedgerTransaction:
        """The ledger as it stands, dead leases left out (listed in ``reaped``), written nowhere:
        for ``status`` and ``--dry-run``, which must not change the host.

        It never waits for the lock: when another process holds it, the ledger is read as the
        last completed write left it (a write in progress is recovered from its writer's good
        copy) and a note names the holder, so that ``status`` still shows who holds what."""
        ledger, notes = self._load_for_snapshot()
        txn = LedgerTransaction(ledger, notes=notes)
        self._apply_journal(txn)
        self._reap(txn)
        txn.changed = False
        return txn

    def _load_for_snapshot(self) -> tuple[Ledger, list[str]]:
        """The ledger without waiting for the lock (see :meth:`snapshot`)."""
        if not self._lock_readable():  # a broker's ledger, read by a user: written by rename
            return self._load(unlocked=True)[:2]
        lock = self._lock()
        if lock.try_acquire():
            try:
                return self._load()[:2]
            finally:
                lock.release()
        ledger, notes, _ = self._load(unlocked=True)
        notes.append(f"the ledger's lock is held by {lock.holders()}; shown as last written")
        return ledger, notes

    def _lock_readable(self) -> bool:
        """False for a broker's lock file, which only its owner may open."""
        try:
            info = os.lstat(self.directory.lock_file)
        except OSError:
            return True
        return info.st_uid == os.geteuid() or bool(info.st_mode & 0o044)

    def _apply_journal(self, txn: LedgerTransaction) -> None:
        if not os.path.lexists(self.directory.journal_file):
            return  # the usual case: the journal's models are not even built
        from gpualloc.ledger import journal

        found, notes = journal.read_journal(self.directory.journal_file, self.host)
        applied = journal.apply_journal(txn.ledger, found) if found is not None else []
        txn.notes += notes + applied
        txn.changed = txn.changed or bool(applied)

    def _reap(self, txn: LedgerTransaction) -> None:
        for lease in list(txn.ledger.leases):
            if not self.alive(lease, self.directory) and not self._runs_on_its_gpus(lease):
                txn.remove(lease.id)
                txn.reaped.append(lease)
                self.seen_dead.add(lease.id)
        for waiter in list(txn.ledger.queue):
            if not process_alive(waiter.pid, waiter.pid_start_time):
                txn.dequeue(waiter.id)
                txn.reaped_waiters.append(waiter)

    def _runs_on_its_gpus(self, lease: Lease) -> bool:
        """A process of the lease's owner, started since the lease, computes on one of its
        GPUs: a descendant that lost the lease lock and left the job's process group (a daemon
        that closed its descriptors and called setsid) still keeps the GPUs
        (tests/test_lease_lifetime.py::test_a_daemon_that_left_the_group_keeps_the_gpus_while_it_runs_on_them).
        Only for leases whose job has ended, so NVML's view is asked about rarely."""
        if lease.boot_id is not None and lease.boot_id != boot_id():
            return False
        created = lease.created.timestamp()
        return any(
            process.gpu in lease.indices and started_by(process.pid, lease.uid, since=created)
            for process in self.gpu_processes()
        )

    # ---- reading -----------------------------------------------------------------------------

    def _load(self, *, unlocked: bool = False) -> tuple[Ledger, list[str], list[SetAside]]:
        """The ledger, recovered from the good copies when it is missing or damaged, with the
        notes for the user and the records left out because they cannot be read (kept aside
        by the transaction that writes: :meth:`_keep_aside`). Without the lock (``unlocked``)
        a damaged file may be a write in progress: it is read again before being recovered
        from, and quietly."""
        path = self.directory.ledger_file
        notes: list[str] = []
        aside: list[SetAside] = []
        self._recovered_from = None
        text = self._ledger_text()
        for _ in range(3 if unlocked else 0):
            if text is None or parses(text):  # a whole write, checksum and all
                break
            time.sleep(0.005)
            again = self._read_ledger_text()
            if again == text:  # no write at work: damaged, or edited by hand (read below)
                break
            text = again
        if text is None:
            ledger, notes = self._recover(None, f"{path} was missing")
            ledger = ledger or Ledger(host=self.host)
            if not ledger.generation:
                notes = []
        else:
            try:
                ledger, aside = read_ledger(text, str(path))
            except LedgerFromNewerVersion:
                raise
            except LedgerError as problem:
                recovered, notes = self._recover(text, f"{path} was damaged ({problem.message})")
                if recovered is None and _written_before_this_boot(path):
                    recovered = Ledger(host=self.host)
                    notes = [
                        f"{path} was damaged ({problem.message}) and last written before this "
                        "boot, whose end ended every lease in it: a new ledger is started"
                    ]
                if recovered is None:
                    raise LedgerError(
                        f"{problem.message}, and no good copy is left to recover from",
                        hint=f"move it away ('mv {path} {path}.broken'): gpualloc starts a new "
                        "ledger, and the GPUs of running jobs look free until they are seen",
                    ) from None
                ledger = recovered
            whole = self._recover_whole(text, aside) if aside else None
            if whole is not None:
                (ledger, notes), aside = whole, []
        if unlocked:
            notes = []
        if aside:
            kept_in = self.directory.quarantine_file(os.geteuid()).name
            notes += [record.note(path.name, kept_in) for record in aside]
        if ledger.host != self.host:
            raise LedgerError(
                f"the ledger in {self.directory.path} belongs to host {ledger.host!r}, not "
                f"{self.host!r}",
                hint="each host needs its own state directory on local disk, never a shared "
                "(NFS) one; set GPUALLOC_STATE_DIR",
            )
        return ledger, notes, aside

    def _ledger_text(self) -> str | None:
        """The text to load the ledger from (the broker's store keeps its own)."""
        return self._read_ledger_text()

    def _read_ledger_text(self) -> str | None:
        """The ledger's text; None when it is missing, or was planted and root removed it
        (the good copies remain to recover from)."""
        path = self.directory.ledger_file
        try:
            return read_shared(path, replace_as_root=True)[0]
        except FileNotFoundError:
            return None
        except OSError as exc:  # EACCES: a mode that shuts others out
            raise access_error(path, exc, "read") from exc

    def _good_copies(self) -> list[tuple[Path, int, Ledger]]:
        """(path, owner uid, ledger) of every good copy that can be trusted to be its owner's."""
        found = []
        for copy in self.directory.good_copies():
            uid = int(copy.name[len(self.directory.ledger_file.stem) + 1 : -len(".good.json")])
            try:
                text, info = read_shared(copy)
                candidate, aside = read_ledger(text, str(copy))
            except (LedgerError, OSError):
                continue
            if aside:
                continue  # a copy to recover from is whole: left-out records are set aside
            if info.st_uid != uid or candidate.host != self.host:
                continue  # planted under another user's name, or another host's
            if candidate.writer_uid not in (None, uid):
                continue
            found.append((copy, uid, candidate))
        return found

    def _recover_whole(
        self, damaged: str, aside: list[SetAside]
    ) -> tuple[Ledger, list[str]] | None:
        """A ledger with records that cannot be read, recovered whole from the good copy its
        last write names, when that copy holds them readable (a hand edit of ``ledger.json``
        alone); None otherwise (they are set aside: :mod:`.quarantine`)."""
        named = _named_copy(damaged, self._good_copies())
        if named is None:
            return None
        (uid, ledger), first = named, aside[0]
        self._recovered_from = self.directory.good_copy(uid)
        return ledger, [
            f"{self.directory.ledger_file} was damaged ({first.kind} {first.label}: "
            f"{first.reason}); recovered generation {ledger.generation} from "
            f"{owner_name(uid)}'s good copy, which its last write names"
        ]

    def _recover(self, damaged: str | None, what: str) -> tuple[Ledger | None, list[str]]:
        """The good copy to recover from, and what to tell the user (module docstring)."""
        copies = self._good_copies()
        if not copies:
            return None, []
        named = _named_copy(damaged, copies)
        if named is not None:
            uid, ledger = named
            self._recovered_from = self.directory.good_copy(uid)
            return ledger, [
                f"{what}; recovered generation {ledger.generation} from "
                f"{owner_name(uid)}'s good copy, which its last write names"
            ]
        path, uid, best = max(copies, key=lambda found: found[2].generation)
        self._recovered_from = path
        others = ", ".join(
            f"{owner_name(u)}'s generation {c.generation}" for p, u, c in copies if p != path
        )
        return best, [
            f"{what}; recovered generation {best.generation} from {owner_name(uid)}'s "
            f"good copy {path.name}, which nothing confirms"
            + (f" (the other copies: {others})" if others else "")
            + ". If no gpualloc was killed while writing, that copy may be forged: check "
            "'gpualloc status'"
        ]

    # ---- writing -----------------------------------------------------------------------------

    def _keep_aside(self, aside: list[SetAside], notes: list[str]) -> None:
        """Keep the records the ledger left out in this user's quarantine file (a failure is
        told, and does not stop the write: the records are lost then, not every command)."""
        if not aside:
            return
        path = self.directory.quarantine_file(os.geteuid())
        try:
            keep(path, aside, self.directory.ledger_file.name)
        except OSError as exc:
            notes.append(f"could not keep the records left out in {path}: {exc.strerror}")

    def _finish_interrupted(self) -> None:
        """Before a transaction that recovered the ledger writes, ``ledger.json`` gets the good
        copy it was recovered from (:func:`.in_place.finish_in_place`): the write a killed
        writer left unfinished is finished. Without it, the torn file went on naming a copy
        that its owner's next transaction replaces (a recovering one replaces its copy whole:
        :meth:`transaction`); killed again before it rewrote ``ledger.json``, that owner left
        a torn file whose named copy was gone, and the next reader recovered from the newest
        copy of any user, written by a transaction that was killed and had been seen not to
        count: a killed alloc's lease came back, holding its GPUs (found by
        tests/test_crash_consistency.py)."""
        copy, self._recovered_from = self._recovered_from, None
        if copy is None:
            return
        path = self.directory.ledger_file
        try:
            data = read_shared(copy)[0].encode()
            finish_in_place(path, data, SHARED_LEDGER_MODE)
        except OSError as exc:
            raise access_error(path, exc, "write", changed=True) from exc

    def _write(self, ledger: Ledger, *, in_place: bool = True) -> None:
        """This user's good copy, then the shared ledger. ``in_place``: whether the good copy
        may be rewritten in place (:mod:`.in_place`), or must be replaced by a new file."""
        uid = os.geteuid()
        text = ledger_text(ledger, uid)
        data = text.encode()
        own = self.directory.good_copy(uid)
        _check_own_copy(own, uid)
        try:  # not synced: see the module docstring
            if not (in_place and rewrite_own_copy(own, data, ledger.generation)):
                write_text_atomic(own, text, mode=0o644, sync=False)  # others recover from it
        except OSError as exc:
            raise access_error(own, exc, "write", changed=False) from exc
        path = self.directory.ledger_file
        try:
            overwrite_in_place(path, data, ledger.generation, SHARED_LEDGER_MODE)
        except OSError as exc:
            raise access_error(path, exc, "write", changed=True) from exc


def _written_before_this_boot(path: Path) -> bool:
    """Whether ``path`` was last written before this boot: then nothing it holds is alive. A
    user cannot date another's file back (setting a past time needs its ownership)."""
    try:
        return path.stat().st_mtime < _boot_time()
    except OSError:
        return False


def _named_copy(
    damaged: str | None, copies: list[tuple[Path, int, Ledger]]
) -> tuple[int, Ledger] | None:
    """(owner uid, ledger) of the good copy that the first bytes of a damaged ledger name
    (:data:`HEADER`): its writer's, of the same generation."""
    header = HEADER.match(damaged or "")
    if header is None:
        return None
    writer, generation = int(header.group(1)), int(header.group(2))
    for _, uid, ledger in copies:
        if uid == writer and ledger.generation == generation:
            return uid, ledger
    return None


def _check_own_copy(path: Path, uid: int) -> None:
    """A user's good copy can be squatted: another user may create a file of that name first,
    and the sticky bit then forbids replacing it. Say who did (root replaces it anyway)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if uid != 0 and info.st_uid != uid:
        raise UnsafeFile(
            f"{path} belongs to {owner_name(info.st_uid)}, not to you: gpualloc keeps your "
            "copy of the ledger there, and cannot replace another user's file",
            hint=f"{owner_or_root(owner_name(info.st_uid))} must remove it ('rm {path}')",
        )


def _unlink_quietly(path: Path) -> None:
    try:
        if not lock_held(path):
            path.unlink()
    except OSError:
        pass  # another user's file in a sticky directory: harmless, its owner removes it
