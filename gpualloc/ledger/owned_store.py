"""The broker's ledger store: one owner, one lock held for good, one write per batch.

On a host with a broker (``gpualloc serve``, :mod:`gpualloc.broker`) the broker *owns* the state
directory: the directory is its own and no other user may create files in it, so the shared
store's defences (:mod:`.store`: good copies per user, in-place rewrites in a sticky directory,
recovery from what others wrote) have nothing to defend against. Instead:

- it holds ``ledger.lock`` (mode 0600: no user can even open it) for as long as it runs; a
  second broker, or a root tool writing the ledger, finds it held (:meth:`hold_lock`);
- it writes its good copy ``ledger.<uid>.good.json``, then ``ledger.json`` (both 0644: everyone may
  read them), each in place over the one before (:mod:`.in_place`: a rename makes ext4 write the new
  file out first, the largest cost of a request on a loaded host), and reads the ledger back from
  what it last wrote instead of from the disk (the check that a write reads back,
  :func:`.document.written_ledger`, is that reading). A broker killed while it wrote ``ledger.json``
  leaves it torn and its good copy whole: the next broker recovers from that copy when it starts
  (:meth:`OwnedLedgerStore.set_aside_damaged`); one killed while it wrote the good copy left
  ``ledger.json`` as it was;
- it does not fsync: the page cache outlives a killed broker, so a ``kill -9`` loses nothing,
  and what a crash of the machine could lose is dead anyway (every lease dies with its boot).
  A ledger a crash left damaged is set aside when the broker starts (:meth:`set_aside_damaged`);
- it never recovers from a file it did not write: its own good copy alone;
- the transactions of a batch (:meth:`batch`: what one turn of the broker's loop received)
  share one load and one write, group commit as databases do it; a transaction that fails in
  a batch leaves the batch's ledger as it found it, and so does one whose change could not be
  written (text that is not UTF-8), so that it fails alone, not its batch;
- it reaps dead leases only when asked (``transaction(reap=True)``): the broker learns of ended
  processes from their pidfds and looks every second, and reading ``/proc`` for every lease in
  every transaction would cost more than the rest of a request.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import msgspec

from gpualloc.atomic import write_text_atomic
from gpualloc.errors import LedgerError
from gpualloc.ledger.document import (
    LedgerFromNewerVersion,
    document_of,
    parse_ledger,
    read_ledger,
    written_ledger,
)
from gpualloc.ledger.in_place import open_own_file, put_back, rewrite_own_copy
from gpualloc.ledger.locking import SharedLock
from gpualloc.ledger.quarantine import SetAside
from gpualloc.ledger.schema import Lease, Ledger
from gpualloc.ledger.shared_files import access_error
from gpualloc.ledger.store import LedgerStore, LedgerTransaction

LEDGER_MODE = 0o644
"""The broker's ledger: everyone reads it, only the broker writes it."""
LOCK_MODE = 0o600
"""The broker's lock: nobody else can open it, so nobody else can hold it."""


class OwnedLedgerStore(LedgerStore):
    """The ledger of a directory its owner alone writes (module docstring)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.reap_in_transactions = False
        self._held: SharedLock | None = None
        self._written: str | None = None
        self._read_back: Ledger | None = None
        """The ledger as read back from :attr:`_written`, for the next load alone."""
        self._batch: _Batch | None = None

    def _lock(self, timeout_s: float | None = None) -> SharedLock:
        if self._held is not None:
            return contextlib.nullcontext()  # type: ignore[return-value]  # held for good
        return SharedLock(
            self.directory.lock_file, timeout_s=timeout_s or self.lock_timeout_s, mode=LOCK_MODE
        )

    def _load_for_snapshot(self) -> tuple[Ledger, list[str]]:
        if self._held is not None:
            return self._load()[:2]  # the broker's own reading: nobody else writes
        return super()._load_for_snapshot()

    def _load(self, *, unlocked: bool = False) -> tuple[Ledger, list[str], list[SetAside]]:
        if self._held is not None and self._read_back is not None:
            ledger, self._read_back = self._read_back, None  # its reader changes it in place
            return ledger, [], []
        return super()._load(unlocked=unlocked)

    def hold_lock(self) -> bool:
        """Take ``ledger.lock`` for good (False: another process holds it)."""
        lock = SharedLock(self.directory.lock_file, timeout_s=0.0, mode=LOCK_MODE)
        if not lock.try_acquire():
            return False
        self._held = lock
        return True

    def lock_holders(self) -> str:
        """Who holds ``ledger.lock`` now."""
        return SharedLock(self.directory.lock_file, timeout_s=0.0, mode=LOCK_MODE).holders()

    def set_aside_damaged(self) -> str | None:
        """At start: a ledger that does not parse is kept as ``.damaged-<time>`` and replaced
        by the broker's good copy when it has one (a broker killed while it wrote the ledger
        tore it), else by nothing, so that the broker starts with an empty ledger instead of
        refusing to start (only a crash of the machine tears both, and every lease died with
        it). Returns what it did. A ledger with a record that cannot be read parses
        (:func:`.document.parse_ledger` leaves it out): the first transaction keeps it aside
        and says so.

        The damaged file is kept by a second name (a hard link) *before* the good copy
        replaces it, in one rename: a broker killed in between leaves the torn ledger where
        it was, and the next one recovers again. Moved aside first, a kill before the good
        copy was in place left no ``ledger.json``, and the next broker started empty: every
        lease its clients were granted was lost (tests/test_crash_consistency.py)."""
        path = self.directory.ledger_file
        text = self._read_ledger_text()
        if text is None:
            return None
        try:
            parse_ledger(text, str(path))
        except LedgerFromNewerVersion:
            raise
        except LedgerError as problem:
            recovered = self._own_good_copy()
            if recovered is not None:
                aside = _keep_damaged(path, os.link)
                copy, generation = recovered
                write_text_atomic(path, copy, mode=LEDGER_MODE, sync=False)
                return (
                    f"{problem.message}; moved to {aside.name}, recovered generation "
                    f"{generation} from the broker's good copy"
                )
            aside = _keep_damaged(path, os.rename)
            return f"{problem.message}; moved to {aside.name}, starting with an empty ledger"
        return None

    def _own_good_copy(self) -> tuple[str, int] | None:
        """The text and generation of this broker's good copy when it is whole, this host's,
        and its own file (nobody else writes the directory, but a copy is trusted only so)."""
        copy = self.directory.good_copy(os.geteuid())
        opened = open_own_file(copy, os.O_RDONLY)
        if opened is None:
            return None
        descriptor, info = opened
        try:
            text = os.read(descriptor, info.st_size + 1).decode()
            document_of(text, str(copy), checksum=True)  # one whole write
            ledger, aside = read_ledger(text, str(copy))
        except (OSError, UnicodeDecodeError, LedgerError):
            return None
        finally:
            os.close(descriptor)
        return (text, ledger.generation) if ledger.host == self.host and not aside else None

    # ---- group commit ------------------------------------------------------------------------

    @contextmanager
    def batch(self) -> Iterator[None]:
        """The transactions inside share one load and one write, made when the batch ends
        (the broker answers its clients only after that); a batch that fails writes nothing."""
        if self._batch is not None:
            yield
            return
        self._batch = batch = _Batch()
        try:
            yield
            if batch.txn is not None and batch.changed:
                self._keep_aside(batch.aside, batch.txn.notes)
                self._write(batch.txn.ledger)
                self._append_history(batch.before, batch.txn.ledger, LEDGER_MODE, batch.ended)
        finally:
            self._batch = None

    @contextmanager
    def transaction(
        self, *, lock_timeout_s: float | None = None, reap: bool | None = None
    ) -> Iterator[LedgerTransaction]:
        if self._batch is None:
            with super().transaction(lock_timeout_s=lock_timeout_s, reap=reap) as txn:
                yield txn
            return
        with self._in_batch(bool(reap)) as txn:
            yield txn

    def snapshot(self) -> LedgerTransaction:
        """Inside a batch, the ledger as the batch's transactions have left it (what the
        batch will write): a waiter queued in this turn is told where it stands in this turn
        (``tests/test_host_contract.py``); outside one, as :meth:`LedgerStore.snapshot`."""
        batch = self._batch
        if batch is None or batch.txn is None:
            return super().snapshot()
        encoded = batch.saved if batch.saved is not None else msgspec.json.encode(batch.txn.ledger)
        txn = LedgerTransaction(msgspec.json.decode(encoded, type=Ledger))
        self._reap(txn)
        txn.changed = False
        return txn

    @contextmanager
    def _in_batch(self, reap: bool) -> Iterator[LedgerTransaction]:
        batch = self._batch
        assert batch is not None
        if batch.txn is None:
            ledger, notes, batch.aside = self._load()
            batch.before = {lease.id: lease for lease in ledger.leases}
            batch.txn = LedgerTransaction(ledger, notes=notes)
            batch.changed = bool(notes)
            self._apply_journal(batch.txn)
        shared = batch.txn.ledger
        saved = batch.saved if batch.saved is not None else msgspec.json.encode(shared)
        txn = LedgerTransaction(shared, changed=False)
        if batch.txn.changed:
            txn.notes, batch.txn.changed = list(batch.txn.notes), False
            batch.changed = True
        try:
            if reap:
                self._reap(txn)
            yield txn
            batch.saved = _encoded(txn.ledger)  # the next one's saved copy; the check, free
        except BaseException:
            batch.txn.ledger = msgspec.json.decode(saved, type=Ledger)
            batch.saved = saved
            raise
        batch.txn.ledger = txn.ledger
        batch.changed = batch.changed or txn.changed
        for lease_id, when in txn.ended.items():
            batch.ended.setdefault(lease_id, when)
        for lease in txn.ledger.leases:  # made in this batch: its end in it is the history's too
            batch.before.setdefault(lease.id, lease)

    # ---- reading and writing -----------------------------------------------------------------

    def _ledger_text(self) -> str | None:
        if self._held is not None and self._written is not None:
            return self._written
        return self._read_ledger_text()

    def _recover(self, damaged: str | None, what: str) -> tuple[Ledger | None, list[str]]:
        return None, []  # a file in this directory that the broker did not write: no trust

    def _finish_interrupted(self) -> None:
        """Nothing: the broker finishes a torn write when it starts (:meth:`set_aside_damaged`),
        and its ledger keeps its own mode (the shared store's would be 0666)."""
        self._recovered_from = None

    def _write(self, ledger: Ledger, *, in_place: bool = True) -> None:
        """The good copy, then ``ledger.json``, each in place where it may be (module
        docstring), else replaced by rename: nobody else writes the directory, so nothing
        stops the rename. ``in_place`` False: both replaced.

        A ``ledger.json`` that could not be written (a full disk: writing in place needs no
        new block until the text outgrows its file) may be left torn; the good copy is then
        put back as it was, so that a broker started on it recovers what its clients were
        told, not the change that failed."""
        text, read_back = written_ledger(ledger, os.geteuid())
        data = text.encode()
        good = self.directory.good_copy(os.geteuid())
        previous = self._written if self._written is not None else self._read_ledger_text()
        try:
            self._write_file(good, text, data, ledger.generation, in_place)
        except OSError as exc:
            raise access_error(good, exc, "write") from exc
        try:
            self._write_file(self.directory.ledger_file, text, data, ledger.generation, in_place)
        except OSError as exc:
            with contextlib.suppress(OSError):
                if previous is None:
                    good.unlink()
                else:
                    put_back(good, previous.encode())
            raise access_error(self.directory.ledger_file, exc, "write") from exc
        self._written, self._read_back = text, read_back

    @staticmethod
    def _write_file(path: Path, text: str, data: bytes, generation: int, in_place: bool) -> None:
        if not (in_place and rewrite_own_copy(path, data, generation)):
            write_text_atomic(path, text, mode=LEDGER_MODE, sync=False)


def _keep_damaged(path: Path, keep: Callable[[Path, Path], None]) -> Path:
    """Give the damaged ledger ``path`` the name ``<name>.damaged-<time>`` (``keep``:
    ``os.link`` or ``os.rename``), one no earlier start used (two in one second keep both)."""
    stem = f"{path.name}.damaged-{int(time.time())}"
    for attempt in range(100):
        aside = path.with_name(stem if not attempt else f"{stem}.{attempt}")
        if os.path.lexists(aside):
            continue
        try:
            keep(path, aside)
        except FileExistsError:
            continue
        return aside
    raise LedgerError(f"{path} is damaged, and 100 damaged copies of it are kept already")


def _encoded(ledger: Ledger) -> bytes:
    """``ledger`` as JSON; :class:`LedgerError` when a transaction put in text that is not
    UTF-8 (which :func:`.document.written_ledger` would refuse at the end of the batch, failing
    every transaction of the batch instead of the one that did it)."""
    try:
        return msgspec.json.encode(ledger)
    except UnicodeEncodeError:
        raise LedgerError(
            "this change was not made: it holds text that is not UTF-8, which the ledger cannot "
            "keep",
            hint="this is a bug in gpualloc: report it with the command that made the change",
        ) from None


class _Batch:
    """The ledger a batch of transactions shares."""

    def __init__(self) -> None:
        self.txn: LedgerTransaction | None = None
        self.changed = False
        self.aside: list[SetAside] = []
        """Records the batch's load left out: kept aside before its write."""
        self.saved: bytes | None = None
        """The ledger as the last transaction of the batch left it, encoded."""
        self.before: dict[str, Lease] = {}
        """The leases the batch's load found: those its write drops are the history's."""
        self.ended: dict[str, datetime] = {}
        """When each lease the batch's transactions removed left the ledger."""
