"""Writing a ledger file over the one before, in place.

Neither a rename over the old file nor a truncation to nothing: both free the old file's blocks, and
ext4 then allocates the new file's blocks and starts their write-out in the call itself (its
``auto_da_alloc`` default, Documentation/admin-guide/ext4.rst in the Linux sources), which the
transaction waits for while it holds the lock (``benchmarks/bench_launch.py``'s library figure shows
the cost). A text is written from the start of the file over the old one, and what is left of the
old text after it is cut off. That is safe because every text ends with its generation as it begins
(:mod:`.document`): a writer stopped in the middle leaves the start of the new text over the end of
the old one, and the two generations differ (the new one is always later: see :func:`_rewritable`),
so the file reads as damaged and the ledger is recovered from the good copy written before it
(:mod:`.store`). A file that does not end with an earlier generation (one of an older gpualloc, or
of a ledger started anew) is truncated first, as before, or replaced.

Two exceptions keep a copy to recover from whatever happens: a transaction that recovered the
ledger (from this user's good copy, perhaps) replaces the good copy whole, and a good copy other
users cannot read (not 0644) is replaced. A reader without the lock may see a writer at work:
an old start and end around a new middle agree on their generation, so every text also carries
a checksum (:data:`.document.CHECKSUM`) that such a reader checks. A machine crash may leave
either file in any mixture of pages: a ledger last written before this boot starts anew.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gpualloc.ledger.document import trailer_generation
from gpualloc.ledger.shared_files import adopt, open_shared

GOOD_COPY_MODE = 0o644
"""A good copy's mode: every user reads it to recover a damaged ledger (:mod:`.store`)."""
TAIL_BYTES = 64
"""Enough of a file's end for its trailer: ``,"generation_end":`` and 20 digits, and more."""


def overwrite_in_place(path: Path, data: bytes, generation: int, mode: int) -> None:
    """Write ``data`` (of ``generation``) over the shared file ``path`` (created with ``mode``,
    which root takes over: :func:`.shared_files.adopt`) without replacing its inode: in place
    where it may be (:func:`_rewritable`), else truncated first (then an empty file or a strict
    prefix of the text is all that a writer stopped midway can leave)."""
    descriptor, info = open_shared(path, os.O_RDWR, create_mode=mode, replace_as_root=True)
    try:
        adopt(descriptor, info, mode)
        if _rewritable(descriptor, info, generation):
            _write_over(descriptor, data)
        else:
            os.ftruncate(descriptor, 0)
            _write_over(descriptor, data)
    finally:
        os.close(descriptor)


def finish_in_place(path: Path, data: bytes, mode: int) -> None:
    """Write ``data``, the good copy that the torn shared file ``path`` was recovered from, over
    it from the start, whatever its end (:func:`overwrite_in_place` otherwise): a transaction
    that recovered the ledger first finishes the write that was interrupted, and only then
    replaces its own good copy (:mod:`.store`). Where the torn file names that copy, its first
    bytes are ``data``'s already, so that a writer stopped here too leaves a file that names the
    same copy, still whole."""
    descriptor, info = open_shared(path, os.O_RDWR, create_mode=mode, replace_as_root=True)
    try:
        adopt(descriptor, info, mode)
        _write_over(descriptor, data)
    finally:
        os.close(descriptor)


def open_own_file(path: Path, flags: int) -> tuple[int, os.stat_result] | None:
    """``path`` opened with ``flags`` (never through a symbolic link, never blocking), with its
    status, when it is this user's one plain file (one link: nobody else's name for it); None
    where it is missing or is not (nothing is left open then)."""
    try:
        descriptor = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    info = os.fstat(descriptor)
    if stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid() and info.st_nlink == 1:
        return descriptor, info
    os.close(descriptor)
    return None


def rewrite_own_copy(path: Path, data: bytes, generation: int) -> bool:
    """Write ``data`` (of ``generation``) over this user's good copy in place; False where it
    may not be (:func:`_rewritable`), is missing, or is not this user's one plain file: the
    caller replaces it then."""
    opened = open_own_file(path, os.O_RDWR)
    if opened is None:
        return False
    descriptor, info = opened
    try:
        if stat.S_IMODE(info.st_mode) != GOOD_COPY_MODE:  # others must read it to recover
            return False
        if not _rewritable(descriptor, info, generation):
            return False
        _write_over(descriptor, data)
        return True
    finally:
        os.close(descriptor)


def put_back(path: Path, data: bytes) -> None:
    """Write ``data``, an earlier text of the file ``path``, back over it in place (a write
    after it failed): no new file, so no new block on a full disk unless ``data`` is longer."""
    descriptor = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        _write_over(descriptor, data)
    finally:
        os.close(descriptor)


def _rewritable(descriptor: int, info: os.stat_result, generation: int) -> bool:
    """Whether the file open as ``descriptor`` may be written over in place with a text of
    ``generation``: it ends with the trailer of an earlier one (:mod:`.document`), so that any
    mixture of the two texts reads as damaged."""
    if not info.st_size:
        return False
    tail = os.pread(descriptor, TAIL_BYTES, max(0, info.st_size - TAIL_BYTES))
    earlier = trailer_generation(tail)
    return earlier is not None and earlier < generation


def _write_over(descriptor: int, data: bytes) -> None:
    """``data`` from the start of the file, and nothing of what was there after it."""
    offset = 0
    while offset < len(data):
        offset += os.pwrite(descriptor, data[offset:], offset)
    os.ftruncate(descriptor, len(data))
