"""A real ``gpualloc serve`` for tests: started, killed and restarted as a test needs.

The broker runs as the test's user (root in CI) on a bundled topology, with its socket in a
directory every user can reach (``/tmp``, mode 0755) and its state directory beside it. No
systemd: the test is the supervisor (a restart is a new process on the same socket and state).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

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
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUALLOC_")}
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
