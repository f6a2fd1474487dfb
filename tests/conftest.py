"""Shared fixtures: an isolated environment for every test, recorded outputs, a CLI runner."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
SUMMARY: list[str] = []
"""Lines for the end of the test report (for example Slurm's choice next to gpualloc's)."""
RECORDED = FIXTURES / "topologies"


def recorded(name: str) -> str:
    """A recorded output without its provenance header (everything up to the first blank line)."""
    text = (RECORDED / name).read_text(encoding="utf-8")
    return text.split("\n\n", 1)[1]


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
    cache = tmp_path / "cache"
    monkeypatch.setenv("GPUALLOC_CACHE_DIR", str(cache))
    monkeypatch.setenv("GPUALLOC_STATE_DIR", str(tmp_path / "state"))
    # No configuration file of the developer's or the machine's: a fresh user on a bare host.
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("GPUALLOC_SYSTEM_CONFIG", str(tmp_path / "etc" / "config.toml"))
    for name in [n for n in os.environ if n.startswith("SLURM_") or n == "GPUALLOC_NO_SLURM"]:
        monkeypatch.delenv(name)  # a suite run inside a Slurm job must not act as a sub-job
    return cache


@dataclass
class Result:
    exit_code: int
    stdout: str
    stderr: str


def run_in_process(args: Iterable[str]) -> Result:
    """Run ``gpualloc ARGS`` in this process through the real entry point: its exit status and
    what it wrote (the ``cli`` fixture, and the fuzzing harness under its own alarm)."""
    from gpualloc.cli.main import run

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            run(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        else:
            raise AssertionError("run() returned instead of exiting")
    return Result(code, out.getvalue(), err.getvalue())


def benchmark_module(name: str) -> Iterator[Any]:
    """A module of ``benchmarks/`` (which is not a package), imported for the test's time."""
    import importlib

    benchmarks = str(Path(__file__).resolve().parent.parent / "benchmarks")
    sys.path.insert(0, benchmarks)
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(benchmarks)


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
def cli() -> Callable[..., Result]:
    """Run ``gpualloc ARGS`` in this process through the real entry point."""
    return lambda *args: run_in_process(args)


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
