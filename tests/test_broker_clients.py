"""Clients through the broker: the library, every ledger command and the Slurm hooks
answer through it, and a client told of a broker says so when it does not answer (exit 18,
never the shared file) or when a trial on a bundled topology passes it by; root's Slurm hooks
write the broker's ledger themselves while none answers.

The broker runs as root (tests/broker_harness.py). What each command imports through it is
``test_startup_imports.py``'s.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker_harness import (
    ROOT,
    RunningBroker,
    broker_leases,
    clean_env,
    running_broker,
    through_broker,
)
from tests.child_processes import finish

TOPOLOGY = "nvlink-pairs-4gpu"


@pytest.fixture
def broker() -> Iterator[RunningBroker]:
    yield from running_broker(TOPOLOGY)


# ---- when no broker answers, or a trial passes it by ---------------------------------------------


def test_a_configured_broker_that_does_not_answer_is_exit_18_never_the_shared_file(
    tmp_path: Path,
) -> None:
    env = {**clean_env(), "GPUALLOC_BROKER": str(tmp_path / "nobody.sock")}
    env["GPUALLOC_STATE_DIR"] = str(tmp_path / "state")
    result = subprocess.run(
        [sys.executable, "-m", "gpualloc", "alloc", "--hold"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 18, result.stderr
    assert "does not answer" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "state").exists()


def test_a_broker_a_user_named_that_a_trial_passes_by_is_said(
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GPUALLOC_BROKER with a bundled topology: the trial keeps the topology's own ledger, as
    documented, but it said nothing, and the user who named a broker thought it held the
    lease. The host's own broker (system config) needs no word for a trial."""
    socket = tmp_path / "broker.sock"
    monkeypatch.setenv("GPUALLOC_BROKER", str(socket))
    said = (
        f"gpualloc: warning: the broker {socket} (GPUALLOC_BROKER) is not used: the topology "
        "named (dgx1-v100) is not this host, so it has a ledger of its own\n"
    )
    for args in (["alloc", "--hold"], ["plan", "-n", "2"], ["status"]):
        result = cli("--topology", "dgx1-v100", *args)
        assert result.exit_code == 0, result.stderr
        assert said in result.stderr, (args, result.stderr)
    monkeypatch.delenv("GPUALLOC_BROKER")
    system = tmp_path / "etc" / "config.toml"
    system.parent.mkdir(exist_ok=True)
    system.write_text(f'[host]\nbroker = "{socket}"\n')
    result = cli("--topology", "dgx1-v100", "status")
    assert result.exit_code == 0 and "warning" not in result.stderr, result.stderr


# ---- through the broker --------------------------------------------------------------------------


def test_the_library_holds_through_the_broker(broker: RunningBroker) -> None:
    code = textwrap.dedent(
        """
        import gpualloc.api as api
        with api.hold(2) as held:
            print(held.lease.id, held.gpus, held.environment["CUDA_VISIBLE_DEVICES"])
        """
    )
    env = {**clean_env(), "GPUALLOC_BROKER": str(broker.socket), "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    lease, rest = result.stdout.split(" ", 1)
    gpus, visible = rest.split(") ")
    assert visible.strip() == ",".join(gpus.strip("(").replace(" ", "").split(","))
    assert f"lease {lease}" in broker.log_text()  # the broker made it, and then released it
    assert not broker_leases(broker)


def test_every_ledger_command_answers_through_the_broker(broker: RunningBroker) -> None:
    def run(*args: str) -> str:
        job = through_broker(broker, *args)
        out, err = finish(job, timeout_s=60)
        assert job.returncode == 0, err
        return out

    lease = json.loads(run("alloc", "-n", "2", "--hold", "--format", "json"))["lease"]["id"]
    status = json.loads(run("status", "--json"))
    assert status["broker"] == str(broker.socket) and status["trust"]["mode"] == "broker"
    assert [x["id"] for x in status["leases"]] == [lease]
    assert json.loads(run("plan", "-n", "2", "--json"))["gpus"]
    assert 'gpualloc_gpus{state="held"} 2' in run("metrics")
    assert json.loads(run("gc", "--json"))["reaped"] == []
    doctor = json.loads(run("doctor", "--json"))
    assert {f["where"] for f in doctor["findings"] if f["check"] == "ledger"} >= {"broker"}
    assert json.loads(run("release", lease, "--json"))["released"][0]["id"] == lease
    assert not broker_leases(broker)


def test_slurm_hooks_go_through_the_broker_or_write_its_ledger_when_none_answers(
    tmp_path: Path,
) -> None:
    if os.geteuid() != 0:
        pytest.skip("the Slurm hooks run as root")
    broker = RunningBroker(TOPOLOGY)
    config = tmp_path / "config.toml"
    config.write_text(
        f'[host]\nbroker = "{broker.socket}"\n\n[broker]\nstate_dir = "{broker.state}"\n'
    )
    broker.system_config = config
    env = {**clean_env(), "GPUALLOC_SYSTEM_CONFIG": str(config), "GPUALLOC_TOPOLOGY": TOPOLOGY}
    job = {"SLURM_JOB_ID": "88", "SLURM_JOB_GPUS": "2,3", "SLURM_JOB_UID": "0"}

    def hook(kind: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "gpualloc", "slurm", kind],
            env={**env, **job}, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert result.returncode == 0
        return result.stderr

    try:
        said = hook("prolog")  # no broker yet: root writes the broker's ledger itself
        assert "does not answer" in said and "recorded GPU 2-3" in said, said
        broker.start()
        (lease,) = broker_leases(broker)
        assert lease["slurm_job"] == "88" and [g["index"] for g in lease["gpus"]] == [2, 3]
        said = hook("epilog")
        assert "released GPU 2-3" in said and "does not answer" not in said, said
        assert not broker_leases(broker)
    finally:
        broker.stop()
        shutil.rmtree(broker.directory, ignore_errors=True)
