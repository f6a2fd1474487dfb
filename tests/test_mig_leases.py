"""MIG leases: best fit, packing, whole GPUs kept off MIG-mode GPUs, the
job's environment, the ledger, the queue and status, on the bundled dgx-a100-mig host.

dgx-a100-mig: GPU0 7 x 1g.5gb (MIG0-6), GPU1 2 x 3g.20gb (MIG0 20224 MiB, MIG1 20096 MiB),
GPU2 4g.20gb (MIG0) + 2g.10gb (MIG1) + 1g.5gb (MIG2), GPUs 3-7 whole.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from gpualloc.errors import ExitCode
from gpualloc.ledger.schema import Lease, LeasedMig, Ledger
from gpualloc.model.mig import MigRequest, parse_mig_profile
from gpualloc.model.validation import ValidationError, from_builtins
from gpualloc.placement.want import Want
from gpualloc.topologies import load_bundled
from tests.cli_harness import gpualloc
from tests.leases import want_of_options
from tests.recordings import recorded

HOST = ("--topology", "dgx-a100-mig")


def take(cli, *args: str) -> dict:
    """``alloc --hold ARGS --format json`` -> its JSON (the test fails on any error)."""
    result = cli(*HOST, "alloc", "--hold", "--format", "json", *args)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def device_of(allocation: dict) -> str:
    return allocation["environment"]["GPUALLOC_MIG"]


def test_a_whole_gpu_request_never_takes_a_gpu_in_mig_mode(cli) -> None:
    plan = json.loads(cli(*HOST, "plan", "-n", "2", "--json").stdout)
    assert not set(plan["gpus"]) & {0, 1, 2}
    five = take(cli, "-n", "5")
    assert sorted(int(g) for g in five["environment"]["GPUALLOC_GPUS"].split(",")) == [
        3,
        4,
        5,
        6,
        7,
    ]
    result = cli(*HOST, "alloc", "--hold", "-n", "6")
    assert result.exit_code == ExitCode.NO_PLACEMENT
    assert "GPU 0-2 in MIG mode cannot be leased whole" in result.stderr
    assert "--mig" in result.stderr
    result = cli(*HOST, "alloc", "--hold", "--gpus", "1")
    assert result.exit_code == ExitCode.USAGE
    assert "GPU 1 is in MIG mode" in result.stderr
    planned = cli(*HOST, "plan", "-n", "6")
    assert planned.exit_code == ExitCode.NO_PLACEMENT
    assert "GPU 0-2 in MIG mode cannot be leased whole" in planned.stderr
    assert "--mig" in planned.stderr


def test_best_fit_packs_small_requests(cli) -> None:
    assert device_of(take(cli, "--mig", "1g.5gb")) == "GPU0/MIG0"
    assert device_of(take(cli, "--mig", "1g.5gb")) == "GPU0/MIG1"  # same GPU, next device
    # --mem: the smallest device with that much memory, not the first that fits.
    assert device_of(take(cli, "--mem", "8G")) == "GPU2/MIG1"  # 2g.10gb, not a 3g.20gb
    assert device_of(take(cli, "--mem", "10G")) == "GPU1/MIG1"  # 20096 MiB before 20224 MiB
    assert device_of(take(cli, "--mem", "10G")) == "GPU1/MIG0"
    assert device_of(take(cli, "--mem", "10G")) == "GPU2/MIG0"  # 4g.20gb: the last that fits
    result = cli(*HOST, "alloc", "--hold", "--mem", "10G")
    assert result.exit_code == ExitCode.BUSY
    assert "every MIG device that is >= 10 GiB is held now" in result.stderr
    assert "GPU1/MIG0 (3g.20gb) held by" in result.stderr  # who to ask
    assert "GPU0/MIG0" not in result.stderr  # holders of devices too small are not named


def test_a_gpu_already_in_use_is_filled_first(cli) -> None:
    take(cli, "--mig", "GPU2/MIG0")
    plan = cli(*HOST, "plan", "--mig", "1g.5gb", "--busy", "GPU2/MIG0").stdout
    assert plan.startswith("GPU2/MIG2 (1g.5gb, 4.75 GiB): the smallest free MIG device")
    assert "packed onto GPU2, 1 of whose 3 MIG devices are in use" in plan
    assert device_of(take(cli, "--mig", "1g.5gb")) == "GPU2/MIG2"  # GPU0 stays wholly free
    assert device_of(take(cli, "--mig", "1g.5gb")) == "GPU0/MIG0"


def test_a_device_by_label_or_uuid(cli) -> None:
    uuid = load_bundled("dgx-a100-mig").mig_on(1)[0].uuid
    assert uuid is not None
    first = take(cli, "--mig", uuid.lower())
    assert first["environment"]["CUDA_VISIBLE_DEVICES"] == uuid
    result = cli(*HOST, "alloc", "--hold", "--mig", "GPU1/MIG0")
    assert result.exit_code == ExitCode.BUSY
    assert device_of(take(cli, "--mig", "1/1")) == "GPU1/MIG1"


def test_the_lease_records_the_mig_device(cli) -> None:
    allocation = take(cli, "--mig", "3g.20gb", "--name", "notebook")
    placement = allocation["placement"]
    assert (placement["gpus"], placement["mig_devices"]) == ([], ["GPU1/MIG1"])
    assert placement["numa_nodes"] == [3]  # GPU1's node
    assert placement["scores"] == {} and allocation["lease"]["scores"] == {}  # no link to score
    assert allocation["lease"]["gpus"] == []
    assert allocation["lease"]["mig"] == [
        {
            "gpu": 1,
            "device": 1,
            "profile": "3g.20gb",
            "uuid": load_bundled("dgx-a100-mig").mig_on(1)[1].uuid,
        }
    ]
    status = cli(*HOST, "status")
    row = next(line for line in status.stdout.splitlines() if line.strip().startswith("GPU1/MIG1"))
    assert row.split()[1:3] == ["3g.20gb", "held"] and "notebook" in row
    assert "11 of 12 MIG devices free" in status.stdout
    data = json.loads(cli(*HOST, "status", "--json").stdout)
    assert data["gpus"][1]["state"] == "mig"
    held = [d for d in data["mig_devices"] if d["lease"]]
    assert [d["device"] for d in held] == ["GPU1/MIG1"]
    released = cli(*HOST, "release", allocation["lease"]["id"])
    assert released.exit_code == 0
    assert "released GPU1/MIG1 (3g.20gb) held by" in released.stdout


def test_run_exports_the_mig_uuid_and_frees_the_device_when_the_job_ends(
    cli, tmp_path: Path
) -> None:
    out = tmp_path / "env.txt"
    script = f'echo "$CUDA_VISIBLE_DEVICES $GPUALLOC_MIG $GPUALLOC_GPUS" > {out}'
    result = gpualloc(
        "run", "--mig", "2g.10gb", "--", "sh", "-c", script, topology="dgx-a100-mig"
    )  # a real subprocess: run execs the job in its own process
    assert result.returncode == 0, result.stderr
    assert "lease " in result.stderr and ": GPU2/MIG1 (2g.10gb)" in result.stderr
    uuid = load_bundled("dgx-a100-mig").mig_on(2)[1].uuid
    assert out.read_text().split() == [uuid, "GPU2/MIG1", "2"]
    data = json.loads(cli(*HOST, "status", "--json").stdout)
    assert not [d for d in data["mig_devices"] if d["lease"]]


def test_dry_run_shows_the_mig_device_and_the_numa_node_of_its_gpu(cli) -> None:
    result = cli(*HOST, "run", "--mig", "1g.5gb", "--dry-run", "--", "python", "x.py")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("would run on GPU0/MIG0 (1g.5gb, 4.75 GiB)")
    assert "numactl --cpunodebind=3 --membind=3" in result.stdout  # GPU0's node
    assert "GPUALLOC_MIG=GPU0/MIG0" in result.stdout


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("-n", "2", "--mig", "1g.5gb"), ExitCode.USAGE, "-n applies to whole GPUs"),
        (("--mig", "1g.5gb", "--exclude", "0"), ExitCode.USAGE, "--exclude applies"),
        (("--mig", "big"), ExitCode.USAGE, "neither a MIG profile nor a MIG device"),
        (("--mem", "lots"), ExitCode.USAGE, "is not a memory size"),
        (("--mig", "2g.20gb"), ExitCode.NO_PLACEMENT, "no GPU here has MIG profile 2g.20gb"),
        (("--mem", "50G"), ExitCode.NO_PLACEMENT, "no MIG device here is >= 50 GiB"),
        (("--mig", "GPU5/MIG0"), ExitCode.NO_PLACEMENT, "no MIG device here is GPU5/MIG0"),
    ],
)
def test_mig_requests_that_cannot_be_met_say_why(cli, args, code, message) -> None:
    result = cli(*HOST, "alloc", "--hold", *args)
    assert result.exit_code == code
    assert message in result.stderr
    assert "hint:" in result.stderr and "Traceback" not in result.stderr


def test_a_host_without_mig(cli) -> None:
    result = cli("--topology", "dgx-a100", "alloc", "--hold", "--mig", "1g.5gb")
    assert result.exit_code == ExitCode.NO_PLACEMENT
    assert "this host has no MIG device" in result.stderr


def test_mig_devices_without_a_uuid_cannot_be_leased(cli, tmp_path: Path) -> None:
    """From 'mig -lgi' and the nvidia-smi table: devices known, but CUDA cannot name them."""
    files = []
    for name in (
        "1gpu_rtx-pro-6000_wsl2_empty-affinity_topo.txt",
        "mig_lgi_a100-40gb_2x3g.20gb.txt",
        "mig_nvidia-smi-table_2x3g.20gb_TOP-CUT.txt",
    ):
        files.append(tmp_path / name)
        files[-1].write_text(recorded(name))
    host = tmp_path / "host.json"
    result = cli(
        "topo",
        "import",
        str(files[0]),
        "--mig",
        str(files[1]),
        "--mig",
        str(files[2]),
        "-o",
        str(host),
    )
    assert result.exit_code == 0, result.stderr
    result = cli("--topology", str(host), "alloc", "--hold", "--mig", "3g.20gb")
    assert result.exit_code == ExitCode.NO_PLACEMENT
    assert "have no known UUID" in result.stderr


def test_the_ledger_refuses_a_mig_device_held_twice() -> None:
    def lease(lease_id: str, device: int) -> dict:
        return {
            "id": lease_id,
            "mig": [{"gpu": 0, "device": device}],
            "uid": 0,
            "user": "root",
            "created": datetime.now(timezone.utc).isoformat(),
            "source": "alloc",
        }

    ok = from_builtins({"host": "h", "leases": [lease("a" * 12, 0), lease("b" * 12, 1)]}, Ledger)
    assert ok.held_mig()[(0, 1)].id == "b" * 12
    with pytest.raises(ValidationError, match="MIG device GPU0/MIG0 is held by leases"):
        from_builtins({"host": "h", "leases": [lease("a" * 12, 0), lease("b" * 12, 0)]}, Ledger)
    empty = {**lease("c" * 12, 0), "mig": []}
    with pytest.raises(ValidationError, match="neither a GPU nor a MIG device"):
        from_builtins(empty, Lease)
    assert LeasedMig(gpu=0, device=3).key == (0, 3)


def test_a_queued_mig_request_is_the_same_request_for_whoever_places_it() -> None:
    want = want_of_options(mig="3g.20gb", mem="12G")
    assert want.mig == MigRequest(profile="3g.20gb", memory_bytes=12 * 1024**3)
    assert Want.from_queued(want.queued()).mig == want.mig
    by_uuid = want_of_options(mig="MIG-abc")
    assert Want.from_queued(by_uuid.queued()).mig == MigRequest(uuid="MIG-abc")
    assert parse_mig_profile(want.mig.profile or "").slices == 3
    assert want_of_options(mem="4.5GiB").mig == MigRequest(memory_bytes=int(4.5 * 1024**3))


def test_wait_for_a_mig_device_shows_in_the_queue_and_gets_it(cli) -> None:
    """A waiter for a held MIG device times out with exit 124; the queue said what it wants."""
    take(cli, "--mig", "GPU2/MIG1")
    result = cli(*HOST, "alloc", "--hold", "--mig", "2g.10gb", "--wait", "--timeout", "1s")
    assert result.exit_code == ExitCode.TIMEOUT
    assert "GPU2/MIG1" in result.stderr


# ---- processes on MIG devices outside gpualloc --------------------------------------------------


def test_nvml_names_the_mig_device_a_foreign_process_runs_on(monkeypatch: pytest.MonkeyPatch):
    """NVML lists a MIG device's processes on the parent GPU with their GPU and compute
    instance ids: GI 1 / CI 0 of GPU 1 is GPU1/MIG0 in dgx-a100-mig."""
    from gpualloc.discovery import nvml as nvml_source
    from gpualloc.discovery.live import live_processes
    from gpualloc.ledger.occupancy import Occupancy
    from tests.fake_nvml import FakeNvml

    topology = load_bundled("dgx-a100-mig")
    fake = FakeNvml.from_topology(topology)
    fake.gpus[1].mig_processes = [(4_000_000, 2**30, 1, 0)]
    fake.gpus[4].processes = [(4_000_001, None)]  # a whole GPU: no instance ids
    monkeypatch.setattr(nvml_source, "load_pynvml", lambda: fake)
    report = live_processes(topology)
    on_mig, whole = report.processes
    assert (on_mig.gpu, on_mig.gpu_instance, on_mig.compute_instance) == (1, 1, 0)
    assert (whole.gpu, whole.gpu_instance) == (4, None)
    occupancy = Occupancy.build(topology, Ledger(host="h"), report.processes)
    assert list(occupancy.mig_foreign) == [(1, 0)]
    assert "GPU1/MIG0 runs pid 4000000" in occupancy.mig_taken()[(1, 0)]
    ignoring = Occupancy.build(topology, Ledger(host="h"), report.processes, ignore_foreign=True)
    assert ignoring.mig_taken() == {}


def test_a_mig_device_busy_outside_gpualloc_is_not_leased(cli, tmp_path: Path) -> None:
    data = json.loads(load_bundled("dgx-a100-mig").to_json())
    data["processes"] = [
        {"gpu": 1, "pid": 4242, "name": "python", "user": "eve", "gpu_instance": 2,
         "compute_instance": 0}
    ]  # fmt: skip
    path = tmp_path / "busy-mig.json"
    path.write_text(json.dumps(data))
    host = ("--topology", str(path))
    first = cli(*host, "alloc", "--hold", "--mig", "3g.20gb", "--format", "json")
    assert json.loads(first.stdout)["environment"]["GPUALLOC_MIG"] == "GPU1/MIG0"
    second = cli(*host, "alloc", "--hold", "--mig", "3g.20gb")
    assert second.exit_code == ExitCode.BUSY
    assert "GPU1/MIG1 runs pid 4242 (python, eve), not through gpualloc" in second.stderr
    status = json.loads(cli(*host, "status", "--json").stdout)
    (mig1,) = [m for m in status["mig_devices"] if m["device"] == "GPU1/MIG1"]
    assert mig1["lease"] is None and [p["pid"] for p in mig1["processes"]] == [4242]
    assert "GPU1/MIG1  3g.20gb  foreign  eve" in cli(*host, "status").stdout
    ignoring = cli(*host, "alloc", "--hold", "--mig", "3g.20gb", "--ignore-foreign")
    assert ignoring.exit_code == 0, ignoring.stderr
