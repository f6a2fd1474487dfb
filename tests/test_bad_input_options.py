"""Bad values on the command line answered well: one ``error:`` line, at most one ``hint:``
(one that says what ``--help`` does not), a documented exit code, no traceback, nothing written
and no raw control character said back (the rule: :func:`tests.house_rules.refused`); the
broker refuses what the embedded ledger refuses. Settings are ``test_bad_input_settings.py``'s,
files read and written ``test_bad_input_files.py``'s."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpualloc.errors import ExitCode
from tests.broker_harness import RunningBroker
from tests.cli_harness import Result, in_subprocess
from tests.house_rules import no_control_characters, refused

Cli = Callable[..., Result]
ESC = "\x1b[31m"
TOPOLOGIES = Path(__file__).resolve().parent.parent / "gpualloc" / "topologies"


def _state_files(tmp_path: Path) -> dict[str, bytes]:
    state = tmp_path / "state"
    return {p.name: p.read_bytes() for p in state.iterdir()} if state.exists() else {}


# ---- serve --socket --------------------------------------------------------------------------


@pytest.mark.parametrize("socket", ["", "   "])
def test_serve_refuses_an_empty_socket_path(cli: Cli, tmp_path: Path, socket: str) -> None:
    state = tmp_path / "broker-state"
    result = cli("--topology", "dgx1-v100", "serve", "--socket", socket, "--state-dir", str(state))
    refused(result, 2)
    assert "--socket is empty" in result.stderr
    assert not state.exists()


def test_serve_refuses_a_socket_path_too_long_for_a_unix_socket(cli: Cli, tmp_path: Path) -> None:
    state = tmp_path / "broker-state"
    socket = tmp_path / ("s" * 200)
    result = cli(
        "--topology", "dgx1-v100", "serve", "--socket", str(socket), "--state-dir", str(state)
    )
    refused(result, 2)
    assert "a Unix socket's path may have at most" in result.stderr
    assert not state.exists() and not socket.exists()


# ---- an empty --topology ---------------------------------------------------------------------


@pytest.mark.parametrize("given", [["--topology", ""], ["--topology="], ["-t", " "]])
@pytest.mark.parametrize(
    "command", [["topo", "show"], ["status"], ["run", "-n", "1", "--", "true"], ["plan"]]
)
def test_an_empty_topology_option_is_a_usage_error(
    cli: Cli, monkeypatch: pytest.MonkeyPatch, given: list[str], command: list[str]
) -> None:
    """``--topology ''`` fell back to $GPUALLOC_TOPOLOGY (or this host) without a word."""
    monkeypatch.setenv("GPUALLOC_TOPOLOGY", "dgx1-v100")
    result = cli(*given, *command)
    refused(result, 2)
    assert result.stderr.startswith("error: --topology is empty\nhint: ") and result.stdout == ""


# ---- gres.conf fields ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--node", "n1\nNodeName=evil Name=gpu File=/dev/sda"),
        ("--node", "n1 File=/dev/sda"),
        ("--node", "n1\r"),
        ("--node", ""),
        ("--gpu-type", "a100\nNodeName=evil"),
        ("--device-dir", "/dev\nNodeName=evil"),
    ],
)
def test_gres_conf_refuses_a_field_that_would_write_another_line(
    cli: Cli, option: str, value: str
) -> None:
    result = cli("--topology", "dgx1-v100", "slurm", "gres-conf", option, value)
    refused(result, 2)
    assert result.stdout == "" and "evil" not in result.stdout


def test_gres_conf_keeps_a_hostlist_node_name(cli: Cli) -> None:
    result = cli("--topology", "dgx1-v100", "slurm", "gres-conf", "--node", "gpu[01-04]")
    assert result.exit_code == 0
    assert "NodeName=gpu[01-04] Name=gpu File=/dev/nvidia0 " in result.stdout


# ---- --mem without a unit, --drb-weights -----------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [["plan", "-n", "1", "--mem", "8"], ["alloc", "-n", "1", "--shareable", "--mem", "8"]],
)
def test_mem_without_a_unit_is_refused(cli: Cli, command: list[str]) -> None:
    result = cli("--topology", "dgx1-v100", *command)
    refused(result, 2)
    assert "--mem '8' has no unit" in result.stderr and "8G" in result.stderr


def test_mem_in_bytes_says_so() -> None:
    from gpualloc.model.option_values import parse_size

    assert parse_size("4096B", "--mem") == 4096
    assert parse_size("8G", "--mem") == 8 * 1024**3


@pytest.mark.parametrize(
    ("weights", "said"),
    [
        (
            "0,0,0",
            "--drb-weights '0,0,0': all three weights are zero; at least one must be positive",
        ),
        ("1,-1,0", "--drb-weights '1,-1,0': a weight is negative (-1)"),
        ("1,2", "--drb-weights '1,2' is not three non-negative numbers"),
    ],
)
@pytest.mark.parametrize("command", [["alloc", "--hold"], ["run", "--dry-run", "--", "true"]])
def test_drb_weights_say_which_rule_they_break(
    cli: Cli, weights: str, said: str, command: list[str]
) -> None:
    """``0,0,0`` was "is not three non-negative numbers": it is three, and none is negative."""
    result = cli("--topology", "dgx1-v100", command[0], "--drb-weights", weights, *command[1:])
    refused(result, 2)
    assert result.stderr.startswith(f"error: {said}\n"), result.stderr


# ---- control characters typed ----------------------------------------------------------------


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


# ---- a refused --uuid changes nothing --------------------------------------------------------


def _topology_with_uuids(tmp_path: Path, uuid: str | None) -> Path:
    data = json.loads((TOPOLOGIES / "dgx1-v100.json").read_text())
    for gpu in data["gpus"]:
        gpu["uuid"] = uuid
    path = tmp_path / "uuids.json"
    path.write_text(json.dumps(data))
    return path


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


# ---- --shareable --mem -----------------------------------------------------------------------


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


# ---- the broker refuses what the embedded ledger refuses -------------------------------------


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("GPUALLOC_")}


@pytest.fixture
def uuidless_broker(tmp_path: Path) -> Iterator[RunningBroker]:
    """A broker of dgx1-v100 (32 GiB V100s) whose GPUs have no UUID."""
    if os.geteuid() != 0:
        pytest.skip("the broker's tests run it as root (CI runs as root)")
    data = json.loads((TOPOLOGIES / "dgx1-v100.json").read_text())
    for gpu in data["gpus"]:
        gpu["uuid"] = None
    topology = tmp_path / "no-uuids.json"
    topology.write_text(json.dumps(data))
    topology.chmod(0o644)
    broker = RunningBroker(str(topology)).start()
    try:
        yield broker
    finally:
        broker.stop()
        shutil.rmtree(broker.directory, ignore_errors=True)


def _raw_error(broker: RunningBroker, op: str, args: dict) -> dict:
    """The error the broker answers one raw request with."""
    body = broker.raw_call(op, args)
    assert not body.get("ok"), body
    return body["error"]


def _through(broker: RunningBroker, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**_clean_env(), "GPUALLOC_BROKER": str(broker.socket)}
    return subprocess.run(
        [sys.executable, "-m", "gpualloc", *args], env=env, capture_output=True, text=True,
        check=False, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip


@pytest.mark.parametrize(
    "command", [["run", "--uuid", "-n", "1", "--", "true"], ["alloc", "--uuid", "-n", "1"]]
)
def test_a_refused_uuid_through_the_broker_writes_nothing(
    uuidless_broker: RunningBroker, command: list[str]
) -> None:
    before = uuidless_broker.ledger()
    result = _through(uuidless_broker, *command)
    assert result.returncode == ExitCode.USAGE, result.stderr
    assert result.stderr == (
        "error: --uuid: GPU 0 has no UUID in this topology\n"
        "hint: leave out --uuid to export indices\n"
    )
    assert result.stdout == ""
    assert uuidless_broker.ledger() == before  # no lease made, none made and released
    assert uuidless_broker.call("snapshot")["ledger"]["leases"] == []


def test_shareable_memory_beyond_the_gpus_is_refused_by_the_broker(
    uuidless_broker: RunningBroker,
) -> None:
    """A client that sends the terms itself (not through the command line's check)."""
    request = {
        "lease_id": "0123456789ab",
        "options": {"policy": "mapa", "count": 1},
        "terms": {"source": "alloc", "hold": True, "shareable": True, "memory_bytes": 40 << 30},
    }
    error = _raw_error(uuidless_broker, "alloc", request)
    assert error["code"] == ExitCode.NO_PLACEMENT
    assert error["message"] == "--mem 40 GiB is more than any GPU here has (32 GiB)"
    assert uuidless_broker.call("snapshot")["ledger"]["leases"] == []
    result = _through(uuidless_broker, "alloc", "--shareable", "--mem", "40G", "-n", "1")
    assert result.returncode == ExitCode.NO_PLACEMENT, result.stderr
    assert result.stderr.startswith("error: --mem 40 GiB is more than any GPU here has (32 GiB)")
    assert uuidless_broker.call("snapshot")["ledger"]["leases"] == []


# ---- messages that said the wrong thing ------------------------------------------------------


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


# ---- hints that only repeated the option's help ----------------------------------------------


BAD_VALUES = [
    (["run", "--dry-run", "--numa", "bnid", "--", "true"], "run --numa", "bind"),
    (["run", "--wait", "--priority", "hgih", "--", "true"], "run --priority", "high"),
    (["alloc", "--format", "yaml"], "alloc --format", None),
    (["topo", "export", "--format", "gexff"], "topo export --format", "gexf"),
    (["run", "--dry-run", "--score", "mapp", "--", "true"], "run --score", "mapa"),
    (["run", "--dry-run", "--policy", "spraed", "--", "true"], "run --policy", "spread"),
    (["run", "--dry-run", "-n", "2", "--pattern", "rign", "--", "true"], "run --pattern", "ring"),
    (["simulate", "--generate", "mixd"], "simulate --generate", "mixed"),
    (["simulate", "--generate", "mapa", "--queue", "lifo"], "simulate --queue", "fifo"),
    (["simulate", "--generate", "mapa", "--runtime", "fast"], "simulate --runtime", None),
    (["simulate", "--generate", "mapa", "--load", "5000"], "simulate --load", None),
    (["run", "--wait", "--timeout", "soon", "--", "true"], "run --timeout", None),
    (["status", "--idle", "soon"], "status --idle", None),
    (["run", "--dry-run", "--share", "--mem", "lots", "--", "true"], "run --mem", None),
    (["run", "--dry-run", "--mig", "big", "--", "true"], "run --mig", None),
    (["run", "--dry-run", "--drb-weights", "1,2", "--", "true"], "run --drb-weights", None),
]  # fmt: skip


_FILLER = {"the", "a", "an", "of", "to", "or", "and", "in", "is", "for", "on", "with", "as", "by",
           "it", "its", "e.g", "choose", "give", "one", "one of"}  # fmt: skip


def _help_of(option: str) -> str:
    from gpualloc.cli.commands import every_command

    *path, name = option.split()
    (command,) = [command for where, command in every_command() if where == " ".join(path)]
    (opt,) = [opt for opt in command.options if name in opt.names]
    return opt.help


def _words(text: str) -> set[str]:
    import re

    return {w.strip(".") for w in re.findall(r"[a-z0-9][a-z0-9_.]*", text.lower())} - _FILLER


@pytest.mark.parametrize(("args", "option", "meant"), BAD_VALUES, ids=lambda v: str(v))
def test_a_bad_value_gets_a_hint_its_help_does_not_already_give(
    cli: Cli, args: list[str], option: str, meant: str | None
) -> None:
    """Hints such as "choose auto, bind or none" or "e.g. --timeout 90, 30s, 5m, 1h30m" said
    again what --help says of the option: a choice error names the choices in the error and
    hints at the one closest to what was typed; any other hint says something the help does
    not."""
    result = cli("--topology", "dgx1-v100", *args)
    assert result.exit_code in (2, 14), result.stderr
    refused(result, result.exit_code)
    hints = [line[6:] for line in result.stderr.splitlines() if line.startswith("hint: ")]
    if meant is not None:
        assert hints == [f"did you mean {meant}?"], result.stderr
    for hint in hints:
        said = _words(hint) - _words(option)
        repeated = said & _words(_help_of(option))
        assert len(repeated) < 0.5 * len(said), (hint, sorted(repeated))
