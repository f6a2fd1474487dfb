"""The Slurm node hooks (prolog, epilog, taskprolog) without Slurm: slurmd's environment by hand.

A real single-node Slurm exercises the same commands in the Slurm test suite (issue 7, part 2).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

TOPOLOGY = ("--topology", "dgx1-v100")


@pytest.fixture
def slurmd_env(monkeypatch: pytest.MonkeyPatch):
    """Set the variables slurmd gives a Prolog/Epilog for job 42 of uid 1000 with GPUs 0,1."""

    def set_job(job: str = "42", gpus: str = "0,1", uid: str = "1000", user: str = "alice"):
        monkeypatch.setenv("SLURM_JOB_ID", job)
        monkeypatch.setenv("SLURM_JOB_GPUS", gpus)
        monkeypatch.setenv("SLURM_JOB_UID", uid)
        monkeypatch.setenv("SLURM_JOB_USER", user)

    set_job()
    return set_job


def _leases(cli) -> list[dict]:
    result = cli(*TOPOLOGY, "status", "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)["leases"]


def test_prolog_records_the_jobs_gpus_and_gpualloc_run_avoids_them(cli, slurmd_env) -> None:
    result = cli(*TOPOLOGY, "slurm", "prolog")
    assert result.exit_code == 0
    assert "job 42: recorded GPU 0-1 for alice" in result.stderr
    (lease,) = _leases(cli)
    assert lease["slurm_job"] == "42" and lease["uid"] == 1000 and lease["user"] == "alice"
    assert [g["index"] for g in lease["gpus"]] == [0, 1] and lease["source"] == "slurm"
    dry = cli(*TOPOLOGY, "run", "-n", "2", "--dry-run", "--json", "--", "true")
    assert not {0, 1} & set(json.loads(dry.stdout)["placement"]["gpus"])


def test_prolog_twice_replaces_and_epilog_is_idempotent(cli, slurmd_env, tmp_path: Path) -> None:
    assert cli(*TOPOLOGY, "slurm", "prolog").exit_code == 0
    assert cli(*TOPOLOGY, "slurm", "prolog").exit_code == 0
    assert len(_leases(cli)) == 1
    first = cli(*TOPOLOGY, "slurm", "epilog")
    second = cli(*TOPOLOGY, "slurm", "epilog")
    assert first.exit_code == second.exit_code == 0
    assert "released GPU 0-1" in first.stderr and "no lease to release" in second.stderr
    assert _leases(cli) == []
    log = (tmp_path / "state" / "slurm-hooks.log").read_text()
    assert log.count("prolog: job 42: recorded") == 2 and "epilog: job 42: released" in log


def test_epilog_without_a_prolog_or_a_ledger_is_fine(cli, slurmd_env) -> None:
    result = cli(*TOPOLOGY, "slurm", "epilog")
    assert result.exit_code == 0 and "nothing to release" in result.stderr


def test_a_gpu_held_outside_slurm_is_reported_not_taken(cli, slurmd_env) -> None:
    assert cli(*TOPOLOGY, "alloc", "--hold", "--gpus", "1").exit_code == 0
    result = cli(*TOPOLOGY, "slurm", "prolog")
    assert result.exit_code == 0
    assert "Slurm gave it GPU 1, which is also held outside Slurm" in result.stderr
    slurm = [x for x in _leases(cli) if x["source"] == "slurm"]
    assert [g["index"] for g in slurm[0]["gpus"]] == [0]


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"SLURM_JOB_ID": ""}, "SLURM_JOB_ID is not set"),
        ({"SLURM_JOB_UID": "nobody"}, "SLURM_JOB_UID is not a number"),
        ({"SLURM_JOB_GPUS": "0,x"}, "is not a list of indices"),
        ({"SLURM_JOB_GPUS": "0,9"}, "GPU 9 is not in the topology"),
    ],
)
def test_the_prolog_never_fails_the_job(
    cli, slurmd_env, monkeypatch: pytest.MonkeyPatch, variables: dict, message: str
) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    result = cli(*TOPOLOGY, "slurm", "prolog")
    assert result.exit_code == 0  # a non-zero Prolog would drain the node
    assert message in result.stderr


def test_a_broken_state_file_does_not_drain_the_node(cli, slurmd_env, tmp_path: Path) -> None:
    assert cli(*TOPOLOGY, "slurm", "prolog").exit_code == 0
    state = tmp_path / "state"
    for copy in state.glob("ledger@*.good.json"):
        copy.unlink()
    (ledger,) = state.glob("ledger@*.json")  # the good copies are gone
    ledger.write_text('{"schema_version": 2, "leases": [')
    for hook in ("prolog", "epilog"):
        result = cli(*TOPOLOGY, "slurm", hook)
        assert result.exit_code == 0
        assert f"{hook} failed" in result.stderr and "not valid JSON" in result.stderr


@pytest.mark.parametrize(
    ("step_gpus", "visible", "expected"),
    [
        ("0,2,4,6", "0,2,4,6", "0,2,6,4"),  # the all-NVLink ring
        ("0,2,4,6", "0,1,2,3", "0,1,3,2"),  # device cgroups: positions within the step
        ("6,4,2,0", "GPU-a,GPU-b,GPU-c,GPU-d", "GPU-d,GPU-c,GPU-a,GPU-b"),
        ("0,1", "0,1", None),  # a pair has one order
        ("0,2,4", "0,1", None),  # inconsistent: leave it alone
        ("0,2,4", "0,'1',2", None),  # never print what would need quotes
    ],
)
def test_taskprolog_orders_the_step_along_its_best_ring(
    cli, monkeypatch: pytest.MonkeyPatch, step_gpus: str, visible: str, expected: str | None
) -> None:
    monkeypatch.setenv("SLURM_STEP_GPUS", step_gpus)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    result = cli(*TOPOLOGY, "slurm", "taskprolog")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0] == "export CUDA_DEVICE_ORDER=PCI_BUS_ID"
    if expected is None:
        assert lines == lines[:1]
    else:
        assert lines[1] == f"export CUDA_VISIBLE_DEVICES={expected}"
    assert '"' not in result.stdout and "'" not in result.stdout


def test_taskprolog_never_fails_the_task(cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_STEP_GPUS", "0,x")
    result = cli(*TOPOLOGY, "slurm", "taskprolog")
    assert result.exit_code == 0
    assert result.stdout == "export CUDA_DEVICE_ORDER=PCI_BUS_ID\n"
    assert "not a list of indices" in result.stderr
