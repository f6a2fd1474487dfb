"""Where the ledger lives, and the checks made before gpualloc writes there.

Every user of a host must reach the same ledger, so it sits in one shared directory on local
disk: ``$GPUALLOC_STATE_DIR``, else ``/var/tmp/gpualloc``. ``/var/tmp`` is local, world-writable
with the sticky bit on every Linux host, and survives reboots (the leases in it do not, since
their processes are gone). Not ``$HOME`` (per user, often NFS) and not NFS at all: the ledger's
locks are ``flock`` locks, which NFS does not share reliably between hosts.

The first gpualloc to run creates the directory with mode 1777, like ``/tmp``: every user may
create files in it and only the owner of a file may rename or delete it. Administrators who want
it owned by root create it themselves (``install -d -m 1777 -o root -g root /var/tmp/gpualloc``,
or mode 2775 with a ``gpualloc`` group to admit only that group's users).

Safety checks, so that a root prolog cannot be tricked into writing elsewhere: the directory
must be a real directory (a symlink is refused, not followed), must not be writable by others
without the sticky bit, and for root it must be owned by root; every file inside is opened with
``O_NOFOLLOW``. gpualloc is cooperative, like ``flock``: a user who can write the ledger can
also lie in it. It keeps honest users from colliding; it is not a sandbox.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from msgspec import Struct

from gpualloc.config import Config
from gpualloc.errors import FileAccessError, LedgerError
from gpualloc.user_files import shown_path

STATE_DIR_VARIABLE = "GPUALLOC_STATE_DIR"
SHARED_DIR_MODE = 0o1777


class StateDirectory(Struct, frozen=True):
    """A checked state directory, and which ledger in it a command uses.

    ``scope`` is None for the host's own ledger (``ledger.json``). Recorded and bundled
    topologies that do not describe this host get a ledger of their own
    (``ledger@<scope>.json``), so that trying gpualloc on ``--topology dgx1-v100`` never marks
    this host's real GPUs as held.
    """

    path: Path
    scope: str | None = None

    @property
    def _stem(self) -> str:
        return "ledger" if self.scope is None else f"ledger@{self.scope}"

    @property
    def ledger_file(self) -> Path:
        return self.path / f"{self._stem}.json"

    @property
    def lock_file(self) -> Path:
        return self.path / f"{self._stem}.lock"

    @property
    def journal_file(self) -> Path:
        """Root's journal (:mod:`.journal`)."""
        return self.path / f"{self._stem}.root-journal.json"

    @property
    def journal_lock(self) -> Path:
        return self.path / f"{self._stem}.root-journal.lock"

    def good_copy(self, uid: int) -> Path:
        """This user's copy of the last ledger it wrote (see :mod:`.store`)."""
        return self.path / f"{self._stem}.{uid}.good.json"

    def good_copies(self) -> list[Path]:
        import glob  # Path.glob needs only fnmatch; glob.escape is this module's

        return sorted(
            copy
            for copy in self.path.glob(f"{glob.escape(self._stem)}.*.good.json")
            if copy.name[len(self._stem) + 1 : -len(".good.json")].isdigit()
        )

    def quarantine_file(self, uid: int) -> Path:
        """Where this user keeps the ledger's records that could not be read
        (:mod:`.quarantine`)."""
        return self.path / f"{self._stem}.{uid}.quarantine.jsonl"

    def lease_lock(self, lease_id: str) -> Path:
        return self.path / f"lease-{lease_id}.lock"

    def lease_locks(self) -> list[Path]:
        """Every lease lock file in the directory, of every scope."""
        return sorted(self.path.glob("lease-*.lock"))

    def temporary_files(self) -> list[Path]:
        """The temporary files of atomic writes (:func:`gpualloc.atomic.write_text_atomic`) of
        this scope's files that are written under its ledger lock: the ledger, the good copies
        and the quarantine files. A writer renames its own before it lets the lock go, so one
        found while holding the lock is the litter of a writer that was killed. Other scopes'
        files, and root's journal (under a lock of its own), are not named."""
        import glob

        prefix = f".{self._stem}."
        found = []
        for path in self.path.glob(f"{glob.escape(prefix)}*.tmp"):
            target, _, token = path.name[len(prefix) : -len(".tmp")].rpartition(".")
            if len(token) != 12 or token.strip("0123456789abcdef"):
                continue
            uid, _, kind = target.partition(".")
            if target == "json" or (uid.isdigit() and kind in ("good.json", "quarantine.jsonl")):
                found.append(path)
        return sorted(found)

    def scoped(self, scope: str | None) -> StateDirectory:
        return StateDirectory(self.path, scope)


class StateDirectoryMissing(LedgerError):
    """The state directory does not exist (yet): nothing was ever allocated on this host."""


def state_directory_path() -> Path:
    """``$GPUALLOC_STATE_DIR`` if set, else ``state_dir`` of config.toml, else the default."""
    return Config.load().value("state_dir")


def open_state_directory(path: Path | None = None, *, create: bool = True) -> StateDirectory:
    """Check (and if needed create) the state directory; raise :class:`LedgerError` if unsafe."""
    path = (path or state_directory_path()).absolute()
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        if not create:
            raise StateDirectoryMissing(
                f"state directory {shown_path(path)} does not exist",
                hint=f"run any gpualloc command that allocates, or set {STATE_DIR_VARIABLE}",
            ) from None
        _create(path)
        info = os.lstat(path)
    except OSError as exc:
        raise FileAccessError(
            f"cannot inspect state directory {shown_path(path)}: {exc.strerror}",
            hint=f"set {STATE_DIR_VARIABLE} to a directory on local disk you can write",
        ) from exc
    check_state_directory(path, info, uid=os.geteuid())
    return StateDirectory(path)


def _create(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        if os.lstat(path).st_uid == os.geteuid():
            path.chmod(SHARED_DIR_MODE)
    except OSError as exc:
        raise FileAccessError(
            f"cannot create state directory {shown_path(path)}: {exc.strerror}",
            hint=f"ask an administrator to run 'install -d -m 1777 {shown_path(path)}', or set "
            f"{STATE_DIR_VARIABLE} to a directory all users of this host can write",
        ) from exc


def check_state_directory(path: Path, info: os.stat_result, *, uid: int) -> None:
    """The safety rules of the module docstring, for the user ``uid``."""
    if stat.S_ISLNK(info.st_mode):
        raise LedgerError(
            f"state directory {shown_path(path)} is a symbolic link; gpualloc does not follow it",
            hint=f"point {STATE_DIR_VARIABLE} at the real directory",
        )
    if not stat.S_ISDIR(info.st_mode):
        raise LedgerError(
            f"state directory {shown_path(path)} is not a directory",
            hint=f"remove it or set {STATE_DIR_VARIABLE} elsewhere",
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
        raise LedgerError(
            f"state directory {shown_path(path)} is writable by everyone without the sticky bit "
            f"(mode {mode:04o}): any user could replace the ledger",
            hint=f"chmod 1777 {shown_path(path)} (or 2775 with a shared group)",
        )
    if uid == 0 and info.st_uid != 0:
        shown = shown_path(path)
        raise LedgerError(
            f"state directory {shown} is owned by uid {info.st_uid}, and root uses only a "
            "directory owned by root",
            hint=f"as root: chown root:root {shown} && chmod 1777 {shown}",
        )


BROKER_DIR_MODE = 0o755


def open_broker_directory(path: Path) -> StateDirectory:
    """The broker's own state directory (``gpualloc serve``, :mod:`gpualloc.broker`): created
    with mode 0755 when missing; otherwise it must be a real directory of the broker's user
    that nobody else may write, or the broker refuses to start (a directory a user made first,
    or could write, would let that user plant or replace what root's broker trusts)."""
    path = path.absolute()
    uid = os.geteuid()
    try:
        path.mkdir(parents=True, mode=BROKER_DIR_MODE)
        path.chmod(BROKER_DIR_MODE)  # the umask may have narrowed it
    except FileExistsError:
        pass
    except OSError as exc:
        raise FileAccessError(
            f"cannot create the broker's state directory {shown_path(path)}: {exc.strerror}",
            hint="run gpualloc serve as root, or give --state-dir a directory it may create",
        ) from exc
    info = os.lstat(path)
    shown = shown_path(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise LedgerError(
            f"the broker's state directory {shown} is not a directory (a symbolic link is not "
            "followed)",
            hint="remove it, or give --state-dir another path",
        )
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid != uid or mode & 0o022:
        owner = _owner(info.st_uid)
        raise LedgerError(
            f"the broker's state directory {shown} belongs to {owner} with mode {mode:04o}; the "
            f"broker keeps its ledger only in a directory of its own user that no one else "
            "may write",
            hint=f"chown {_owner(uid)} {shown} && chmod 0755 {shown} (after checking what is in "
            "it), or give --state-dir a new path",
        )
    return StateDirectory(path)


def _owner(uid: int) -> str:
    from gpualloc.ledger.shared_files import owner_name

    return owner_name(uid)
