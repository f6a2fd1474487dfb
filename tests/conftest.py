"""Shared fixtures: an isolated environment for every test, a checkout left as it was found,
the ``extra`` marker, a CLI runner, real Unix users; the helpers they use are modules of their
own (``tests/cli_harness.py``, ``tests/checkout.py``, ``tests/unix_users.py``)."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.checkout import CHECKOUT, benchmark_module, missing_extra
from tests.cli_harness import Result, run_in_process
from tests.unix_users import UnixUser, UserCommandLine, ensure_user

SUMMARY: list[str] = []
"""Lines for the end of the test report (for example Slurm's choice next to gpualloc's)."""


@pytest.fixture(autouse=True)
def isolated_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No test reads the developer's cache or environment, or writes outside tmp_path."""
    from gpualloc.config import SETTINGS

    # Every setting's variable, from the one list of them: a new one cannot leak in unnoticed.
    for name in (
        "GPUALLOC_TOPOLOGY",
        "GPUALLOC_DEBUG",
        *(s.variable for s in SETTINGS if s.variable),
    ):
        monkeypatch.delenv(name, raising=False)
    # A COLUMNS the developer's shell exports would fit every piped table to it; a library
    # that sized a terminal may also have set one in the C environment alone (os.environ does
    # not see it, a child process inherits it).
    monkeypatch.delenv("COLUMNS", raising=False)
    os.unsetenv("COLUMNS")
    cache = tmp_path / "cache"
    monkeypatch.setenv("GPUALLOC_CACHE_DIR", str(cache))
    monkeypatch.setenv("GPUALLOC_STATE_DIR", str(tmp_path / "state"))
    # No configuration file of the developer's or the machine's: a fresh user on a bare host.
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg-state"))  # submitted jobs
    monkeypatch.setenv("GPUALLOC_SYSTEM_CONFIG", str(tmp_path / "etc" / "config.toml"))
    for name in [n for n in os.environ if n.startswith("SLURM_") or n == "GPUALLOC_NO_SLURM"]:
        monkeypatch.delenv(name)  # a suite run inside a Slurm job must not act as a sub-job
    return cache


CACHES = ("__pycache__", ".pytest_cache", ".hypothesis")
"""What Python, pytest and hypothesis write into the checkout by design (all git-ignored)."""


def checkout_changes() -> set[str] | None:
    """The checkout's untracked and ignored files as ``git status`` lists them, less the
    caches (not its changed files: a developer may edit while the tests run); None where the
    tests do not run from a git checkout (an unpacked sdist)."""
    try:
        done = subprocess.run(
            ["git", "--no-optional-locks", "status", "--porcelain", "--ignored"],
            cwd=CHECKOUT, capture_output=True, text=True, check=False, timeout=60,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return {
        line
        for line in done.stdout.splitlines()
        if line.startswith(("??", "!!")) and not any(cache in line for cache in CACHES)
    }


@pytest.fixture(autouse=True, scope="module")
def checkout_left_as_found() -> Iterator[None]:
    """No test writes into the checkout: a file left there changes what later tests see (a
    ``dgx1.json`` in it was among the file names bash completed for ``--topology dgx``) and
    stays in the developer's clone. Checked per test file, so that the failure names the file
    whose tests wrote it."""
    before = checkout_changes()
    yield
    after = checkout_changes()
    if before is not None and after is not None and after - before:
        new = "\n".join(sorted(after - before))
        pytest.fail(f"this test file left files in the checkout ({CHECKOUT}):\n{new}")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """``@pytest.mark.extra("plot")`` (``why=`` the line that needs it): skipped, saying what
    to install, without the extra.
    The README's ``pip install -e '.[test]' && python -m pytest`` then passes on a fresh clone,
    and ``.ci/run`` runs ``-m extra`` again once it has installed them."""
    for marker in item.iter_markers("extra"):
        for extra in marker.args:
            reason = missing_extra(extra)
            if reason:
                where = marker.kwargs.get("why")
                pytest.skip(f"{where} {reason}" if where else reason)


@pytest.fixture
def measured_benchmark() -> Iterator[Any]:
    """``benchmarks/measured.py``: the recordings' hosts as docs/evaluation.md models them."""
    yield from benchmark_module("measured")


@pytest.fixture
def world_dir() -> Iterator[Path]:
    """A directory every user may enter (pytest's tmp_path is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="gpualloc-test-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def closed_directory() -> Iterator[Path]:
    """A directory only its owner (root, in CI) may enter, in one every user may enter: for
    "cannot be entered" errors (pytest's tmp_path is not open to other users)."""
    base = Path(tempfile.mkdtemp(prefix="gpualloc-closed-", dir="/tmp"))
    base.chmod(0o755)
    closed = base / "closed"
    closed.mkdir(mode=0o700)
    yield closed
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def full_device(tmp_path: Path) -> Path:
    """A device every write to fails with ENOSPC (``/dev/full``'s numbers, 1:7), the test's
    own where it may make one. The machine's ``/dev/full`` is shared with every suite that runs
    beside this one, as root: one that renames a file onto it or removes it turns a shell's
    ``> /dev/full`` into a plain file that takes every write, and the test's verdict into a
    matter of when it ran."""
    device = tmp_path / "full"
    with contextlib.suppress(OSError):
        os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 7))
        os.close(os.open(device, os.O_WRONLY))  # a file system mounted nodev refuses it
        return device
    shared = Path("/dev/full")
    if not shared.is_char_device() or shared.stat().st_rdev != os.makedev(1, 7):
        pytest.skip("no full device: mknod is not allowed here and /dev/full is not one")
    return shared


@pytest.fixture
def cli() -> Callable[..., Result]:
    """Run ``gpualloc ARGS`` in this process through the real entry point."""
    return lambda *args: run_in_process(args)


@pytest.fixture(scope="module")
def users() -> dict[str, UnixUser]:
    """Three real Unix users, ``gpualloc-t-alice``, ``-bob`` and ``-carol`` (root only: skips
    otherwise), by their short names."""
    return {name: ensure_user(f"gpualloc-t-{name}") for name in ("alice", "bob", "carol")}


@pytest.fixture(scope="module")
def as_user(users: dict[str, UnixUser]) -> UserCommandLine:
    """``gpualloc`` as any of ``users`` runs it, a process of its own with their uid, on an
    interpreter alice was found to execute (``tests/unix_users.py``)."""
    return UserCommandLine(users["alice"])


@pytest.fixture
def summary() -> Callable[[str], None]:
    """Add a line to the section printed at the end of the run, whatever the outcome."""
    return SUMMARY.append


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove the Unix users the multi-user tests made (useradd as root, userdel after)."""
    from tests.unix_users import remove_created_users

    remove_created_users()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if SUMMARY:
        terminalreporter.section("gpualloc next to a real Slurm")
        for line in SUMMARY:
            terminalreporter.write_line(line)
