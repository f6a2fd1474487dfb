"""Shared fixtures: an isolated environment for every test, recorded outputs, a CLI runner."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
RECORDED = FIXTURES / "topologies"


def recorded(name: str) -> str:
    """A recorded output without its provenance header (everything up to the first blank line)."""
    text = (RECORDED / name).read_text(encoding="utf-8")
    return text.split("\n\n", 1)[1]


@pytest.fixture(autouse=True)
def isolated_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No test reads the developer's cache or environment, or writes outside tmp_path."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("GPUALLOC_CACHE_DIR", str(cache))
    monkeypatch.setenv("GPUALLOC_STATE_DIR", str(tmp_path / "state"))
    for name in ("GPUALLOC_TOPOLOGY", "GPUALLOC_BANDWIDTH_TABLE", "GPUALLOC_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    return cache


@dataclass
class Result:
    exit_code: int
    stdout: str
    stderr: str


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    """Run ``gpualloc ARGS`` in this process through the real entry point."""
    from gpualloc.cli.main import run

    def invoke(*args: str) -> Result:
        capsys.readouterr()
        try:
            run(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        else:
            raise AssertionError("run() returned instead of exiting")
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return invoke
