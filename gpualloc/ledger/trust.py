"""How far the host's ledger can be trusted, for ``status`` and ``doctor`` (issue 31, point 7).

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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpualloc.launcher.allocate import HostLedger

COOPERATIVE_WARNING = (
    "cooperative mode: every user who can write {path} can forge, delete or release "
    "another user's lease in it, or stall everyone by holding its lock; a host shared by "
    "several users needs the broker (README, 'Multi-user host')"
)


def trust_mode(host: HostLedger) -> tuple[str, str]:
    """(mode, one line): ``broker``, ``cooperative``, ``private`` or ``none`` (no ledger yet)."""
    if host.remote is not None:
        return "broker", f"kept by the broker at {host.remote.path}"
    if host.store is None:
        return "none", "no ledger on this host yet"
    path = host.store.directory.path
    try:
        mode = stat.S_IMODE(os.lstat(path).st_mode)
    except OSError:
        return "none", f"{path} cannot be read"
    if mode & 0o022:
        return "cooperative", COOPERATIVE_WARNING.format(path=path)
    return "private", f"{path} (mode {mode:04o}): only its owner writes it"


def several_users(host: HostLedger) -> bool:
    """Whether more than one user has written the shared-file ledger (good copies of several
    uids): then ``status`` repeats the cooperative warning."""
    if host.store is None:
        return False
    return len({copy.name.split(".")[-3] for copy in host.store.directory.good_copies()}) > 1


def broker_findings(host: HostLedger) -> list[tuple[str, str, str]]:
    """(where, severity, detail) of the broker's set-up as a client can see it."""
    assert host.remote is not None
    hello: dict[str, Any] = host.remote.client.call("hello")
    found = [
        (
            "broker",
            "ok",
            f"pid {hello['broker_pid']} (uid {hello['broker_uid']}), gpualloc "
            f"{hello['gpualloc']}, protocol {hello['protocol']}; {hello['waiting']} waiting; "
            f"you are uid {hello['you']['uid']}",
        )
    ]
    socket = host.remote.path
    found.append(_mode_finding(socket, 0o666, "socket", kind=stat.S_ISSOCK))
    directory = Path(hello["state_dir"])
    found.append(_mode_finding(directory, 0o755, "state directory", kind=stat.S_ISDIR))
    ledger = Path(hello["ledger"])
    if os.path.lexists(ledger):
        found.append(_mode_finding(ledger, 0o644, "ledger", kind=stat.S_ISREG))
    lock = ledger.with_suffix(".lock")
    if os.path.lexists(lock):
        found.append(_mode_finding(lock, 0o600, "lock", kind=stat.S_ISREG))
    return found


def _mode_finding(path: Path, wanted: int, what: str, *, kind: Any) -> tuple[str, str, str]:
    try:
        info = os.lstat(path)
    except OSError as exc:
        return (what, "problem", f"{path}: {exc.strerror}")
    mode = stat.S_IMODE(info.st_mode)
    if not kind(info.st_mode):
        return (what, "problem", f"{path} is not a {what}")
    if what != "socket" and mode & 0o022:
        return (what, "problem", f"{path} is mode {mode:04o}: others may write it")
    severity = "ok" if mode == wanted else "note"
    return (what, severity, f"{path} mode {mode:04o} (expected {wanted:04o})")
