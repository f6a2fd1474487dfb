"""Bad input answered well (issue 42): one ``error:`` line, at most one ``hint:``, a documented
exit code, no traceback, nothing written."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Result

Cli = Callable[..., Result]


def _refused(result: Result, code: int) -> None:
    """The answer to bad input: ``code``, one error line, at most one hint, no traceback."""
    assert result.exit_code == code, (result.exit_code, result.stderr)
    lines = result.stderr.splitlines()
    assert len([line for line in lines if line.startswith("error: ")]) == 1, lines
    assert len([line for line in lines if line.startswith("hint: ")]) <= 1, lines
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr


# ---- point 1: serve --socket -------------------------------------------------------------


@pytest.mark.parametrize("socket", ["", "   "])
def test_serve_refuses_an_empty_socket_path(cli: Cli, tmp_path: Path, socket: str) -> None:
    state = tmp_path / "broker-state"
    result = cli("--topology", "dgx1-v100", "serve", "--socket", socket, "--state-dir", str(state))
    _refused(result, 2)
    assert "--socket is empty" in result.stderr
    assert not state.exists()


def test_serve_refuses_a_socket_path_too_long_for_a_unix_socket(cli: Cli, tmp_path: Path) -> None:
    state = tmp_path / "broker-state"
    socket = tmp_path / ("s" * 200)
    result = cli(
        "--topology", "dgx1-v100", "serve", "--socket", str(socket), "--state-dir", str(state)
    )
    _refused(result, 2)
    assert "a Unix socket's path may have at most" in result.stderr
    assert not state.exists() and not socket.exists()


# ---- point 2: a relative state directory ---------------------------------------------------


def test_a_relative_state_dir_variable_is_refused(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GPUALLOC_STATE_DIR", "rel")
    result = cli("--topology", "dgx1-v100", "alloc", "-n", "1")
    _refused(result, 15)
    assert "GPUALLOC_STATE_DIR = 'rel': must be an absolute path" in result.stderr
    assert "hint: give an absolute path" in result.stderr
    assert not (tmp_path / "rel").exists()


def test_a_relative_state_dir_in_a_config_file_is_refused(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GPUALLOC_STATE_DIR")
    user_file = tmp_path / "config" / "gpualloc" / "config.toml"
    user_file.parent.mkdir(parents=True)
    user_file.write_text('state_dir = "rel"\n')
    result = cli("--topology", "dgx1-v100", "status")
    _refused(result, 15)
    assert "state_dir = 'rel': must be an absolute path" in result.stderr
    assert not (tmp_path / "rel").exists()
