"""Reading the files a user names (a topology, a bandwidth table, a trace, a pattern, a config
file) so that nothing named can hang or exhaust gpualloc.

``/dev/zero`` read whole grows without end; a FIFO blocks its opener until a writer comes; a
directory or a socket is no document. So every such file is opened without blocking
(``O_NONBLOCK``: a FIFO opens at once), checked with ``fstat`` on the descriptor (a regular file
only: the object opened, not the name, so nothing can be swapped in between), and read to at
most :data:`MAX_BYTES`. Each refusal is one error naming the file and what it is.

One rule for the exit code, whichever option named the file: a file whose bytes could not be
had (missing, not permitted, not a regular file, too large, a read that failed) is a
:class:`~gpualloc.errors.FileAccessError` (exit 8), and only a missing topology is its own
(``TopologyNotFound``, exit 3: the name may be a misspelt bundled one); bytes read that the
reader cannot understand (not UTF-8, then not the format) are the document's own error, a trace
exit 14, a configuration file 15 (``tests/test_user_files.py`` holds every file-taking option to
this).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gpualloc.errors import FileAccessError, GpuallocError, RequestError

MAX_BYTES = 64 * 2**20
"""The largest file gpualloc reads: 64 MiB. A 16-GPU ``nvidia-smi topo -m`` is about 10 kB, a
16,000-GPU topology JSON about 50 MB, the Alibaba 2023 trace (8,152 jobs) 1.2 MB."""


MAX_SHOWN = 120
"""An error names the file or repeats the value as given; a longer one (a 5,000-character
argument) is cut in the middle to this many characters, its start and its end (a file's name)
kept. Its control characters are escaped where every error is written
(:func:`gpualloc.cli.output.write_error`)."""


def shown_text(text: str) -> str:
    """``text`` a user gave, for an error line: see :data:`MAX_SHOWN`."""
    if len(text) <= MAX_SHOWN:
        return text
    return f"{text[:60]}...{text[3 + 60 - MAX_SHOWN :]}"


def shown_path(path: Path | str) -> str:
    """``path`` for an error line: see :data:`MAX_SHOWN`."""
    return shown_text(str(path))


def shown_value(value: object) -> str:
    """``value`` quoted for an error line (as ``repr`` quotes it), cut as :func:`shown_text`
    cuts it."""
    return repr(shown_text(str(value)))


def shown_repr(value: object) -> str:
    """``repr(value)`` for an error line (a value of any type a client sent), cut as
    :func:`shown_text` cuts it."""
    return shown_text(repr(value))


def json_document(text: str) -> Any:
    """``json.loads(text)``; a document nested deeper than Python recurses is a
    ``json.JSONDecodeError`` too, not a RecursionError no reader expects
    (tests/test_fuzz_findings.py::test_json_nested_too_deep_is_said_so)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("nested too deep", text[:100], 0) from None


def names_a_file(path: Path) -> bool:
    """Whether ``path`` is a regular file (following links), False for anything that cannot be
    asked: a name too long (ENAMETOOLONG), a directory we may not search (EACCES). pathlib
    raises those from ``is_file()``
    (tests/test_user_files.py::test_a_name_too_long_for_the_file_system_is_not_found)."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def why_not_a_file(path: Path, what: str) -> FileAccessError:
    """The error for a ``path`` that :func:`names_a_file` refused, in the words
    :func:`read_user_bytes` would use: missing, behind a closed directory, or a FIFO (a shell's
    ``<(...)``), directory or device."""
    error = FileAccessError
    shown = shown_path(path)
    try:
        info = path.stat()
    except FileNotFoundError:
        return error(f"{what} {shown} does not exist", hint="check the path")
    except (OSError, ValueError) as exc:
        closed = _closed_directory(path) if isinstance(exc, PermissionError) else None
        if closed is not None:
            return error(
                f"cannot read {what} {shown}: the directory {shown_path(closed)} cannot be "
                "entered (no search permission)",
                hint="give a path in a directory you may enter, or ask its owner for access",
            )
        return error(f"cannot read {what} {shown}: {getattr(exc, 'strerror', None) or exc}")
    return _not_a_regular_file(what, shown, info.st_mode)


def names_anything(path: Path) -> bool:
    """Whether something is at ``path`` (see :func:`names_a_file`)."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def refuse_overwriting_inputs(
    output: Path | None, inputs: Iterable[Path | str | None], option: str = "-o"
) -> None:
    """Refuse, before anything is read or written, an ``output`` that is one of the command's
    ``inputs``: ``topo import same.txt -o same.txt`` replaced the recording with JSON. The
    same file, not the same name: device and inode, as ``os.path.samefile`` compares them, so
    a link, a hard link or ``./same.txt`` counts. Only regular files: a terminal or
    ``/dev/stdout`` may be both read and written. ``-`` (stdin) and None are no files."""
    if output is None:
        return
    try:
        written = Path(output).stat()
    except (OSError, ValueError):
        return  # a new file, or one the write will say it cannot make
    if not stat.S_ISREG(written.st_mode):
        return
    for path in inputs:
        if path is None or str(path) == "-":
            continue
        try:
            read = Path(path).stat()
        except (OSError, ValueError):
            continue  # its reader says what is wrong with it
        if (read.st_dev, read.st_ino) == (written.st_dev, written.st_ino):
            same = "" if str(path) == str(output) else f" ({shown_path(path)})"
            raise RequestError(
                f"{option} {shown_path(output)} is an input of this command{same}: writing "
                "it would overwrite what it reads"
            )


def expand_user(text: str) -> Path:
    """``~/x`` and ``~alice/x`` as the shell reads them; ValueError naming a ``~user`` that does
    not exist (pathlib raises RuntimeError there:
    tests/test_user_files.py::test_a_tilde_of_no_user_is_an_error_not_a_crash)."""
    try:
        return Path(text).expanduser()
    except RuntimeError:
        user = text[1:].split("/", 1)[0]
        first = text.split("/", 1)[0]
        raise ValueError(f"there is no user {shown_value(user)} for {shown_value(first)}") from None


def _closed_directory(path: Path | str) -> Path | None:
    """The first directory above ``path`` this process may not enter (search), if any: then
    whether the file exists is unknown, and "Permission denied" would blame the file."""
    effective = os.access in os.supports_effective_ids
    for directory in reversed(Path(path).absolute().parents):
        try:
            if not os.access(directory, os.X_OK, effective_ids=effective):
                return directory
        except (OSError, ValueError):
            return None
    return None


def read_user_text(
    path: Path | str,
    what: str,
    *,
    error: type[GpuallocError] = FileAccessError,
    missing: type[GpuallocError] | None = None,
    replace_bad_bytes: bool = False,
    max_bytes: int = MAX_BYTES,
) -> str:
    """The text of the file at ``path`` (``what`` names it in errors: "topology file").

    Raises what :func:`read_user_bytes` raises when the file cannot be read, and ``error`` (the
    document's kind) when it is not UTF-8 text (unless ``replace_bad_bytes``: recorded command
    output may carry stray bytes)."""
    data = read_user_bytes(path, what, missing=missing, max_bytes=max_bytes)
    shown = shown_path(path)
    try:
        return data.decode("utf-8", errors="replace" if replace_bad_bytes else "strict")
    except UnicodeDecodeError as exc:
        raise error(
            f"{what} {shown} is not UTF-8 text (byte {exc.start} is 0x{data[exc.start]:02x})",
            hint=f"give a {what} as text; is this the right file?",
        ) from None


def read_user_bytes(
    path: Path | str,
    what: str,
    *,
    missing: type[GpuallocError] | None = None,
    max_bytes: int = MAX_BYTES,
) -> bytes:
    """The bytes of a regular file of at most ``max_bytes``. Raises ``missing`` (else
    :class:`~gpualloc.errors.FileAccessError`) when it does not exist, and FileAccessError when
    it is not a regular file, is larger than ``max_bytes`` or cannot be read."""
    error = FileAccessError
    shown = shown_path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise (missing or error)(f"{what} {shown} does not exist", hint="check the path") from None
    except OSError as exc:
        closed = _closed_directory(path) if isinstance(exc, PermissionError) else None
        if closed is not None:  # the file may not even exist: say what is known
            raise error(
                f"cannot read {what} {shown}: the directory {shown_path(closed)} cannot be "
                "entered (no search permission)",
                hint="give a path in a directory you may enter, or ask its owner for access",
            ) from None
        raise error(f"cannot read {what} {shown}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _not_a_regular_file(what, shown, info.st_mode)
        if info.st_size > max_bytes:
            raise error(
                f"{what} {shown} is {info.st_size / 2**20:.0f} MiB, more than the "
                f"{max_bytes / 2**20:.0f} MiB gpualloc reads",
                hint="is this the right file?",
            )
        chunks, size = [], 0
        while size <= max_bytes:  # a file that grows while read stops at the limit too
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > max_bytes:
            raise error(
                f"{what} {shown} grew past the {max_bytes / 2**20:.0f} MiB gpualloc reads",
                hint="is this the right file?",
            )
        return b"".join(chunks)
    except OSError as exc:
        raise error(f"cannot read {what} {shown}: {exc.strerror}") from None
    finally:
        os.close(fd)


def _not_a_regular_file(what: str, shown: str, mode: int) -> FileAccessError:
    """A FIFO (a shell's ``<(...)``), a device or a directory where a file was expected."""
    if stat.S_ISDIR(mode):
        hint = f"name the {what} itself, not a directory"
    else:  # read whole, a FIFO blocks or a device never ends (the module's docstring)
        hint = "gpualloc reads regular files only: save it to a file first (e.g. 'cmd > file')"
    return FileAccessError(
        f"{what} {shown} is a {describe_kind(mode)}, not a regular file", hint=hint
    )


def describe_kind(mode: int) -> str:
    """What an ``st_mode`` is, in words: "FIFO", "directory", "regular file", ..."""
    for test, name in (
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISDIR, "directory"),
        (stat.S_ISLNK, "symbolic link"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
    ):
        if test(mode):
            return name
    return "regular file" if stat.S_ISREG(mode) else "special file"
