"""No way around the broker.

On b2653dd a broker on the default socket that stopped cleanly removed the socket, and clients
fell back to the cooperative file ledger (a second user got GPUs another held through the
broker); ``serve --socket`` accepted a directory another user owned; and clients never checked
who answered, so that user could swap in a fake broker and read requests. Now broker mode is
the root-owned directory of the default socket, clients talk only to a server run by root (or
by themselves), and ``serve`` listens only in a directory no other user may change.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpualloc.wire.address import BROKER_DIRECTORY
from tests.child_processes import end
from tests.unix_users import UnixUser, UserCommandLine, ensure_user

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def users() -> dict[str, UnixUser]:
    return {name: ensure_user(f"gpualloc-t-{name}") for name in ("alice", "bob")}


@pytest.fixture
def bobs_directory(users: dict[str, UnixUser]) -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="gpualloc-bob-"))
    directory.chmod(0o755)
    os.chown(directory, users["bob"].uid, users["bob"].gid)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def test_serve_refuses_a_socket_directory_another_user_owns(bobs_directory: Path) -> None:
    """Root's broker in bob's directory: bob could replace its socket with his own."""
    done = subprocess.run(
        [sys.executable, "-m", "gpualloc", "--topology", "dgx1-v100", "serve",
         "--socket", str(bobs_directory / "broker.sock"),
         "--state-dir", str(bobs_directory.parent / f"{bobs_directory.name}-state")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 18, done.stderr
    assert "could replace the socket" in done.stderr
    assert not (bobs_directory / "broker.sock").exists()


def test_serve_keeps_a_file_that_is_not_a_socket(tmp_path: Path) -> None:
    """``serve --socket FILE`` refuses a regular file there and leaves it be."""
    keep = tmp_path / "notes.txt"
    keep.write_text("mine")
    done = subprocess.run(
        [sys.executable, "-m", "gpualloc", "--topology", "dgx1-v100", "serve",
         "--socket", str(keep), "--state-dir", str(tmp_path / "state")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 18 and "is not a socket" in done.stderr
    assert keep.read_text() == "mine"


def test_a_client_sends_nothing_to_a_server_another_user_runs(
    users: dict[str, UnixUser], bobs_directory: Path
) -> None:
    """Bob serves a socket of his own and points alice at it: her gpualloc refuses it (exit
    18) before sending a byte."""
    alice, bob = users["alice"], users["bob"]
    path = bobs_directory / "fake.sock"
    # The listener is a process of bob's: the kernel names him to alice's client.
    script = (
        "import socket, sys, time\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.bind(sys.argv[1]); "
        "s.listen(4)\nimport os; os.chmod(sys.argv[1], 0o666)\n"
        "print('ready', flush=True)\n"
        "c, _ = s.accept(); c.settimeout(5)\n"
        "try:\n    data = c.recv(65536)\nexcept OSError:\n    data = b''\n"
        "print(repr(data), flush=True)\n"
    )
    as_user = UserCommandLine(alice)
    server = subprocess.Popen(
        [as_user.python, "-c", script, str(path)], stdout=subprocess.PIPE, text=True,
        user=bob.uid, group=bob.gid, extra_groups=[], cwd="/",
    )  # fmt: skip
    try:
        assert server.stdout is not None
        assert server.stdout.readline().strip() == "ready"
        asked = as_user(alice, "alloc", "--hold", "-n", "1", env={"GPUALLOC_BROKER": str(path)})
        assert asked.returncode == 18, asked.stderr
        assert "not by root" in asked.stderr
        received, _ = server.communicate(timeout=30)
    finally:
        end(server)
    assert received.strip().endswith("b''"), received  # not one byte of the request


@pytest.mark.skipif(os.path.lexists(BROKER_DIRECTORY), reason=f"{BROKER_DIRECTORY} is in use")
def test_a_host_in_broker_mode_never_falls_back_to_the_file_ledger(
    users: dict[str, UnixUser],
) -> None:
    """The broker's directory stands, its socket is gone (a broker that stopped cleanly):
    every client says the broker does not answer (exit 18) and writes no file ledger."""
    alice = users["alice"]
    state = Path(tempfile.mkdtemp(prefix="gpualloc-fallback-"))
    state.chmod(0o1777)
    Path(BROKER_DIRECTORY).mkdir(mode=0o755)
    try:
        as_user = UserCommandLine(alice)
        env = {"GPUALLOC_STATE_DIR": str(state)}
        asked = as_user(alice, "alloc", "--hold", "-n", "1", env=env)  # this host's ledger
        assert asked.returncode == 18, asked.stderr
        assert "does not answer" in asked.stderr and BROKER_DIRECTORY in asked.stderr
        assert list(state.iterdir()) == []
    finally:
        shutil.rmtree(BROKER_DIRECTORY, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)


def test_a_directory_another_user_made_there_is_no_mark(users: dict[str, UnixUser]) -> None:
    from gpualloc.wire.address import broker_socket

    if os.path.lexists(BROKER_DIRECTORY):
        pytest.skip(f"{BROKER_DIRECTORY} is in use")
    Path(BROKER_DIRECTORY).mkdir(mode=0o755)
    try:
        assert broker_socket(None) is not None
        os.chown(BROKER_DIRECTORY, users["bob"].uid, users["bob"].gid)
        assert broker_socket(None) is None
    finally:
        shutil.rmtree(BROKER_DIRECTORY, ignore_errors=True)


def test_doctor_checks_who_owns_the_brokers_files(users: dict[str, UnixUser]) -> None:
    """Modes alone do not say who may change a file: a ledger another user owns is a problem
    even at 0644."""
    from tests.broker_harness import RunningBroker

    broker = RunningBroker("dgx1-v100").start()
    try:
        broker.call("hello")
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUALLOC_")}
        env["GPUALLOC_BROKER"] = str(broker.socket)
        argv = [sys.executable, "-m", "gpualloc", "doctor"]
        fine = subprocess.run(
            argv, capture_output=True, text=True, env=env, check=False, timeout=120
        )
        assert "socket directory" in fine.stdout and "belongs to uid" not in fine.stdout
        os.chown(broker.state, users["alice"].uid, users["alice"].gid)
        planted = subprocess.run(
            argv, capture_output=True, text=True, env=env, check=False, timeout=120
        )
        assert planted.returncode != 0
        assert f"belongs to uid {users['alice'].uid}, not the broker's 0" in planted.stdout
    finally:
        os.chown(broker.state, 0, 0)
        broker.stop()
        shutil.rmtree(broker.directory, ignore_errors=True)
