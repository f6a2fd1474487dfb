"""Real Unix users for the tests of a state directory shared between users (root only).

Users are made with ``useradd`` when missing and removed with ``userdel`` when the session ends
(:func:`remove_created_users`, called by ``conftest.py``): multi-user behaviour is tested with
real uids, never faked ones.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import site
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.child_processes import read_all, reap

USERS = ("gpualloc-test-a", "gpualloc-test-b")
ROOT = Path(__file__).resolve().parent.parent
CREATED: list[str] = []
"""Users this session made, removed at its end."""
MIRRORS: list[Path] = []
"""World-readable copies of gpualloc and its dependencies this session made (see
:class:`UserCommandLine`), removed at its end."""
_NOT_NEEDED = ("matplotlib*", "numpy*", "PIL", "pillow*", "fontTools", "kiwisolver*",
               "contourpy*", "hypothesis*", "_pytest", "pytest*", "pip", "pip-*", "setuptools*",
               "ruff*", "__pycache__", "*.pyc")  # fmt: skip
"""What the command line never imports: left out of the mirror to keep copying it quick."""


@dataclass(frozen=True)
class UnixUser:
    name: str
    uid: int
    gid: int


def ensure_user(name: str) -> UnixUser:
    """The Unix user ``name``, created when missing (root only; skips otherwise)."""
    import pwd

    if os.geteuid() != 0:
        pytest.skip("creating Unix users needs root (CI runs as root)")
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        useradd = shutil.which("useradd")
        if useradd is None:
            pytest.skip("useradd is not installed")
        subprocess.run(
            [useradd, "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            check=True,
            timeout=120,
        )
        CREATED.append(name)
        entry = pwd.getpwnam(name)
    return UnixUser(name, entry.pw_uid, entry.pw_gid)


def remove_created_users() -> None:
    userdel = shutil.which("userdel")
    while CREATED and userdel:
        subprocess.run([userdel, CREATED.pop()], check=False, capture_output=True, timeout=120)
    while MIRRORS:
        shutil.rmtree(MIRRORS.pop(), ignore_errors=True)


def two_test_users() -> list[tuple[int, int]]:
    """(uid, gid) of two real Unix users."""
    return [(user.uid, user.gid) for user in map(ensure_user, USERS)]


def as_user(uid: int, gid: int, action: Callable[[], object]) -> None:
    """Run ``action`` in a forked child that has become the Unix user ``uid``."""
    wait_for_user(start_as_user(uid, gid, action), uid)


USER_ACTION_S = 600.0
"""The longest a user's action may take (the longest is a share of the broker fuzzer's
requests): a deadline, not an estimate."""


def _import_all_where_private() -> None:
    """Where the checkout lies in a directory only root can enter (a clone in a ``mktemp -d``
    directory), a forked user could not import what gpualloc imports lazily: every module is
    imported before the fork instead. Files read at run time (bundled topologies) are the
    test's to read before it forks."""
    package = ROOT / "gpualloc"
    if PRELOADED or all(d.stat().st_mode & 0o001 for d in (package, *package.parents)):
        return
    import importlib
    import pkgutil

    import gpualloc

    for module in pkgutil.walk_packages(gpualloc.__path__, "gpualloc."):
        if not module.name.endswith("__main__"):
            with contextlib.suppress(Exception):  # an extra's module (matplotlib) may not load
                importlib.import_module(module.name)
    PRELOADED.append(True)


PRELOADED: list[bool] = []


def start_as_user(uid: int, gid: int, action: Callable[[], object]) -> int:
    """Start ``action`` in a forked child that becomes the Unix user ``uid``; its pid (several
    users at once: :func:`wait_for_user` each). The child exits 0 when ``action`` returns, 1
    with the traceback on stderr when it raises."""
    _import_all_where_private()
    pid = os.fork()
    if pid == 0:
        code = 1
        # Line-buffered streams on the real descriptors: what the action prints must survive
        # os._exit, which flushes nothing.
        sys.stdout = os.fdopen(os.dup(1), "w", buffering=1)
        sys.stderr = os.fdopen(os.dup(2), "w", buffering=1)
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            # The user's own (absent) configuration, not root's test directories.
            os.environ["XDG_CONFIG_HOME"] = f"/nonexistent/gpualloc-test-{uid}"
            os.environ["GPUALLOC_SYSTEM_CONFIG"] = "/nonexistent/gpualloc-system.toml"
            action()
            code = 0
        except BaseException:
            import traceback

            # Straight to the file descriptor: buffered writes die with os._exit.
            os.write(2, traceback.format_exc().encode())
        finally:
            os._exit(code)
    return pid


def wait_for_user(pid: int, uid: int, *, timeout_s: float = USER_ACTION_S) -> None:
    """Wait for a child :func:`start_as_user` started; fail if its action failed or has not
    ended within ``timeout_s`` (it is killed then)."""
    status = reap(pid, timeout_s=timeout_s)
    assert os.waitstatus_to_exitcode(status) == 0, f"the action failed as uid {uid}"


# ---- the real command line, as another user ---------------------------------------------------


def _mirror() -> list[str]:
    """A world-readable copy of gpualloc and of this environment's site-packages; the
    ``PYTHONPATH`` entries that import them."""
    if not MIRRORS:
        mirror = Path(tempfile.mkdtemp(prefix="gpualloc-test-python-", dir="/tmp"))
        mirror.chmod(0o755)
        MIRRORS.append(mirror)
        ignore = shutil.ignore_patterns(*_NOT_NEEDED)
        shutil.copytree(ROOT / "gpualloc", mirror / "gpualloc", ignore=ignore)
        for number, packages in enumerate(site.getsitepackages()):
            if Path(packages).is_dir():
                shutil.copytree(packages, mirror / f"site-{number}", ignore=ignore)
        for path in mirror.rglob("*"):
            path.chmod(0o755 if path.is_dir() else path.stat().st_mode | 0o444)
    mirror = MIRRORS[0]
    return [str(mirror), *sorted(str(p) for p in mirror.glob("site-*"))]


def shared_directory(prefix: str) -> Path:
    """A new directory as an administrator makes the state directory: owned by root, mode 1777
    (``install -d -m 1777 -o root -g root``), somewhere every user can reach."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    os.chown(path, 0, 0)
    path.chmod(0o1777)
    return path


class UserCommandLine:
    """Runs ``gpualloc`` as real users, each a separate process with that uid.

    The interpreter must be one every user may execute: the test's own when it is (a system
    Python), else the system's Python of the same version, which then imports gpualloc and its
    dependencies from this checkout and this environment's site-packages (one ABI). Where the
    checkout or the environment lies in a directory only root can enter (a clone in a
    ``mktemp -d`` directory, a virtual environment under /root), they are copied to a
    world-readable directory first, so that the tests run wherever CI clones. Skips, with the
    reason, only where no Python of this version is executable by other users at all.
    """

    def __init__(self, probe_user: UnixUser, *, system_config: Path | None = None) -> None:
        self.system_config = system_config or Path("/nonexistent/gpualloc-system.toml")
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        candidates = (sys.executable, f"/usr/bin/python{version}")
        for paths in ([str(ROOT), *site.getsitepackages()], None):
            self.python_path = os.pathsep.join(paths or _mirror())
            for candidate in candidates:
                try:
                    probe = self._run(probe_user, [candidate, "-c", "import gpualloc.cli.main"], {})
                except OSError:  # EACCES: in a directory the user may not enter
                    continue
                if probe.returncode == 0:
                    self.python = candidate
                    return
        pytest.skip(f"no Python {version} that other users may execute ({', '.join(candidates)})")

    def _run(
        self,
        user: UnixUser,
        argv: Sequence[str],
        env: dict[str, str],
        *,
        timeout_s: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv),
            env=self._environment(user, env),
            user=user.uid,
            group=user.gid,
            extra_groups=[],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd="/",
            check=False,
        )

    def _environment(self, user: UnixUser, extra: dict[str, str]) -> dict[str, str]:
        """A bare environment of the user's own: none of root's test settings leak in."""
        return {
            "PATH": "/usr/bin:/bin:/usr/sbin:/sbin",
            "PYTHONPATH": self.python_path,
            "HOME": "/nonexistent",
            "XDG_CONFIG_HOME": f"/nonexistent/gpualloc-test-{user.uid}",
            "GPUALLOC_SYSTEM_CONFIG": str(self.system_config),
            "GPUALLOC_CACHE_DIR": f"/tmp/gpualloc-test-cache-{user.uid}",
            "LC_ALL": "C.UTF-8",
            **extra,
        }

    def argv(self, *args: str) -> list[str]:
        return [self.python, "-m", "gpualloc", *args]

    def __call__(
        self, user: UnixUser, *args: str, env: dict[str, str] | None = None, timeout_s: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return self._run(user, self.argv(*args), env or {}, timeout_s=timeout_s)

    def popen(self, user: UnixUser, *args: str, env: dict[str, str]) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.argv(*args),
            env=self._environment(user, env),
            user=user.uid,
            group=user.gid,
            extra_groups=[],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd="/",
        )


# ---- gpualloc in this process, as nobody ------------------------------------------------------


def in_process_as_nobody(
    commands: Sequence[list[str]],
    monkeypatch: pytest.MonkeyPatch,
    environments: Sequence[dict[str, str]] = (),
) -> list[Any]:
    """``gpualloc ARGS`` for each of ``commands`` (with the variables of ``environments``, one
    mapping a command, when given), in a forked child that became ``nobody``: each
    :class:`tests.cli_harness.Result`. The modules they need are imported first, as root (the
    interpreter may lie where nobody reads), by running each command once in a scratch state
    directory."""
    import json
    import pwd
    import traceback

    from tests.cli_harness import Result, run_in_process
    from tests.fuzz_harness import environment

    if os.geteuid() != 0:
        pytest.skip("becoming another user needs root")
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody")
    package = ROOT / "gpualloc"
    if any(not d.stat().st_mode & 0o001 for d in (package, *package.parents)):
        pytest.skip("nobody cannot reach this checkout (a private directory above it)")
    settings: list[dict[str, str | None]] = [*environments] or [{} for _ in commands]

    with monkeypatch.context() as scratch, tempfile.TemporaryDirectory() as state:
        scratch.setenv("GPUALLOC_STATE_DIR", state)
        for args, values in zip(commands, settings, strict=True):
            with environment(values):
                run_in_process(args)
    import contextvars  # noqa: F401  (imported late by the ledger's lock wait)

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        code = 1
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            os.environ["XDG_CONFIG_HOME"] = "/nonexistent/gpualloc-test"  # none of root's
            os.environ["GPUALLOC_SYSTEM_CONFIG"] = "/nonexistent/gpualloc-system.toml"
            done = []
            for args, values in zip(commands, settings, strict=True):
                with environment(values):
                    done.append(run_in_process(args).__dict__)
            os.write(write, json.dumps(done).encode())
            code = 0
        except BaseException:
            os.write(2, traceback.format_exc().encode())
        finally:
            os._exit(code)
    os.close(write)
    try:
        text = read_all(read, timeout_s=120)
    finally:
        status = reap(pid)
    assert os.waitstatus_to_exitcode(status) == 0
    return [Result(**x) for x in json.loads(text)]
