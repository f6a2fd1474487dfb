"""Two real Unix users for the tests of a state directory shared between users (root only)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import pytest

USERS = ("gpualloc-test-a", "gpualloc-test-b")


def two_test_users() -> list[tuple[int, int]]:
    """(uid, gid) of two real Unix users, created with useradd when missing (root only)."""
    import pwd
    import shutil

    if os.geteuid() != 0:
        pytest.skip("creating two Unix users needs root (CI runs as root)")
    found = []
    for name in USERS:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            useradd = shutil.which("useradd")
            if useradd is None:
                pytest.skip("useradd is not installed")
            subprocess.run([useradd, "--no-create-home", "--shell", "/bin/false", name], check=True)
            entry = pwd.getpwnam(name)
        found.append((entry.pw_uid, entry.pw_gid))
    return found


def as_user(uid: int, gid: int, action: Callable[[], object]) -> None:
    """Run ``action`` in a forked child that has become the Unix user ``uid``."""
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
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, f"the action failed as uid {uid}"
