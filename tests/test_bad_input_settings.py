"""Bad settings answered well: variables set but empty or not understood, a relative state
directory, configuration files that are missing or cannot be reached, and state directories
the user may not write, each one ``error:`` line naming what to fix, at most one ``hint:``, a
documented exit code, no traceback and nothing written (:func:`tests.house_rules.refused`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from gpualloc.errors import ExitCode
from tests.cli_harness import Result, run_in_process
from tests.house_rules import refused
from tests.unix_users import in_process_as_nobody

Cli = Callable[..., Result]


# ---- a relative state directory --------------------------------------------------------------


def test_a_relative_state_dir_variable_is_refused(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GPUALLOC_STATE_DIR", "rel")
    result = cli("--topology", "dgx1-v100", "alloc", "-n", "1")
    refused(result, 15)
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
    refused(result, 15)
    assert "state_dir = 'rel': must be an absolute path" in result.stderr
    assert not (tmp_path / "rel").exists()


# ---- variables set but empty, or not understood ----------------------------------------------


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("GPUALLOC_TOPOLOGY", "", "GPUALLOC_TOPOLOGY is set but empty"),
        ("GPUALLOC_SYSTEM_CONFIG", "", "GPUALLOC_SYSTEM_CONFIG is set but empty"),
        ("GPUALLOC_SYSTEM_CONFIG", " ", "GPUALLOC_SYSTEM_CONFIG is set but empty"),
        ("GPUALLOC_NO_SLURM", "", "GPUALLOC_NO_SLURM is set but empty"),
        ("GPUALLOC_NO_SLURM", "bogus", "GPUALLOC_NO_SLURM = 'bogus': must be true or false"),
    ],
)
@pytest.mark.parametrize("command", [["status"], ["run", "-n", "1", "--", "true"]])
def test_a_variable_set_but_not_understood_is_exit_15(
    cli: Cli, monkeypatch: pytest.MonkeyPatch, variable: str, value: str, message: str,
    command: list[str],
) -> None:  # fmt: skip
    monkeypatch.setenv(variable, value)
    topology = [] if variable == "GPUALLOC_TOPOLOGY" else ["--topology", "dgx1-v100"]
    result = cli(*topology, *command)
    refused(result, 15)
    assert f"error: {message}" in result.stderr


def test_a_system_config_that_does_not_exist_is_exit_15(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A typo in GPUALLOC_SYSTEM_CONFIG would silently drop the host's limits."""
    (tmp_path / "etc").mkdir()
    monkeypatch.setenv("GPUALLOC_SYSTEM_CONFIG", str(tmp_path / "etc" / "confg.toml"))
    result = cli("--topology", "dgx1-v100", "status")
    refused(result, 15)
    assert "confg.toml, which does not exist" in result.stderr


@pytest.mark.parametrize(
    ("value", "ignored"), [("1", True), ("yes", True), ("0", False), ("false", False)]
)
def test_no_slurm_takes_the_boolean_spellings(value: str, ignored: bool) -> None:
    from gpualloc.slurm.job import slurm_job
    from gpualloc.topologies import load_bundled

    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "0", "GPUALLOC_NO_SLURM": value}
    assert (slurm_job(load_bundled("dgx1-v100"), env) is None) is ignored


# ---- a configuration file in a directory the user may not enter ------------------------------


def test_a_config_file_in_a_closed_directory_names_the_directory(closed_directory: Path) -> None:
    from tests.unix_users import UserCommandLine, ensure_user

    user = ensure_user("gpualloc-test-a")  # skips unless root
    closed = closed_directory
    cli = UserCommandLine(user)
    for args in (["--topology", "dgx1-v100", "status"], ["config", "show"]):
        result = cli(user, *args, env={"XDG_CONFIG_HOME": str(closed / "config")})
        assert result.returncode == ExitCode.IO, result.stderr  # as every file option
        assert result.stderr == (
            f"error: cannot read configuration file {closed}/config/gpualloc/config.toml: the "
            f"directory {closed} cannot be entered (no search permission)\n"
            "hint: give a path in a directory you may enter, or ask its owner for access\n"
        )
        assert result.stdout == ""


# ---- a state directory the user may not write ------------------------------------------------


def test_a_read_only_state_directory_is_named_as_such(
    world_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = world_dir / "state"
    state.mkdir()
    state.chmod(0o555)
    monkeypatch.setenv("GPUALLOC_STATE_DIR", str(state))
    monkeypatch.setenv("GPUALLOC_CACHE_DIR", str(world_dir / "cache"))
    (result,) = in_process_as_nobody([["--topology", "dgx1-v100", "alloc", "-n", "1"]], monkeypatch)
    refused(result, 8)
    assert f"the state directory {state} is read-only for you (root's, mode 0555)" in (
        result.stderr
    )
    assert "No such file" not in result.stderr and "chmod 0666" not in result.stderr
    assert f"'chmod 1777 {state}'" in result.stderr
    assert list(state.iterdir()) == []


def test_a_file_of_roots_is_roots_to_remove_once(
    world_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpualloc.ledger.shared_files import owner_or_root

    assert owner_or_root("root") == "root" and owner_or_root("alice") == "alice or root"
    state = world_dir / "state"
    state.mkdir()
    state.chmod(0o1777)
    monkeypatch.setenv("GPUALLOC_STATE_DIR", str(state))
    monkeypatch.setenv("GPUALLOC_CACHE_DIR", str(world_dir / "cache"))
    assert run_in_process(["--topology", "dgx1-v100", "alloc", "--hold"]).exit_code == 0
    (ledger,) = [p for p in state.glob("ledger@*.json") if ".good." not in p.name]
    ledger.unlink()
    os.mkfifo(ledger)
    (result,) = in_process_as_nobody([["--topology", "dgx1-v100", "status"]], monkeypatch)
    refused(result, 11)
    assert "is a FIFO (owned by root)" in result.stderr
    assert "root or root" not in result.stderr and ": root must remove it" in result.stderr
