"""Configuration files: precedence flag > environment > user file > system file > default."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpualloc.errors import ExitCode

TOPOLOGY = ("--topology", "dgx1-v100")


@pytest.fixture
def files(tmp_path: Path):
    """Write the user's and the system's config.toml (the conftest points gpualloc at both)."""
    user = Path(os.environ["XDG_CONFIG_HOME"]) / "gpualloc" / "config.toml"
    system = Path(os.environ["GPUALLOC_SYSTEM_CONFIG"])

    def write(*, user_text: str | None = None, system_text: str | None = None) -> None:
        for path, text in ((user, user_text), (system, system_text)):
            if text is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)

    write.user, write.system = user, system  # type: ignore[attr-defined]
    return write


def _policy(cli, *flags: str) -> str:
    result = cli(*TOPOLOGY, "plan", "-n", "2", "--json", *flags)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)["policy"]


def _shown(cli) -> dict[str, dict]:
    result = cli("config", "show", "--json")
    assert result.exit_code == 0, result.stderr
    return {entry["key"]: entry for entry in json.loads(result.stdout)["settings"]}


def test_each_layer_overrides_the_one_below(cli, files, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _policy(cli) == "mapa" and _shown(cli)["policy"]["source"] == "default"
    files(system_text='policy = "drb"\n')
    assert _policy(cli) == "drb"
    assert _shown(cli)["policy"]["source"] == str(files.system)
    files(user_text='policy = "pack"\n')
    assert _policy(cli) == "pack" and _shown(cli)["policy"]["source"] == str(files.user)
    monkeypatch.setenv("GPUALLOC_POLICY", "spread")
    assert _policy(cli) == "spread"
    assert _shown(cli)["policy"]["source"] == "GPUALLOC_POLICY"
    assert _policy(cli, "--policy", "baseline") == "baseline"


def test_every_setting_reaches_the_commands(
    cli, files, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPUALLOC_STATE_DIR")  # it would outrank the file
    elsewhere = tmp_path / "ledger-here"
    files(
        user_text=f'numa = "none"\nstate_dir = "{elsewhere}"\nignore_foreign = true\n'
        '[queue]\npriority = "low"\nmax_bypass = 3\n'
        '[bandwidth_table]\nnvlink_link_gbps = {"2" = 30}\n'
    )
    dry = json.loads(cli(*TOPOLOGY, "run", "-n", "2", "--dry-run", "--json", "--", "true").stdout)
    assert dry["numa"]["reason"] == "binding turned off (--numa none)"
    assert cli(*TOPOLOGY, "alloc", "--hold", "-n", "1").exit_code == 0
    assert list(elsewhere.glob("ledger@dgx1-v100-*.json"))  # state_dir
    shown = _shown(cli)
    assert shown["ignore_foreign"]["value"] is True
    assert (shown["queue.priority"]["value"], shown["queue.max_bypass"]["value"]) == ("low", 3)
    topo = json.loads(cli(*TOPOLOGY, "topo", "show", "--json").stdout)
    assert topo["links"][2]["bandwidth_gbps"] == 60.0  # two NVLinks at the overridden 30 GB/s


def test_queue_defaults_apply_only_with_wait(cli, files) -> None:
    from gpualloc.cli.open_ledger import wait_options
    from gpualloc.cli.state import STATE

    files(system_text='[queue]\npriority = "high"\nmax_bypass = 2\n')
    STATE.reset()
    options = wait_options(wait=True, timeout=None, priority=None, max_bypass=None)
    assert options is not None and (options.priority, options.max_bypass) == ("high", 2)
    assert wait_options(wait=False, timeout=None, priority=None, max_bypass=None) is None
    explicit = wait_options(wait=True, timeout=None, priority="low", max_bypass=5)
    assert (explicit.priority, explicit.max_bypass) == ("low", 5)
    refused = cli(*TOPOLOGY, "run", "--priority", "low", "--", "true")
    assert refused.exit_code == ExitCode.USAGE and "apply to --wait" in refused.stderr


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('polcy = "drb"\n', "unknown setting 'polcy'"),
        ('policy = "fastest"\n', "policy = 'fastest': must be one of mapa"),
        ("[queue]\nmax_bypass = -1\n", "queue.max_bypass = -1: must be a whole number"),
        ('numa = "bind"\nnuma = "none"\n', "is not valid TOML"),
        ("ignore_foreign = 3\n", "must be true or false"),
    ],
)
def test_a_bad_file_is_an_error_naming_file_and_key(cli, files, text: str, message: str) -> None:
    files(system_text=text)
    result = cli(*TOPOLOGY, "plan", "-n", "2")
    assert result.exit_code == ExitCode.CONFIG
    assert message in result.stderr and str(files.system) in result.stderr
    assert "hint:" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("text", "hint"),
    [
        ('polcy = "drb"\n', "hint: did you mean 'policy'?"),
        ('[verify]\npolcy = "drb"\n', "hint: did you mean 'policy'?"),  # a key in the wrong table
        ("[queue]\nmax_bypas = 3\n", "hint: did you mean 'queue.max_bypass'?"),
        ("[queue]\nzzz = 3\n", "hint: the keys of [queue]: queue.priority,"),
        ("zzz = 3\n", "hint: 'gpualloc config show' lists every setting"),
    ],
)
def test_an_unknown_key_gets_a_short_true_hint(cli, files, text: str, hint: str) -> None:
    """It listed all 30 keys, cut short on a terminal, and suggested none."""
    files(system_text=text)
    result = cli("config", "show")
    assert result.exit_code == ExitCode.CONFIG
    assert hint in result.stderr and len(result.stderr.splitlines()[-1]) < 160


def test_a_bad_variable_names_the_variable(cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUALLOC_NUMA", "sometimes")
    result = cli(*TOPOLOGY, "run", "-n", "1", "--dry-run", "--", "true")
    assert result.exit_code == ExitCode.CONFIG
    assert "GPUALLOC_NUMA = 'sometimes': must be one of auto, bind, none" in result.stderr


def test_config_show_lists_the_files_it_read(cli, files) -> None:
    files(user_text='numa = "bind"\n')
    result = cli("config", "show")
    assert result.exit_code == 0
    assert f"user file: {files.user}\n" in result.stdout
    assert f"system file: {files.system} (absent)" in result.stdout
    assert "numa" in result.stdout and "bind" in result.stdout


@pytest.mark.parametrize("command", [("config", "show"), (*TOPOLOGY, "plan", "-n", "2")])
def test_a_bad_bandwidth_table_section_is_a_config_error(cli, files, command) -> None:
    """``config show`` said nothing of it (exit 0) and ``plan`` exited 5, a topology's code."""
    files(system_text="[bandwidth_table]\nnvlink_gbps = 25\n")
    result = cli(*command)
    assert result.exit_code == ExitCode.CONFIG, result.stderr
    assert f"error: {files.system}: [bandwidth_table]: " in result.stderr
    assert "unknown field nvlink_gbps" in result.stderr and "nvlink_link_gbps" in result.stderr


def test_config_show_writes_values_as_the_file_would(cli, files) -> None:
    """It printed Python's ``False`` and a dict's repr."""
    files(system_text="ignore_foreign = false\n[bandwidth_table]\npcie_path_factor = {SYS = 0.4}\n")
    shown = {
        line.split()[0]: line for line in cli("config", "show").stdout.splitlines() if line.strip()
    }
    assert " false " in shown["ignore_foreign"] and "False" not in shown["ignore_foreign"]
    assert "{ pcie_path_factor = { SYS = 0.4 } }" in shown["bandwidth_table"]


def _count_loads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    from gpualloc.config import Config

    loads = [0]
    real = Config.load.__func__

    def counting(cls, env=None):
        loads[0] += 1
        return real(cls, env)

    monkeypatch.setattr(Config, "load", classmethod(counting))
    return loads


def test_a_command_reads_the_configuration_once(cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """The command line reads the files once and hands the state directory to the ledger."""
    loads = _count_loads(monkeypatch)
    assert cli(*TOPOLOGY, "alloc", "--hold", "-n", "1").exit_code == 0
    assert loads[0] == 1
    loads[0] = 0
    assert cli(*TOPOLOGY, "status", "--json").exit_code == 0
    assert loads[0] == 1


def test_the_library_reads_the_configuration_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import gpualloc.api as api

    topology = api.load_topology("dgx1-v100")
    loads = _count_loads(monkeypatch)
    with api.hold(1, wait=True, topology=topology):
        pass
    assert loads[0] == 1  # for the policy, the state directory and the queue together


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        (
            "GPUALLOC_VERIFY_GRACE",
            "soon",
            "GPUALLOC_VERIFY_GRACE = 'soon': 'soon' is not a duration",
        ),
        ("GPUALLOC_VERIFY_ACTION", "explode", "GPUALLOC_VERIFY_ACTION = 'explode': must be one of"),
    ],
)
def test_every_setting_is_checked_before_the_ledger_is_touched(
    cli, monkeypatch: pytest.MonkeyPatch, variable: str, value: str, message: str
) -> None:
    """A bad verify setting stops the command before the lease is announced (read after it, it
    gave exit 15 with the GPUs counted as placed), on a bundled topology too (where it was
    never read: exit 0)."""
    monkeypatch.setenv(variable, value)
    for command in (["run", "-n", "2", "--", "true"], ["alloc", "--hold"]):
        result = cli(*TOPOLOGY, *command)
        assert result.exit_code == ExitCode.CONFIG
        assert result.stderr.startswith(f"error: {message}")
        assert "gpualloc: lease" not in result.stderr  # no lease announced
    monkeypatch.delenv(variable)
    shown = json.loads(cli(*TOPOLOGY, "status", "--json").stdout)
    assert shown["leases"] == []
    metrics = cli(*TOPOLOGY, "metrics").stdout
    assert "gpualloc_placements_total{" not in metrics
