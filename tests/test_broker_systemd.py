"""examples/systemd: the units are valid, agree with gpualloc's defaults, and the broker speaks
systemd's protocols (socket activation, ``sd_notify``) without systemd running."""

from __future__ import annotations

import configparser
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gpualloc.config import BY_KEY
from gpualloc.wire.address import DEFAULT_SOCKET
from tests.child_processes import finish

ROOT = Path(__file__).resolve().parent.parent
UNITS = ROOT / "examples" / "systemd"


def _unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(UNITS / name)
    return parser


def test_the_units_agree_with_gpuallocs_defaults() -> None:
    sock, service = _unit("gpualloc.socket"), _unit("gpualloc.service")
    assert sock["Socket"]["ListenStream"] == DEFAULT_SOCKET
    assert sock["Socket"]["SocketMode"] == "0666"
    assert service["Service"]["Type"] == "notify"
    command = service["Service"]["ExecStart"].split()
    assert command[1:3] == ["serve", "--foreground"]
    state_dir = command[command.index("--state-dir") + 1]
    assert state_dir == str(BY_KEY["broker.state_dir"].default)
    assert f"/var/lib/{service['Service']['StateDirectory']}" == state_dir
    assert service["Service"]["StateDirectoryMode"] == "0755"


def test_systemd_analyze_finds_nothing_wrong_with_the_units(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    gpualloc = Path(sys.executable).with_name("gpualloc")
    shutil.copy(UNITS / "gpualloc.socket", tmp_path)
    text = (UNITS / "gpualloc.service").read_text()
    (tmp_path / "gpualloc.service").write_text(
        text.replace("/usr/local/bin/gpualloc", str(gpualloc))
    )
    result = subprocess.run(
        [analyze, "verify", str(tmp_path / "gpualloc.socket"), str(tmp_path / "gpualloc.service")],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


ACTIVATE = """
import os, socket, sys
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(sys.argv[1])
os.chmod(sys.argv[1], 0o666)
listener.listen(16)
if listener.fileno() == 3:
    os.set_inheritable(3, True)
else:
    os.dup2(listener.fileno(), 3)
os.environ["LISTEN_FDS"] = "1"
os.environ["LISTEN_PID"] = str(os.getpid())
os.execv(sys.executable, [sys.executable, "-m", "gpualloc", *sys.argv[2:]])
"""


def test_the_broker_takes_systemds_socket_and_says_when_it_is_ready() -> None:
    directory = Path(tempfile.mkdtemp(prefix="gpualloc-activation-", dir="/tmp"))
    path, notify_path = directory / "gpualloc.sock", directory / "notify"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_path))
    notify.settimeout(30)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUALLOC_")}
    env.update(NOTIFY_SOCKET=str(notify_path), PYTHONPATH=str(ROOT))
    broker = subprocess.Popen(
        [sys.executable, "-c", ACTIVATE, str(path), "--topology", "nvlink-pairs-4gpu", "serve",
         "--socket", str(directory / "unused.sock"), "--state-dir", str(directory / "state")],
        env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert notify.recv(64) == b"READY=1"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(10)
            client.connect(str(path))
            client.sendall(b'{"v": 1, "op": "hello", "args": {}}\n')
            hello = json.loads(client.makefile("rb").readline())["result"]
        assert hello["broker_pid"] == broker.pid and hello["gpus"] == 4
        assert not (directory / "unused.sock").exists()  # systemd's socket, not its own
    finally:
        broker.terminate()
        _, err = finish(broker, timeout_s=30)
        notify.close()
        shutil.rmtree(directory, ignore_errors=True)
    assert "stopped" in err
