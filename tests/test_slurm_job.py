"""gpualloc inside a Slurm job: the job's GPUs by identity, and a ledger of the job's own.

The real-Slurm suite (tests/test_slurm_cluster.py) runs the same inside sbatch; these tests set
slurmstepd's variables by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from msgspec.structs import replace

from gpualloc.errors import RequestError
from gpualloc.model.topology import Topology
from gpualloc.slurm.job import slurm_job
from gpualloc.topologies import load_bundled
from tests.slurm_variables import outside_slurm

TOPOLOGY = ("--topology", "dgx1-v100")


def _renumbered(name: str) -> Topology:
    """A bundled topology whose device minor numbers run backwards (GPU 0 is /dev/nvidia3...)."""
    topology = load_bundled(name)
    last = topology.gpu_count - 1
    return replace(topology, gpus=[replace(g, minor_number=last - g.index) for g in topology.gpus])


# ---- which GPUs are the job's ----------------------------------------------------------------


def test_outside_slurm_or_without_gpus_there_is_no_job() -> None:
    topology = load_bundled("nvlink-pairs-4gpu")
    assert slurm_job(topology, {}) is None
    assert slurm_job(topology, {"SLURM_JOB_ID": "7"}) is None  # a job without GPUs
    assert slurm_job(topology, {"SLURM_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": "0,1"}) is None
    opted_out = {"SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "0", "GPUALLOC_NO_SLURM": "1"}
    assert slurm_job(topology, opted_out) is None


def test_slurm_gpu_numbers_are_device_numbers_not_positions() -> None:
    topology = _renumbered("nvlink-pairs-4gpu")
    job = slurm_job(topology, {"SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "0,1"})
    assert job is not None and job.gpus == {3, 2} and job.source == "SLURM_JOB_GPUS"
    step = {"SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "0,1,2,3", "SLURM_STEP_GPUS": "3"}
    assert slurm_job(topology, step).gpus == {0}  # the step's GPUs come first
    # Without minor numbers, /dev/nvidiaN is taken as GPU N (as gres-conf writes it).
    plain = load_bundled("nvlink-pairs-4gpu")
    assert slurm_job(plain, {"SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "0,1"}).gpus == {0, 1}


def test_uuids_in_cuda_visible_devices_are_matched_by_prefix() -> None:
    topology = load_bundled("nvlink-pairs-4gpu")
    uuids = [g.uuid for g in topology.gpus]
    env = {"SLURM_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": f"{uuids[3]},{uuids[1][:12]}"}
    job = slurm_job(topology, env)
    assert job is not None and job.gpus == {3, 1} and job.source == "CUDA_VISIBLE_DEVICES"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SLURM_JOB_GPUS": "0,7"}, "names GPU 7, which is not among"),
        ({"SLURM_JOB_GPUS": "0,x"}, "is not a list of GPU numbers"),
        ({"CUDA_VISIBLE_DEVICES": "GPU-ffff"}, "matches no GPU"),
        ({"CUDA_VISIBLE_DEVICES": "GPU-"}, "matches several GPUs"),
        ({"SLURM_JOB_ID": "../etc", "SLURM_JOB_GPUS": "0"}, "is not a Slurm job id"),
    ],
)
def test_job_gpus_that_cannot_be_found_are_a_clear_error(env: dict, message: str) -> None:
    with pytest.raises(RequestError, match=message.replace("(", r"\(").replace(")", r"\)")):
        slurm_job(load_bundled("nvlink-pairs-4gpu"), {"SLURM_JOB_ID": "7", **env})


# ---- sub-jobs inside the job -------------------------------------------------------------------


@pytest.fixture
def in_job(cli, monkeypatch: pytest.MonkeyPatch):
    """Job 9 of this user on GPUs 4-7 of a DGX-1, recorded by the Prolog as slurmd would."""
    monkeypatch.setenv("SLURM_JOB_ID", "9")
    monkeypatch.setenv("SLURM_JOB_GPUS", "4,5,6,7")
    monkeypatch.setenv("SLURM_JOB_UID", str(__import__("os").geteuid()))
    assert cli(*TOPOLOGY, "slurm", "prolog").exit_code == 0


def _alloc(cli, *args: str) -> tuple[int, list[int]]:
    result = cli(*TOPOLOGY, "alloc", "--hold", "--format", "json", *args)
    gpus = json.loads(result.stdout)["placement"]["gpus"] if result.exit_code == 0 else []
    return result.exit_code, gpus


def test_sub_jobs_of_a_job_land_on_its_nvlinked_pairs(cli, in_job) -> None:
    first = _alloc(cli, "-n", "2", "--sensitive")
    second = _alloc(cli, "-n", "2", "--sensitive")
    assert {frozenset(first[1]), frozenset(second[1])} == {frozenset({4, 7}), frozenset({5, 6})}
    busy = cli(*TOPOLOGY, "alloc", "--hold", "-n", "1")
    assert busy.exit_code == 10 and "not this Slurm job's" not in busy.stderr
    status = json.loads(cli(*TOPOLOGY, "status", "--json").stdout)
    assert status["slurm_job"] == {"id": "9", "gpus": [4, 5, 6, 7]}
    assert [g["state"] for g in status["gpus"]] == ["outside"] * 4 + ["held"] * 4
    assert len(status["leases"]) == 2 and "+slurm-job-9" in status["ledger"]
    with outside_slurm():  # the host ledger still holds the whole job, once
        host = json.loads(cli(*TOPOLOGY, "status", "--json").stdout)
    assert [lease["slurm_job"] for lease in host["leases"]] == ["9"]
    assert host["free"] == [0, 1, 2, 3]


def test_a_job_never_reaches_beyond_its_gpus(cli, in_job) -> None:
    too_many = cli(*TOPOLOGY, "run", "-n", "5", "--", "true")
    assert too_many.exit_code == 9  # never fits the job, even idle: no point waiting
    foreign = cli(*TOPOLOGY, "run", "--gpus", "0", "--", "true")
    assert foreign.exit_code == 2 and "GPU 0 is not this Slurm job's" in foreign.stderr
    assert "it has GPU 4-7" in foreign.stderr
    waiting = cli(*TOPOLOGY, "run", "-n", "5", "--wait", "--", "true")
    assert waiting.exit_code == 9


def test_a_run_inside_the_job_gets_the_jobs_gpus_in_rank_order(cli, in_job) -> None:
    result = cli(*TOPOLOGY, "run", "-n", "4", "--dry-run", "--json", "--", "true")
    assert result.exit_code == 0, result.stderr
    dry = json.loads(result.stdout)
    assert sorted(dry["placement"]["gpus"]) == [4, 5, 6, 7]
    assert dry["environment"]["CUDA_VISIBLE_DEVICES"] == ",".join(
        map(str, dry["placement"]["gpus"])
    )


def test_the_epilog_removes_the_jobs_own_ledger(cli, in_job, tmp_path: Path) -> None:
    assert _alloc(cli, "-n", "2")[0] == 0
    state = tmp_path / "state"
    assert list(state.glob("ledger@*+slurm-job-9.json"))
    result = cli(*TOPOLOGY, "slurm", "epilog")
    assert result.exit_code == 0 and "removed its own ledger (1 sub-job lease)" in result.stderr
    assert not list(state.glob("*slurm-job-9*")) and not list(state.glob("lease-*.lock"))
    again = cli(*TOPOLOGY, "slurm", "epilog")
    assert again.exit_code == 0 and "removed" not in again.stderr


def test_the_taskprolog_maps_slurm_numbers_by_device_number(
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "renumbered.json"
    path.write_text(_renumbered("dgx1-v100").to_json())
    # Slurm numbers 7,5,3,1 are GPUs 0,2,4,6: their best ring is 0,2,6,4 (all NVLink).
    monkeypatch.setenv("SLURM_STEP_GPUS", "7,5,3,1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7,5,3,1")
    result = cli("--topology", str(path), "slurm", "taskprolog")
    assert result.stdout.splitlines()[1] == "export CUDA_VISIBLE_DEVICES=7,5,1,3"


def test_plan_inside_a_job_plans_on_its_gpus(cli, in_job) -> None:
    result = cli(*TOPOLOGY, "plan", "-n", "2", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["gpus"] == [4, 7]  # its NV2 pair
    assert "inside Slurm job 9 (GPU 4-7): planning on its GPUs" in result.stderr
    assert cli(*TOPOLOGY, "plan", "-n", "5").exit_code == 9
