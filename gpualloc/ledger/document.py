"""The ledger as JSON text: written only when it reads back, read with the records that cannot
be read left out (:mod:`.quarantine`).

:mod:`.store` writes and reads through these functions (so does :mod:`.owned_store`). A write
(:func:`written_ledger`) is the text every later reader will load: a ledger whose text would
not read back (a lone surrogate, which JSON writes as ``"\\udcff"`` and no strict reader
accepts; a value its schema refuses) is refused before any file is touched, so that no single
request can make the file unreadable. A read (:func:`read_ledger`) takes the fast path of one
strict decode; only a document that fails it is looked at closer: not JSON, a newer gpualloc's
(refused, never half-understood), or one with leases or waiters that cannot be read on their
own, which are left out and returned to be set aside (:mod:`.quarantine`).

A document ends as it begins, with its generation (:data:`TRAILER`, from schema 8 on): the store
rewrites its files in place (:mod:`.store`), and a writer stopped in the middle leaves the start
of its text over the end of the one before, which two different generations give away: such a
text is damaged, never read as a ledger. A file of an older gpualloc has no trailer; it was
written by truncating first, so it is whole or unreadable.
"""

from __future__ import annotations

import json
import re
import zlib

from gpualloc.errors import LedgerError
from gpualloc.ledger.quarantine import SetAside, Unreadable, convert, salvage, surrogate_at
from gpualloc.ledger.schema import SCHEMA_VERSION, Ledger
from gpualloc.model.validation import (
    DecodeError,
    ValidationError,
    decode_json,
    describe_validation_error,
    to_builtins,
)

HEADER = re.compile(r'^\{\s*"writer_uid":\s*(\d+),\s*"generation":\s*(\d+)')
"""The first bytes of every ledger written: who wrote it, which generation (see :mod:`.store`)."""
TRAILER = ',"generation_end":'
"""The last member of every ledger written (schema 8 on): the generation again. JSON escapes
every ``"`` inside a string, so these characters occur nowhere else in a document."""
CHECKSUM = ',"crc32":'
"""The member before :data:`TRAILER`: the CRC-32 of every byte before it. The two generations
catch a writer stopped midway (the start of a new text over the end of an old one); the
checksum also catches the mixtures a reader that takes no lock (``status``) can see while a
writer is at work, and the page order of a machine crash: an old start and end around a new
middle, whose generations agree."""
SPACED_CHECKSUM = re.compile(r',\s*"crc32"\s*:\s*\d+\s*$')
SPACED_TRAILER = re.compile(r',\s*"generation_end"\s*:\s*(\d+)\s*\}\s*$')


class LedgerFromNewerVersion(LedgerError):
    """The ledger was written by a newer gpualloc: refused, never recovered over."""


def ledger_text(ledger: Ledger, writer_uid: int) -> str:
    """The next generation of ``ledger``, as written (see :func:`written_ledger`)."""
    return written_ledger(ledger, writer_uid)[0]


def written_ledger(ledger: Ledger, writer_uid: int) -> tuple[str, Ledger]:
    """The next generation of ``ledger`` as written (its header first: :data:`HEADER`), and as
    the next reader reads it back. A ledger that would not read back (text that is not UTF-8,
    a value its schema refuses) is refused before any file is touched: :class:`LedgerError`,
    and ``ledger`` is left as it was. Without this check one such value, written once, made
    every later command of every user fail
    (tests/test_hostile_bytes.py::test_a_change_the_ledger_could_not_read_back_is_refused_and_nothing_is_written)."""
    before = (ledger.generation, ledger.writer_uid)
    ledger.generation += 1
    ledger.writer_uid = writer_uid
    data = to_builtins(ledger)
    head = {"writer_uid": data.pop("writer_uid"), "generation": data.pop("generation")}
    # Compact: json's C encoder, which indentation turns off (json.encoder uses c_make_encoder
    # only when indent is None)
    body = json.dumps({**head, **dict(sorted(data.items()))}, separators=(",", ":"))
    checksum = zlib.crc32(body[:-1].encode())
    text = f"{body[:-1]}{CHECKSUM}{checksum}{TRAILER}{ledger.generation}}}\n"
    try:
        # The read every later transaction makes (one pass of C), so that none of them fails.
        return text, decode_json(body, Ledger)
    except DecodeError as exc:
        ledger.generation, ledger.writer_uid = before
        where = surrogate_at(data)
        if where is not None:
            reason = f"{where}: text that is not UTF-8"
        elif isinstance(exc, ValidationError):
            reason = describe_validation_error(exc)
        else:
            reason = str(exc)
        raise LedgerError(
            f"this change was not written: the ledger would not read back ({reason}); the "
            "ledger is as it was",
            hint="this is a bug in gpualloc: report it with the command that made the change",
        ) from None


def parse_ledger(text: str, source: str) -> Ledger:
    """A ledger from its JSON text, any lease or waiter that cannot be read left out (see
    :func:`read_ledger`); :class:`LedgerError` if damaged or from a newer gpualloc."""
    return read_ledger(text, source)[0]


def read_ledger(text: str, source: str) -> tuple[Ledger, list[SetAside]]:
    """A ledger from its JSON text, and the leases and waiters left out of it because they
    cannot be read on their own (:mod:`.quarantine`); :class:`LedgerError` if damaged anywhere
    else, or from a newer gpualloc."""
    text = document_of(text, source)
    try:
        ledger = decode_json(text, Ledger)  # one pass of C for the common case
    except DecodeError:
        ledger = None
    if ledger is not None and ledger.schema_version <= SCHEMA_VERSION:
        ledger.schema_version = SCHEMA_VERSION  # every version since 1 only added defaults
        return ledger, []
    # Say why: not JSON, not a ledger, a newer gpualloc's, or the field that is wrong.
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LedgerError(f"{source} is not valid JSON (line {exc.lineno})") from None
    except RecursionError:  # nested deeper than any ledger is
        raise LedgerError(f"{source} is not a ledger (nested too deep)") from None
    if not isinstance(data, dict):
        raise LedgerError(f"{source} is not a ledger (a JSON object)")
    version = data.get("schema_version")
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise LedgerFromNewerVersion(
            f"{source} was written by a newer gpualloc (schema {version}; this one reads "
            f"{SCHEMA_VERSION})",
            hint="upgrade gpualloc on this host; every user must run the same version",
        )
    aside: list[SetAside] = []
    try:
        ledger = convert(data, Ledger)
    except Unreadable as problem:
        salvaged = salvage(data)
        if salvaged is None:
            raise LedgerError(f"{source} is not a valid ledger ({problem})") from None
        ledger, aside = salvaged
    ledger.schema_version = SCHEMA_VERSION
    return ledger, aside


def document_of(text: str, source: str, *, checksum: bool = False) -> str:
    """The JSON document ``text`` holds, without its checksum and trailer (:data:`TRAILER`,
    checked against the header); :class:`LedgerError` when the two generations differ or the end
    is not one: the start of one write over the end of another. ``checksum``: also when the
    text is not the one its checksum was made of (:data:`CHECKSUM`), as a reader without the
    lock must ask (a write may be at work); with the lock, no write is, and a text whose
    generations agree but whose checksum does not was edited by a (cooperative) user."""
    cut, end = text.rfind(TRAILER), ""
    if cut >= 0:
        end = text[cut + len(TRAILER) :].rstrip()
    elif '"generation_end"' in text:  # written with spaces (by hand, or a tool's re-indent)
        spaced = SPACED_TRAILER.search(text)
        if spaced is not None:
            cut, end = spaced.start(), f"{spaced.group(1)}}}"
    if cut < 0:
        return text  # written before schema 8, by truncating first
    header = HEADER.match(text)
    torn = LedgerError(
        f"{source} holds parts of two writes (a writer was stopped while it rewrote the file, "
        "or is at work now)"
    )
    if header is None or end != f"{header.group(2)}}}":
        raise torn
    body, found, written = text[:cut].rpartition(CHECKSUM)
    if not found:  # re-indented by a user or a tool, the checksum with it
        body, written = SPACED_CHECKSUM.sub("", text[:cut]), ""
    if checksum and (not written.isdigit() or zlib.crc32(body.encode()) != int(written)):
        raise torn
    return f"{body}}}"


def trailer_generation(tail: bytes) -> int | None:
    """The generation that the last bytes of a ledger file end with (:data:`TRAILER`); None
    when they end otherwise (a file of before schema 8, or no ledger)."""
    _, found, end = tail.rpartition(TRAILER.encode())
    end = end.rstrip()
    if not found or not end.endswith(b"}") or not end[:-1].isdigit():
        return None
    return int(end[:-1])


def parses(text: str) -> bool:
    """Whether ``text`` is one whole write (an unlocked reader may see one in progress)."""
    try:
        json.loads(document_of(text, "the ledger", checksum=True))
    except (ValueError, RecursionError, LedgerError):
        return False
    return True
