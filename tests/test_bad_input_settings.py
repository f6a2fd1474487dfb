"""Bad input answered well, more of it: one ``error:`` line, at most one ``hint:``, a
documented exit code, no traceback, nothing written, no raw control character on the terminal."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cli_harness import Result, in_subprocess, run_in_process
from tests.house_rules import no_control_characters, refused
from tests.unix_users import in_process_as_nobody

Cli = Callable[..., Result]

ESC = "\x1b[31m"
TOPOLOGIES = Path(__file__).resolve().parent.parent / "gpualloc" / "topologies"


# ---- item 1: control characters from users and files ---------------------------------------


def test_release_does_not_echo_an_escape_sequence(cli: Cli) -> None:
    result = cli("--topology", "dgx1-v100", "release", ESC + "ab")
    refused(result, 13)
    no_control_characters(result.stdout, result.stderr)
    assert "no lease \\x1b[31mab" in result.stderr


def test_topo_import_refuses_a_name_with_control_characters(cli: Cli, tmp_path: Path) -> None:
    from tests.recordings import recorded

    source = tmp_path / "topo.txt"
    source.write_text(recorded("2gpu_pcie_phb_hf-docs_topo.txt"))
    made = tmp_path / "made.json"
    result = cli("topo", "import", str(source), "--name", "x\x1b[2J", "-o", str(made))
    refused(result, 2)
    no_control_characters(result.stdout, result.stderr)
    assert "--name 'x\\x1b[2J' holds control characters" in result.stderr
    assert not made.exists()


@pytest.fixture
def hostile_topology(tmp_path: Path) -> Path:
    """dgx1-v100 with escape sequences in every text a file may give."""
    data = json.loads((TOPOLOGIES / "dgx1-v100.json").read_text())
    data["name"] = "evil" + ESC
    data["gpus"][0]["name"] = "V100" + ESC + "\x07"
    data["provenance"].update(
        hostname="h" + ESC, description="d" + ESC, notes=["n" + ESC], origin="o" + ESC
    )
    data["processes"] = [{"gpu": 1, "pid": 4242, "name": "proc" + ESC, "user": "u" + ESC}]
    data["faults"] = [{"gpu": 2, "kind": "xid", "detail": "xid 79" + ESC}]
    path = tmp_path / "evil.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("command", [["topo", "show"], ["status"], ["doctor"], ["plan", "-n", "2"]])
def test_a_topology_files_texts_reach_no_terminal_raw(
    cli: Cli, hostile_topology: Path, command: list[str]
) -> None:
    result = cli("--topology", str(hostile_topology), *command)
    assert "Traceback" not in result.stderr
    no_control_characters(result.stdout, result.stderr)
    assert "\\x1b[31m" in result.stdout + result.stderr


# ---- item 2: a refused --uuid changes nothing ----------------------------------------------


def _topology_with_uuids(tmp_path: Path, uuid: str | None) -> Path:
    data = json.loads((TOPOLOGIES / "dgx1-v100.json").read_text())
    for gpu in data["gpus"]:
        gpu["uuid"] = uuid
    path = tmp_path / "uuids.json"
    path.write_text(json.dumps(data))
    return path


def _state_files(tmp_path: Path) -> dict[str, bytes]:
    state = tmp_path / "state"
    return {p.name: p.read_bytes() for p in state.iterdir()} if state.exists() else {}


@pytest.mark.parametrize(
    ("uuid", "message"),
    [(None, "GPU 0 has no UUID"), ("GPU-a,0", "GPU 0's UUID 'GPU-a,0' is not one")],
)
@pytest.mark.parametrize(
    "command", [["run", "--uuid", "-n", "1", "--", "true"], ["alloc", "--uuid", "-n", "1"]]
)
def test_a_refused_uuid_writes_nothing(
    cli: Cli, tmp_path: Path, uuid: str | None, message: str, command: list[str]
) -> None:
    topology = str(_topology_with_uuids(tmp_path, uuid))
    assert cli("--topology", topology, "alloc", "-n", "1").exit_code == 0  # a ledger to keep
    before = _state_files(tmp_path)
    result = in_subprocess("--topology", topology, *command)
    refused(result, 2)
    assert f"--uuid: {message}" in result.stderr
    assert _state_files(tmp_path) == before
    metrics = cli("--topology", topology, "metrics").stdout
    assert 'gpualloc_placements_total{policy="mapa"} 1\n' in metrics


# ---- item 3: --shareable --mem ---------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["run", "--shareable", "--mem", "40G", "-n", "1", "--", "true"],
        ["run", "--dry-run", "--shareable", "--mem", "40G", "--", "true"],
        ["alloc", "--shareable", "--mem", "40G", "-n", "1"],
    ],
)
def test_shareable_memory_beyond_the_gpus_is_refused(
    cli: Cli, tmp_path: Path, command: list[str]
) -> None:
    """dgx1-v100's V100s have 32 GiB each."""
    result = in_subprocess("--topology", "dgx1-v100", *command)
    refused(result, 9)
    assert "--mem 40 GiB is more than any GPU here has (32 GiB)" in result.stderr
    assert _state_files(tmp_path) == {}


def test_dry_run_reads_shareable_memory(cli: Cli) -> None:
    dry_run = ["run", "--dry-run", "--shareable", "--mem", "8", "--", "true"]
    result = cli("--topology", "dgx1-v100", *dry_run)
    refused(result, 2)
    assert "--mem '8' has no unit" in result.stderr


# ---- item 5: messages that said the wrong thing ----------------------------------------------


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


def test_a_bandwidth_table_error_names_the_fields(cli: Cli, tmp_path: Path) -> None:
    for text in ("{bad", "[1]"):
        table = tmp_path / "table.json"
        table.write_text(text)
        result = cli("--bandwidth-table", str(table), "--topology", "dgx1-v100", "topo", "show")
        refused(result, 5)
        hint = next(line for line in result.stderr.splitlines() if line.startswith("hint: "))
        assert "pcie_path_factor" in hint and "nvlink_link_gbps" in hint
        assert "BandwidthTable" not in hint


def test_metrics_serve_on_a_name_that_does_not_resolve_is_no_port_problem(cli: Cli) -> None:
    result = cli("--topology", "dgx1-v100", "metrics", "--serve", "bogus-host.invalid:9400")
    refused(result, 2)
    assert "the host name does not resolve" in result.stderr
    assert "port" not in result.stderr.split("hint: ", 1)[1]


def test_calibrate_refuses_forget_with_from(cli: Cli, tmp_path: Path) -> None:
    measured = tmp_path / "measured.txt"
    measured.write_text("{}\n")
    result = cli("calibrate", "--forget", "--from", str(measured))
    refused(result, 2)
    assert "--forget removes the saved calibration; --from is for making one" in result.stderr


LONG = "x" * 5000


@pytest.mark.parametrize(
    "args",
    [
        ["--topology", "dgx1-v100", "plan", "-n", "2", "--drb-weights", LONG],
        ["topo", "import", "/tmp/" + LONG],
        ["--topology", "dgx1-v100", "simulate", "--trace", "/tmp/" + LONG],
        ["--bandwidth-table", "/tmp/" + LONG, "topo", "list"],
    ],
)
def test_a_long_argument_is_cut_in_the_error(cli: Cli, args: list[str]) -> None:
    result = cli(*args)
    assert result.exit_code in (2, 3, 4, 8, 14), result.stderr
    refused(result, result.exit_code)
    assert max(len(line) for line in result.stderr.splitlines()) < 300, result.stderr
    assert "..." in result.stderr
