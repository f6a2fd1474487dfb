"""Atomic file replacement: readers see the old file or the new one, never half of either."""

from __future__ import annotations

import os
from pathlib import Path


def write_text_atomic(path: Path, text: str, *, mode: int | None = None, sync: bool = True) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same directory, fsync, rename.
    ``mode`` sets the new file's permissions (default: the temporary file's 0600). Without
    ``sync`` there is no fsync: the rename still makes the change atomic for every process
    (a killed writer included), only a crash of the machine may lose it.

    Raises ``OSError`` (the temporary file is removed) when the directory is not writable.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    # What tempfile.mkstemp does, without importing tempfile (and shutil, random) on every
    # command's path: a new name nobody else can have opened, created 0600.
    temporary = path.with_name(f".{path.name}.{os.urandom(6).hex()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    descriptor = os.open(temporary, flags, 0o600)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            if mode is not None:
                os.fchmod(handle.fileno(), mode)
            handle.write(text)
            handle.flush()
            if sync:
                os.fsync(handle.fileno())
        temporary.replace(path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
