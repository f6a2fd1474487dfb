"""Bad input through the broker, in a GraphML export and in a
configuration path, is answered with one error, a documented exit code, and nothing written."""

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
from tests.cli_harness import Result

TOPOLOGIES = Path(__file__).resolve().parent.parent / "gpualloc" / "topologies"


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("GPUALLOC_")}


# ---- item 1: the broker refuses what the embedded path refuses -------------------------------


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


# ---- item 2: a GPU name's control characters in a GraphML or GEXF export ---------------------


@pytest.mark.parametrize("fmt", ["graphml", "gexf"])
def test_an_exported_graph_with_control_characters_in_names_parses(
    cli: Callable[..., Result], tmp_path: Path, fmt: str
) -> None:
    import xml.etree.ElementTree as ElementTree

    data = json.loads((TOPOLOGIES / "dgx1-v100.json").read_text())
    data["name"] = "host\x01"
    data["gpus"][0]["name"] = "Tesla\x1b[31mV100\x07"
    topology = tmp_path / "hostile.json"
    topology.write_text(json.dumps(data))
    result = cli("--topology", str(topology), "topo", "export", "--format", fmt)
    assert result.exit_code == 0, result.stderr
    root = ElementTree.fromstring(result.stdout)
    texts = [element.text or "" for element in root.iter()]
    texts += [value for element in root.iter() for value in element.attrib.values()]
    assert "Tesla\\x1b[31mV100\\x07" in texts
    assert not any("\x1b" in text or "\x01" in text for text in texts)


# ---- item 3: a configuration file in a directory the user may not enter ----------------------


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
