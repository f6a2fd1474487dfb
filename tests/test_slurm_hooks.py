"""The Slurm node hooks (prolog, epilog, taskprolog) without Slurm: slurmd's environment by hand.

A real single-node Slurm exercises the same commands in the Slurm test suite.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from msgspec.structs import replace

from tests.slurm_variables import outside_slurm

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
    with outside_slurm():
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
    with outside_slurm():
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


def test_slurm_is_authoritative_over_a_gpu_held_outside_it(cli, slurmd_env) -> None:
    """A user held GPU 1 before Slurm gave it to job 42. On b2653dd the Prolog
    recorded only GPU 0, and once the user released GPU 1 it went to the next comer while the
    job ran on it. Now the job's lease records both, the user's lease is marked conflicting and
    its owner told, and GPU 1 stays the job's until the Epilog."""
    with outside_slurm():
        held = cli(*TOPOLOGY, "alloc", "--hold", "--gpus", "1", "--format", "json")
        assert held.exit_code == 0, held.stderr
        squatter = json.loads(held.stdout)["lease"]["id"]
    result = cli(*TOPOLOGY, "slurm", "prolog")
    assert result.exit_code == 0
    assert "Slurm gave it GPU 1, which is also held outside Slurm" in result.stderr
    assert "marked conflicting" in result.stderr
    leases = {x["id"]: x for x in _leases(cli)}
    (slurm,) = [x for x in leases.values() if x["source"] == "slurm"]
    assert [g["index"] for g in slurm["gpus"]] == [0, 1]
    assert leases[squatter]["slurm_conflict"] == "42"
    with outside_slurm():
        status = cli(*TOPOLOGY, "status")
        assert f"CONFLICT: lease {squatter}" in status.stderr + status.stdout
        assert "which Slurm gave to job 42" in status.stderr + status.stdout
        metrics = cli(*TOPOLOGY, "metrics")
        assert f'gpualloc_lease_slurm_conflicts{{lease="{squatter}"' in metrics.stdout
        assert cli(*TOPOLOGY, "release", squatter).exit_code == 0
        dry = cli(*TOPOLOGY, "run", "-n", "6", "--dry-run", "--json", "--", "true")
        assert dry.exit_code == 0, dry.stderr
        assert not {0, 1} & set(json.loads(dry.stdout)["placement"]["gpus"])
        again = cli(*TOPOLOGY, "alloc", "--hold", "--gpus", "1")
        assert again.exit_code == 10, "GPU 1 is the job's while it runs"
    assert cli(*TOPOLOGY, "slurm", "epilog").exit_code == 0
    with outside_slurm():
        assert cli(*TOPOLOGY, "alloc", "--hold", "--gpus", "1").exit_code == 0


def test_the_epilog_clears_the_conflict_mark(cli, slurmd_env) -> None:
    with outside_slurm():
        held = cli(*TOPOLOGY, "alloc", "--hold", "--gpus", "1", "--format", "json")
        squatter = json.loads(held.stdout)["lease"]["id"]
    assert cli(*TOPOLOGY, "slurm", "prolog").exit_code == 0
    assert cli(*TOPOLOGY, "slurm", "epilog").exit_code == 0
    (lease,) = _leases(cli)
    assert lease["id"] == squatter and lease["slurm_conflict"] is None


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


# ---- gres.conf --------------------------------------------------------------------------------


def test_gres_conf_links_rows_mirror_the_nvlink_matrix(cli) -> None:
    from gpualloc.topologies import load_bundled

    result = cli(*TOPOLOGY, "slurm", "gres-conf", "--node", "gpu01")
    assert result.exit_code == 0
    lines = [line for line in result.stdout.splitlines() if not line.startswith("#")]
    assert lines[0] == "AutoDetect=off"
    topology = load_bundled("dgx1-v100")
    for gpu, line in enumerate(lines[1:]):
        fields = dict(field.split("=", 1) for field in line.split())
        assert fields["NodeName"] == "gpu01" and fields["File"] == f"/dev/nvidia{gpu}"
        links = [int(x) for x in fields["Links"].split(",")]
        assert links[gpu] == -1
        assert all(
            links[other] == topology.link(gpu, other).nvlinks for other in range(8) if other != gpu
        )
        assert "Cores" not in fields  # a bundled topology has no thread layout to go by
    assert "N = index" in result.stdout  # and says that minor numbers were assumed


def test_gres_conf_cores_follow_slurms_socket_major_numbering(cli) -> None:
    # nvlink-pairs-4gpu: NUMA node 0 holds the even CPUs, node 1 the odd ones.
    result = cli("--topology", "nvlink-pairs-4gpu", "slurm", "gres-conf", "--threads-per-core", "1")
    cores = [line.split("Cores=")[1].split()[0] for line in result.stdout.splitlines()[-4:]]
    assert cores == ["0-5", "0-5", "6-11", "6-11"]
    dgx = cli(*TOPOLOGY, "slurm", "gres-conf", "--threads-per-core", "2").stdout.splitlines()
    assert "Cores=0-19 " in dgx[-8] and "Cores=20-39 " in dgx[-1]  # hyperthreads fold away


def test_sysfs_core_numbers_rank_package_then_core(tmp_path: Path) -> None:
    from gpualloc.slurm.gres import sysfs_core_numbers

    # 2 packages x 2 cores x 2 threads, Linux-style ids: threads 0-3 first, siblings 4-7.
    layout = {
        0: (0, 0),
        1: (0, 1),
        2: (1, 0),
        3: (1, 1),
        4: (0, 0),
        5: (0, 1),
        6: (1, 0),
        7: (1, 1),
    }
    for cpu, (package, core) in layout.items():
        topology = tmp_path / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "physical_package_id").write_text(f"{package}\n")
        (topology / "core_id").write_text(f"{core}\n")
    (tmp_path / "cpufreq").mkdir()  # not a CPU
    assert sysfs_core_numbers(tmp_path) == {0: 0, 1: 1, 2: 2, 3: 3, 4: 0, 5: 1, 6: 2, 7: 3}


def test_gres_conf_uses_known_minor_numbers() -> None:
    from gpualloc.slurm.gres import gres_conf
    from gpualloc.topologies import load_bundled

    topology = load_bundled("nvlink-pairs-4gpu")
    renumbered = replace(
        topology, gpus=[replace(g, minor_number=3 - g.index) for g in topology.gpus]
    )
    text = gres_conf(renumbered, core_numbers={})
    assert "File=/dev/nvidia3 " in text.splitlines()[-4] and "assumes" not in text


ROOT = Path(__file__).parent.parent


def test_the_example_gres_conf_is_what_gres_conf_prints(cli) -> None:
    printed = cli(*TOPOLOGY, "slurm", "gres-conf", "--node", "gpu01", "--threads-per-core", "2")
    example = (ROOT / "examples" / "slurm" / "gres.conf.example").read_text()

    def settings(text: str) -> list[str]:
        return [line for line in text.splitlines() if line and not line.startswith("#")]

    assert settings(example) == settings(printed.stdout)


def test_the_example_wrapper_picks_the_hook_by_its_name(tmp_path: Path) -> None:
    import subprocess

    fake = tmp_path / "gpualloc"
    fake.write_text('#!/bin/sh\necho "$@ state=$GPUALLOC_STATE_DIR"\n')
    fake.chmod(0o755)
    wrapper = ROOT / "examples" / "slurm" / "gpualloc-hook.sh"
    env = {"GPUALLOC_BIN": str(fake)}  # slurmd gives hooks no PATH
    for hook in ("prolog", "epilog", "taskprolog"):
        link = tmp_path / f"gpualloc-{hook}"
        link.symlink_to(wrapper)
        ran = subprocess.run(
            [str(link)], env=env, capture_output=True, text=True, check=True, timeout=120
        )
        assert ran.stdout == f"slurm {hook} state=/var/tmp/gpualloc\n"
    stray = tmp_path / "other-name"
    stray.symlink_to(wrapper)
    ran = subprocess.run([str(stray)], env=env, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0 and "expected gpualloc-prolog" in ran.stderr


# ---- MIG -----------------------------------------------------------------------------------------

MIG = ("--topology", "dgx-a100-mig")
A100 = "nvidia_a100-sxm4-40gb"


def _gres_fields(text: str) -> list[dict[str, str]]:
    return [
        dict(part.split("=", 1) for part in line.split())
        for line in text.splitlines()
        if line.startswith("Name=")
    ]


def test_gres_conf_lists_mig_devices_as_autodetect_nvml_names_them(cli) -> None:
    from gpualloc.slurm.gres import gres_records
    from gpualloc.topologies import load_bundled

    result = cli(*MIG, "slurm", "gres-conf")
    assert result.exit_code == 0, result.stderr
    lines = _gres_fields(result.stdout)
    # 12 MIG devices on GPUs 0-2, then the five whole GPUs 3-7; none of GPUs 0-2 whole.
    assert len(lines) == 17 and not any("Links" in line for line in lines)
    assert [line["File"] for line in lines[12:]] == [f"/dev/nvidia{n}" for n in range(3, 8)]
    assert {line["Type"] for line in lines[12:]} == {A100}
    # GPU1's 3g.20gb devices are GPU instances 1 and 2 (the fixture's), compute instance 0:
    # /dev/nvidia-caps minors 3 + 135 * gpu + 9 * gi, plus 1 + ci.
    threes = [line for line in lines if line["Type"] == f"{A100}_3g.20gb"]
    assert [line["MultipleFiles"] for line in threes] == [
        "/dev/nvidia1,/dev/nvidia-caps/nvidia-cap147,/dev/nvidia-caps/nvidia-cap148",
        "/dev/nvidia1,/dev/nvidia-caps/nvidia-cap156,/dev/nvidia-caps/nvidia-cap157",
    ]
    # Grouped by type in order of first appearance, which is how Slurm numbers them: GPU2's
    # 1g.5gb comes right after GPU0's seven.
    types = [line["Type"].removeprefix(A100) for line in lines]
    assert types[:8] == ["_1g.5gb"] * 8 and types[8:12] == [
        "_3g.20gb", "_3g.20gb", "_4g.20gb", "_2g.10gb"
    ]  # fmt: skip
    assert lines[7]["MultipleFiles"].startswith("/dev/nvidia2,")
    records = gres_records(load_bundled("dgx-a100-mig"))
    assert [(r.gpu, r.mig.device if r.mig else None) for r in records][6:9] == [
        (0, 6), (2, 2), (1, 0)
    ]  # fmt: skip


def test_gres_conf_takes_the_drivers_mig_minors_and_a_gpu_type(cli, tmp_path: Path) -> None:
    from gpualloc.slurm.gres import parse_mig_minors

    table = ["config 1", "monitor 2"]
    # A driver numbering its capabilities from 1000, to tell the table from the formula.
    for gpu in range(3):
        for gi in range(15):
            table.append(f"gpu{gpu}/gi{gi}/access {1000 + 100 * gpu + 2 * gi}")
            table.append(f"gpu{gpu}/gi{gi}/ci0/access {1001 + 100 * gpu + 2 * gi}")
    minors = tmp_path / "mig-minors"
    minors.write_text("\n".join(table) + "\n")
    assert parse_mig_minors(minors.read_text())[(1, 2, 0)] == 1105
    result = cli(*MIG, "slurm", "gres-conf", "--mig-minors", str(minors), "--gpu-type", "a100")
    assert result.exit_code == 0, result.stderr
    lines = _gres_fields(result.stdout)
    assert lines[9] == {
        "Name": "gpu",
        "Type": "a100_3g.20gb",
        "MultipleFiles": "/dev/nvidia1,/dev/nvidia-caps/nvidia-cap1104,"
        "/dev/nvidia-caps/nvidia-cap1105",
    }
    assert lines[-1]["Type"] == "a100" and "computed" not in result.stdout
    # A table that lacks a GPU instance of the layout is the wrong host's: refused, one line.
    minors.write_text("\n".join(line for line in table if not line.startswith("gpu1/gi2/")))
    refused = cli(*MIG, "slurm", "gres-conf", "--mig-minors", str(minors))
    assert refused.exit_code == 5 and "has no gpu1/gi2/access" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_prolog_on_a_mig_host_leases_the_mig_devices_slurm_numbered(cli, slurmd_env) -> None:
    # Slurm's numbers are positions in gres.conf: 7 is GPU2's 1g.5gb, 9 GPU1's second 3g.20gb,
    # 12 the first whole GPU (GPU 3).
    slurmd_env(gpus="7,9,12")
    result = cli(*MIG, "slurm", "prolog")
    assert result.exit_code == 0, result.stderr
    assert "recorded GPU 3, GPU2/MIG2 (1g.5gb), GPU1/MIG1 (3g.20gb) for alice" in result.stderr
    with outside_slurm():
        status = json.loads(cli(*MIG, "status", "--json").stdout)
        taken = cli(*MIG, "run", "--mig", "GPU1/MIG1", "--", "true")
    (lease,) = status["leases"]
    assert [(m["gpu"], m["device"]) for m in lease["mig"]] == [(2, 2), (1, 1)]
    assert taken.exit_code == 10 and "slurm job 42" in taken.stderr
    assert "released GPU 3, GPU2/MIG2" in cli(*MIG, "slurm", "epilog").stderr


def test_taskprolog_names_mig_devices_by_uuid(cli, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpualloc.topologies import load_bundled

    monkeypatch.setenv("SLURM_STEP_GPUS", "8")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "8")  # what Slurm sets: meaningless to CUDA
    result = cli(*MIG, "slurm", "taskprolog")
    uuid = load_bundled("dgx-a100-mig").mig_device(1, 0).uuid
    assert result.stdout.splitlines() == [
        "export CUDA_DEVICE_ORDER=PCI_BUS_ID",
        f"export CUDA_VISIBLE_DEVICES={uuid}",
    ]
