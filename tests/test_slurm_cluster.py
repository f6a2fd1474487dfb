"""gpualloc's Slurm hooks and sub-jobs against a real single-node Slurm.

Runs where Slurm 22.05 (Debian ``slurm-wlm``) and munge are installed and the suite runs as
root (``.ci/run`` installs them); elsewhere every test here is skipped with the reason. The
node has four fake GPUs described by a recorded topology: NVLink pairs 0-1 and 2-3 (as in the
verification of Slurm's choice the issue quotes).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpualloc.host.slurm_hooks import best_ring
from gpualloc.model.topology import Topology
from gpualloc.topologies import load_bundled
from tests.slurm_cluster import SlurmCluster, unavailable

WHY_NOT = unavailable()
pytestmark = [
    pytest.mark.slurm,
    pytest.mark.slow,
    pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or ""),
]


def _crossed(directory: Path) -> Path:
    """nvlink-pairs-4gpu renumbered so that its NVLink pairs are 0-2 and 1-3: a host where
    Slurm's order of a 4-GPU step (0,1,2,3) is the worst ring."""
    data = json.loads(load_bundled("nvlink-pairs-4gpu").to_json())
    new = {0: 0, 1: 2, 2: 1, 3: 3}
    for gpu in data["gpus"]:
        gpu["index"] = new[gpu["index"]]
    data["gpus"].sort(key=lambda gpu: gpu["index"])
    for link in data["links"]:
        link["a"], link["b"] = sorted((new[link["a"]], new[link["b"]]))
    data["name"] = "nvlink-crossed-4gpu"
    path = directory / "nvlink-crossed-4gpu.json"
    path.write_text(json.dumps(data))
    return path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    path = tmp_path_factory.mktemp("topology") / "nvlink-pairs-4gpu.json"
    path.write_text(load_bundled("nvlink-pairs-4gpu").to_json())
    started = SlurmCluster.start(path)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(autouse=True)
def idle_afterwards(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test leaves the cluster idle: no job, no lease, the node not drained."""
    yield
    if "cluster" not in request.fixturenames:
        return
    cluster: SlurmCluster = request.getfixturevalue("cluster")
    cluster.run("scancel", "--user=root", check=False)
    cluster.wait_for("the queue to drain", lambda: not cluster.run("squeue", "-h").stdout.strip())
    cluster.wait_for("the Epilogs", lambda: not cluster.host_status()["leases"])
    assert cluster.settled_node_state().startswith("idle"), cluster.logs()


def _running(cluster: SlurmCluster, job: str) -> dict:
    """Wait until ``job`` runs and its Prolog has recorded it; its lease in the host ledger."""
    cluster.wait_for(f"job {job} to run", lambda: cluster.job_state(job) == "RUNNING")

    def lease() -> dict | None:
        found = [x for x in cluster.host_status()["leases"] if x["slurm_job"] == job]
        return found[0] if found else None

    return cluster.wait_for(f"job {job}'s lease", lease)  # type: ignore[return-value]


def _gpus(lease: dict) -> list[int]:
    return [gpu["index"] for gpu in lease["gpus"]]


def test_the_prolog_lease_is_seen_and_avoided_outside_slurm(cluster: SlurmCluster) -> None:
    job = cluster.sbatch("sleep 300", "--gres=gpu:2")
    lease = _running(cluster, job)
    assert _gpus(lease) == [0, 1] and lease["source"] == "slurm" and lease["uid"] == 0
    listed = cluster.run("gpualloc", "status").stdout
    assert f"slurm job {job}" in listed
    outside = cluster.run("gpualloc", "run", "-n", "2", "--", "printenv", "CUDA_VISIBLE_DEVICES")
    assert outside.stdout.strip() == "2,3"

    cluster.run("scancel", job)
    cluster.wait_for("the Epilog", lambda: not cluster.host_status()["leases"])
    assert f"epilog: job {job}: released GPU 0-1" in cluster.hook_log()
    # The Epilog once more, by hand, in slurmd's bare environment: nothing to do, still 0.
    again = cluster.run(
        str(cluster.directory / "hooks" / "gpualloc-epilog"), check=False, SLURM_JOB_ID=job
    )
    assert again.returncode == 0 and f"job {job}: no lease to release" in again.stderr
    assert cluster.settled_node_state().startswith("idle")


def test_the_taskprolog_exports_reach_the_job(cluster: SlurmCluster) -> None:
    out = cluster.run(
        "srun", "--gres=gpu:4", "sh", "-c", 'echo "$CUDA_DEVICE_ORDER $CUDA_VISIBLE_DEVICES"'
    )
    ring = best_ring(load_bundled("nvlink-pairs-4gpu"), (0, 1, 2, 3))
    assert out.stdout.split() == ["PCI_BUS_ID", ",".join(map(str, ring))]


def test_the_taskprolog_reorders_a_step_along_its_nvlinks(tmp_path: Path) -> None:
    topology = _crossed(tmp_path)
    crossed = SlurmCluster.start(topology)
    try:
        out = crossed.run(
            "srun", "--gres=gpu:4", "sh", "-c", 'echo "$SLURM_STEP_GPUS $CUDA_VISIBLE_DEVICES"'
        )
    finally:
        crossed.stop()
    slurms, ordered = out.stdout.split()
    ring = [int(x) for x in ordered.split(",")]
    neighbours = {frozenset((ring[i], ring[i - 1])) for i in range(4)}
    # Slurm lists 0,1,2,3, a ring of PCIe hops only; in the new order both NVLinks are hops.
    assert slurms == "0,1,2,3" and {frozenset({0, 2}), frozenset({1, 3})} <= neighbours
    assert ring == list(best_ring(Topology.from_json(topology.read_text()), (0, 1, 2, 3)))


def test_sub_jobs_of_a_batch_job_land_on_the_nvlinked_pairs(cluster: SlurmCluster) -> None:
    script = """
for name in a b; do
  gpualloc run -n 2 --sensitive -- sh -c '
    echo "$CUDA_VISIBLE_DEVICES" > "sub.$1.$SLURM_JOB_ID"
    while [ ! -e "go.$SLURM_JOB_ID" ]; do sleep 0.1; done' sh "$name" &
done
wait
"""
    job = cluster.sbatch(script, "--gres=gpu:4")
    lease = _running(cluster, job)
    outputs = [cluster.directory / f"sub.{name}.{job}" for name in "ab"]
    cluster.wait_for(
        "both sub-jobs to start", lambda: all(p.exists() and p.read_text() for p in outputs)
    )
    placed = {frozenset(map(int, p.read_text().split(","))) for p in outputs}
    assert placed == {frozenset({0, 1}), frozenset({2, 3})}, cluster.logs()
    # The host ledger holds the whole job once; the sub-jobs live in the job's own ledger.
    assert _gpus(lease) == [0, 1, 2, 3]
    assert [x["slurm_job"] for x in cluster.host_status()["leases"]] == [job]
    assert list(cluster.state_dir.glob(f"ledger@*+slurm-job-{job}.json"))

    (cluster.directory / f"go.{job}").touch()
    cluster.wait_for(f"job {job} to end", lambda: cluster.job_state(job) == "GONE")
    cluster.wait_for("the Epilog", lambda: not cluster.host_status()["leases"])
    assert not list(cluster.state_dir.glob(f"*slurm-job-{job}*"))
    assert "removed its own ledger (2 sub-job leases)" in cluster.hook_log()


def test_slurms_choice_next_to_gpualloc_s(
    cluster: SlurmCluster, summary: Callable[[str], None]
) -> None:
    holder = cluster.sbatch("sleep 300", "--gres=gpu:1")
    assert _gpus(_running(cluster, holder)) == [0]
    by_slurm = cluster.run("srun", "--gres=gpu:2", "printenv", "SLURM_STEP_GPUS").stdout.strip()
    cluster.wait_for(  # the srun job's Epilog, which may still be running
        "the srun job's Epilog",
        lambda: [x["slurm_job"] for x in cluster.host_status()["leases"]] == [holder],
    )

    def would_pick(*policy: str) -> str:
        dry = ("run", "--dry-run", "--json", "-n", "2", "--sensitive", *policy, "--", "true")
        out = cluster.run("gpualloc", *dry)
        return ",".join(map(str, sorted(json.loads(out.stdout)["placement"]["gpus"])))

    mine = would_pick()
    summary(f"GPU 0 busy, 2 GPUs wanted: Slurm 22.05 gave {by_slurm}, gpualloc picks {mine}")
    assert would_pick("--policy", "slurm") == by_slurm  # the baseline is Slurm's real choice
    assert by_slurm == "1,2" and mine == "2,3"  # NVLink pairs are 0-1 and 2-3


def test_a_broken_state_file_does_not_drain_the_node(cluster: SlurmCluster) -> None:
    cluster.run("srun", "--gres=gpu:1", "true")  # its Prolog creates the host ledger
    cluster.wait_for("the Epilog", lambda: not cluster.host_status()["leases"])
    cluster.settled_node_state()
    (ledger,) = [
        path for path in cluster.state_dir.glob("ledger@*.json") if ".good." not in path.name
    ]
    for copy in cluster.state_dir.glob("ledger@*.good.json"):
        copy.unlink()
    ledger.write_text('{"schema_version": 2, "leases": [')
    try:
        ran = cluster.run("srun", "--gres=gpu:1", "echo", "ran", check=False)
        assert ran.returncode == 0 and ran.stdout.strip() == "ran"
        assert cluster.settled_node_state().startswith("idle"), cluster.logs()
        log = cluster.hook_log()
        assert "prolog: job" in log and "prolog failed" in log and "not valid JSON" in log
    finally:
        ledger.unlink()


def test_mig_devices_as_gres_conf_lists_them(tmp_path: Path) -> None:
    """On a MIG host Slurm numbers the gres.conf records by position; the Prolog leases the MIG
    devices Slurm gave and the TaskProlog names them by UUID."""
    topology = load_bundled("dgx-a100-mig")
    path = tmp_path / "dgx-a100-mig.json"
    path.write_text(topology.to_json())
    mig = SlurmCluster.start(path)
    a100 = "nvidia_a100-sxm4-40gb"
    try:
        # All eight 1g.5gb devices: seven on GPU0, one on GPU2, which gres.conf lists next to
        # them; were Slurm numbering in another order, the ledger would show other devices.
        ones = mig.sbatch("sleep 300", f"--gres=gpu:{a100}_1g.5gb:8")
        lease = _running(mig, ones)
        held = {(m["gpu"], m["device"]) for m in lease["mig"]}
        assert held == {(0, d) for d in range(7)} | {(2, 2)} and lease["gpus"] == []
        refused = mig.run("gpualloc", "run", "--mig", "1g.5gb", "--", "true", check=False)
        assert refused.returncode == 10 and f"slurm job {ones}" in refused.stderr
        # A 3g.20gb step: the task gets its MIG UUID, the ledger shows the same device.
        step = mig.run(
            "srun", f"--gres=gpu:{a100}_3g.20gb:1", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES"
        )
        uuids = {m.uuid: m.label for m in topology.mig_on(1)}
        assert step.stdout.strip() in uuids, step.stdout
        assert f"{uuids[step.stdout.strip()]} (3g.20gb) for root" in mig.hook_log()
        # Whole GPUs 3-7 are typed too and numbered after the MIG devices.
        whole = mig.run("srun", f"--gres=gpu:{a100}:2", "printenv", "SLURM_STEP_GPUS")
        assert whole.stdout.strip() == "12,13" and "recorded GPU 3-4 for root" in mig.hook_log()
        mig.run("scancel", ones)
        mig.wait_for("the Epilogs", lambda: not mig.host_status()["leases"])
    finally:
        mig.stop()
