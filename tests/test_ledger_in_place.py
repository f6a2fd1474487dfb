"""The file ledger's in-place writes and what a review found in them.

- A transaction that recovered the ledger rests on the good copy it recovered from: it
  replaces that copy whole instead of rewriting it in place, so that a second writer stopped
  midway still leaves one copy to recover from.
- A reader without the lock (``status``) may read while a writer is at work and see an old
  start and end around a new middle, whose generations agree: the checksum catches it.
- A good copy another user cannot read is replaced (mode 0644), not rewritten as it is.
"""

from __future__ import annotations

import os
import stat
from datetime import datetime, timezone
from pathlib import Path

from gpualloc.errors import LedgerError
from gpualloc.ledger.document import document_of, parses, read_ledger
from gpualloc.ledger.schema import Lease, LeasedGpu
from gpualloc.ledger.statedir import open_state_directory
from gpualloc.ledger.store import LedgerStore, new_lease_id

HOST = "testhost"


def _store(path: Path) -> LedgerStore:
    return LedgerStore(open_state_directory(path), host=HOST)


def _add(store: LedgerStore, gpu: int) -> None:
    lease = Lease(
        id=new_lease_id(),
        gpus=(LeasedGpu(index=gpu),),
        uid=os.geteuid(),
        user="tester",
        hold=True,
        created=datetime.now(timezone.utc),
        source="alloc",
    )
    with store.transaction() as txn:
        txn.add(lease)


def test_a_good_copy_is_rewritten_in_place_only_by_a_transaction_that_read_the_ledger_whole(
    tmp_path: Path,
) -> None:
    store = _store(tmp_path)
    _add(store, 0)
    own = store.directory.good_copy(os.geteuid())
    inode = own.stat().st_ino
    _add(store, 1)
    assert own.stat().st_ino == inode  # a plain transaction: in place
    text = store.directory.ledger_file.read_text()
    store.directory.ledger_file.write_text(text[: len(text) // 2])  # a writer stopped midway
    _add(store, 2)  # recovers from the good copy, then writes
    assert own.stat().st_ino != inode, "the copy recovered from was rewritten in place"
    assert sorted(x.indices for x in store.read().ledger.leases) == [(0,), (1,), (2,)]


def test_a_reader_without_the_lock_never_takes_a_mixture_of_two_writes(tmp_path: Path) -> None:
    store = _store(tmp_path)
    _add(store, 0)
    _add(store, 1)
    old = store.directory.ledger_file.read_text()
    with store.transaction() as txn:  # the lease on GPU 1 goes, one on GPU 2 comes
        txn.remove(txn.ledger.leases[1].id)
    _add(store, 2)
    new = store.directory.ledger_file.read_text()
    assert abs(len(old) - len(new)) < 3  # the same shape: mixtures of the two parse
    accepted = []
    shorter = min(len(old), len(new))  # past it, a "mixture" is one write and a stray byte
    for start in range(1, shorter, 5):
        for end in range(start + 1, shorter, 5):
            mixture = old[:start] + new[start:end] + old[end:]
            if mixture not in (old, new) and parses(mixture) and _reads(mixture):
                accepted.append((start, end))
    assert accepted == []


def _reads(text: str) -> bool:
    try:
        read_ledger(text, "ledger.json")
    except LedgerError:
        return False
    return True


def test_a_ledger_edited_by_hand_still_reads_with_the_lock(tmp_path: Path) -> None:
    """The trust model's cooperative users may rewrite the file (compact or re-indented): the
    checksum no longer matches, but the generations do, and no writer is at work."""
    store = _store(tmp_path)
    _add(store, 0)
    text = store.directory.ledger_file.read_text()
    edited = text.replace('"user":"tester"', '"user":"editor"')
    assert not parses(edited)  # a reader without the lock reads it again first
    ledger, aside = read_ledger(edited, "ledger.json")
    assert [x.user for x in ledger.leases] == ["editor"] and aside == []
    assert document_of(text, "ledger.json", checksum=True).endswith("}")


def test_a_good_copy_others_cannot_read_is_replaced_readable(tmp_path: Path) -> None:
    store = _store(tmp_path)
    _add(store, 0)
    own = store.directory.good_copy(os.geteuid())
    own.chmod(0o600)
    _add(store, 1)
    assert stat.S_IMODE(own.stat().st_mode) == 0o644
