"""A real ``gpualloc serve`` for tests: started, killed and restarted as a test needs.

The broker runs as the test's user (root in CI) on a bundled topology, with its socket in a
directory every user can reach (``/tmp``, mode 0755) and its state directory beside it. No
systemd: the test is the supervisor (a restart is a new process on the same socket and state).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tests.child_processes import end

ROOT = Path(__file__).resolve().parent.parent


class RunningBroker:
    def __init__(self, topology: str, *, system_config: Path | None = None) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="gpualloc-broker-", dir="/tmp"))
        self.directory.chmod(0o755)
        self.socket = self.directory / "gpualloc.sock"
        self.state = self.directory / "state"
        self.log = self.directory / "broker.log"
        self.topology = topology
        self.system_config = system_config
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def argv(self) -> list[str]:
        return [
            sys.executable, "-m", "gpualloc", "--topology", self.topology, "serve",
            "--socket", str(self.socket), "--state-dir", str(self.state),
        ]  # fmt: skip

    def start(self, *, timeout_s: float = 30) -> RunningBroker:
        env = clean_env()
        env["PYTHONPATH"] = str(ROOT)
        if self.system_config is not None:
            env["GPUALLOC_SYSTEM_CONFIG"] = str(self.system_config)
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(self.argv(), env=env, stderr=log, cwd="/")
        self.starts += 1
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise AssertionError(f"the broker exited: {self.log.read_text()[-2000:]}")
            try:
                self.hello()
                return self
            except OSError:
                assert time.monotonic() < deadline, "the broker did not start"
                time.sleep(0.02)

    def hello(self) -> dict:
        return self.call("hello")

    def call(self, op: str, args: dict | None = None) -> dict:
        """One raw request; the answer's result (an error answer raises ``OSError``)."""
        body = self.raw_call(op, args)
        if not body.get("ok"):
            raise OSError(str(body))
        return body["result"]

    def raw_call(self, op: str, args: dict | None = None) -> dict:
        """One raw request; the whole answer, error or not."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(10)
            connection.connect(str(self.socket))
            connection.sendall(json.dumps({"v": 1, "op": op, "args": args or {}}).encode() + b"\n")
            with connection.makefile("rb") as reader:
                return json.loads(reader.readline())

    def kill9(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def worker(self) -> int:
        """The pid of the broker's placement worker (its one child)."""
        assert self.process is not None
        found = subprocess.run(
            ["pgrep", "-P", str(self.process.pid)],
            capture_output=True, text=True, check=False, timeout=120,
        ).stdout.split()  # fmt: skip
        assert len(found) == 1, found
        return int(found[0])

    def stop(self) -> None:
        if self.process is not None:
            end(self.process, term_s=30)

    def ledger(self) -> dict:
        """The ledger file as the broker last wrote it (empty before its first write)."""
        found = [path for path in self.state.glob("ledger*.json") if ".good." not in path.name]
        return json.loads(found[0].read_text()) if found else {"leases": [], "generation": 0}

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def clean_env() -> dict[str, str]:
    """This process's environment without gpualloc's variables (the test's own state and
    caches included): a client that reaches only the broker it is told of."""
    return {k: v for k, v in os.environ.items() if not k.startswith("GPUALLOC_")}


def through_broker(broker: RunningBroker, *args: str) -> subprocess.Popen[str]:
    """``gpualloc ARGS`` in a process of its own, a client of ``broker`` (GPUALLOC_BROKER)."""
    env = {**clean_env(), "GPUALLOC_BROKER": str(broker.socket)}
    return subprocess.Popen(
        [sys.executable, "-m", "gpualloc", *args], env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def broker_leases(broker: RunningBroker) -> list[dict]:
    """The leases of ``broker``'s ledger, as its ``snapshot`` answers them."""
    return broker.call("snapshot")["ledger"]["leases"]


def hold_request(lease_id: str, gpus: int = 1) -> dict:
    """The arguments of a raw ``alloc`` that holds ``gpus`` GPUs under ``lease_id``."""
    return {
        "lease_id": lease_id,
        "options": {"policy": "mapa", "count": gpus, "sensitive": False},
        "terms": {"source": "alloc", "hold": True},
    }


def until(condition: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    """Wait for ``condition``, polling, and fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def running_broker(topology: str) -> Iterator[RunningBroker]:
    """A broker of ``topology`` for one test, removed after it (the body of the test files'
    ``broker`` fixtures). Skips where it cannot run as root, as CI runs it."""
    import shutil

    import pytest

    if os.geteuid() != 0:
        pytest.skip("the broker's tests run it as root (CI runs as root)")
    running = RunningBroker(topology).start()
    try:
        yield running
    finally:
        if running.process is not None and running.process.poll() is None:
            os.kill(running.process.pid, signal.SIGCONT)  # a test may have stopped it
        running.stop()
        shutil.rmtree(running.directory, ignore_errors=True)


class TurnedBroker:
    """A broker in this process on a bundled host, whose loop the test turns (no placement
    worker: searches run in the loop), and the batches of lines it gave its log."""

    def __init__(self, directory: Path) -> None:
        from gpualloc.broker.fair_share import FairShare
        from gpualloc.broker.limits import Limits
        from gpualloc.broker.listener import listening_socket
        from gpualloc.broker.server import Broker
        from gpualloc.broker.service import LedgerService
        from gpualloc.config import Config
        from gpualloc.host.local import LocalHost
        from gpualloc.host.queue_policy import QueuePolicy
        from gpualloc.topologies import load_bundled

        config = Config.load()
        host = LocalHost.open(load_bundled("dgx1-v100"), state_dir=directory / "b", owner=True)
        service = LedgerService(host, QueuePolicy.from_config(config), FairShare(3600.0), config)
        assert service.store.hold_lock()
        self.socket = directory / "run" / "gpualloc.sock"
        self.logged: list[list[str]] = []
        self.broker = Broker(
            service, listening_socket(self.socket), Limits(64, 1000), log=self.logged.append
        )
        self.broker.start()

    def connect(self) -> socket.socket:
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect(str(self.socket))
        client.settimeout(5)
        return client

    def answers(self, client: socket.socket, count: int) -> list[dict[str, Any]]:
        """The next ``count`` answers ``client`` gets, turning the loop until they came."""
        found = b""
        for _ in range(50):
            self.broker.turn()
            client.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                found += client.recv(1 << 20)
            if found.count(b"\n") >= count:
                break
        lines = found.splitlines()
        assert len(lines) == count, found
        return [json.loads(line) for line in lines]

    def close(self) -> None:
        for key in list(self.broker.selector.get_map().values()):
            if isinstance(key.fileobj, socket.socket):
                key.fileobj.close()
            else:  # a lease's pidfd
                os.close(key.fd)
        self.broker.selector.close()
        held = self.broker.service.store._held
        assert held is not None
        held.__exit__(None, None, None)
