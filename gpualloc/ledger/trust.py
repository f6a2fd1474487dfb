"""How far the host's ledger can be trusted, for ``status`` and ``doctor``.

- **broker**: a broker (``gpualloc serve``) owns the ledger; the kernel names every caller and
  only the broker writes. ``doctor`` checks what it can see of that: the broker answers, its
  directory is its own (0755, nobody else may write it), the ledger is 0644, the lock 0600,
  the socket 0666.
- **cooperative**: the shared-file ledger in a directory other users may write (mode 1777, or
  2775 with a group): it keeps honest users from colliding, but any of them can forge, delete
  or release another's lease, or stall everyone by holding the lock. Said plainly, so that it
  is a choice, never an accident.
- **private**: the file ledger in a directory only its owner may write (one user, tests,
  ``--topology`` trials).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from gpualloc.ledger.statedir import StateDirectory

COOPERATIVE_WARNING = (
    "cooperative mode: every user who can write {path} can forge, delete or release "
    "another user's lease in it, or stall everyone by holding its lock; a host shared by "
    "several users needs the broker (docs/administration.md, 'Multi-user host: the broker')"
)


class Trust(NamedTuple):
    """How far a host's ledger can be trusted (module docstring)."""

    mode: str
    """``broker``, ``cooperative``, ``private`` or ``none`` (no ledger yet)."""
    detail: str
    several_writers: bool = False
    """Cooperative: more than one user has written the ledger (``status`` then warns)."""
    findings: tuple[tuple[str, str, str], ...] = ()
    """Broker, when asked for detail: (where, severity, detail) of its set-up (``doctor``)."""


NO_LEDGER = Trust("none", "no ledger on this host yet")


def directory_trust(directory: StateDirectory) -> Trust:
    """The trust of the file ledger in ``directory``."""
    path = directory.path
    try:
        mode = stat.S_IMODE(os.lstat(path).st_mode)
    except OSError:
        return Trust("none", f"{path} cannot be read")
    if mode & 0o022:
        writers = {copy.name.split(".")[-3] for copy in directory.good_copies()}
        return Trust("cooperative", COOPERATIVE_WARNING.format(path=path), len(writers) > 1)
    return Trust("private", f"{path} (mode {mode:04o}): only its owner writes it")


def broker_trust(socket: Path, hello: dict[str, Any] | None = None) -> Trust:
    """The trust of a broker's ledger; with its ``hello`` answer, the findings of its set-up
    as a client can see it."""
    findings = tuple(broker_findings(socket, hello)) if hello is not None else ()
    return Trust("broker", f"kept by the broker at {socket}", findings=findings)


def broker_findings(socket: Path, hello: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(where, severity, detail) of the broker's set-up as a client can see it."""
    found = [
        (
            "broker",
            "ok",
            f"pid {hello['broker_pid']} (uid {hello['broker_uid']}), gpualloc "
            f"{hello['gpualloc']}, protocol {hello['protocol']}; {hello['waiting']} waiting; "
            f"you are uid {hello['you']['uid']}",
        )
    ]
    owner = int(hello["broker_uid"])
    found.append(_mode_finding(socket.parent, 0o755, "socket directory", stat.S_ISDIR, owner))
    found.append(_mode_finding(socket, 0o666, "socket", stat.S_ISSOCK, owner))
    directory = Path(hello["state_dir"])
    found.append(_mode_finding(directory, 0o755, "state directory", stat.S_ISDIR, owner))
    ledger = Path(hello["ledger"])
    if os.path.lexists(ledger):
        found.append(_mode_finding(ledger, 0o644, "ledger", stat.S_ISREG, owner))
    lock = ledger.with_suffix(".lock")
    if os.path.lexists(lock):
        found.append(_mode_finding(lock, 0o600, "lock", stat.S_ISREG, owner))
    return found


def _mode_finding(
    path: Path, wanted: int, what: str, kind: Any, owner: int
) -> tuple[str, str, str]:
    """A problem when ``path`` is not a ``what``, is not ``owner``'s (the broker's: anyone
    else could change it under the broker), or others may write it."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        return (what, "problem", f"{path}: {exc.strerror}")
    mode = stat.S_IMODE(info.st_mode)
    if not kind(info.st_mode):
        return (what, "problem", f"{path} is not a {what}")
    if info.st_uid != owner:
        return (what, "problem", f"{path} belongs to uid {info.st_uid}, not the broker's {owner}")
    if what != "socket" and mode & 0o022:
        return (what, "problem", f"{path} is mode {mode:04o}: others may write it")
    severity = "ok" if mode == wanted else "note"
    return (what, severity, f"{path} mode {mode:04o} (expected {wanted:04o})")
