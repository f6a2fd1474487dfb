"""The ``gpu`` tier: gpualloc on a real NVIDIA driver and GPU (``pytest -m gpu``).

Every test here skips, saying why, unless a real driver answers: ``libcuda.so.1`` loads,
``cuInit`` succeeds and CUDA shows at least one device (NVIDIA's mock NVML has no CUDA driver, so
this tier skips under it too). ``scripts/device_check.sh`` runs it on a GPU machine together with
the recordings it saves. A real CUDA process here is ``tests/cuda_context.py``: the CUDA driver
API through ``ctypes``, no torch, so the tier needs nothing beyond gpualloc's own dependencies.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpualloc.discovery.nvml import normalise_bus_id
from tests.child_processes import finish

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

CUDA_CONTEXT = Path(__file__).with_name("cuda_context.py")
GPUALLOC = [sys.executable, "-m", "gpualloc"]


def _real_driver_missing() -> str | None:
    """Why there is no real NVIDIA driver and GPU here, or None when there is."""
    if os.environ.get("MOCK_NVML_CONFIG"):
        return "MOCK_NVML_CONFIG is set: NVIDIA's mock NVML is not a real driver"
    probe = subprocess.run(
        [sys.executable, str(CUDA_CONTEXT), "--no-allocate"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    try:
        report = json.loads(probe.stdout)
    except ValueError:
        return f"no real CUDA driver: the probe exited {probe.returncode}: {probe.stderr[-200:]}"
    if "error" in report:
        return f"no real CUDA driver: {report['error']}"
    if not report["devices"]:
        return "the CUDA driver shows no device"
    return None


@pytest.fixture(autouse=True)
def _needs_real_gpu() -> None:
    missing = _real_driver_missing_once()
    if missing:
        pytest.skip(missing)


@functools.cache
def _real_driver_missing_once() -> str | None:
    return _real_driver_missing()


def gpualloc(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [*GPUALLOC, *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and done.returncode != 0:
        raise AssertionError(f"gpualloc {' '.join(args)} exited {done.returncode}:\n{done.stderr}")
    return done


def gpualloc_json(*args: str) -> Any:
    return json.loads(gpualloc(*args, "--json").stdout)


def cuda_view(env: dict[str, str] | None = None) -> dict[str, Any]:
    """What CUDA itself shows a process (in PCI bus order, as gpualloc's jobs run)."""
    environment = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    environment.update({"CUDA_DEVICE_ORDER": "PCI_BUS_ID", **(env or {})})
    done = subprocess.run(
        [sys.executable, str(CUDA_CONTEXT), "--no-allocate"],
        capture_output=True, text=True, timeout=60, env=environment, check=True,
    )  # fmt: skip
    return json.loads(done.stdout)


def nvidia_smi_gpus() -> list[dict[str, str]]:
    done = subprocess.run(
        ["nvidia-smi", "--query-gpu=index,name,pci.bus_id,uuid,memory.total",
         "--format=csv,noheader,nounits"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    keys = ("index", "name", "bus_id", "uuid", "memory_mib")
    return [
        dict(zip(keys, (cell.strip() for cell in line.split(",")), strict=True))
        for line in done.stdout.strip().splitlines()
    ]


def test_discovery_names_the_gpus_nvidia_smi_and_cuda_see() -> None:
    topology = gpualloc_json("topo", "show")
    assert topology["provenance"]["source"] == "nvml"
    gpus = topology["gpus"]
    smi = nvidia_smi_gpus()
    assert [g["index"] for g in gpus] == [int(s["index"]) for s in smi]
    for gpu, seen in zip(gpus, smi, strict=True):
        assert gpu["name"] == seen["name"]
        assert gpu["uuid"] == seen["uuid"]
        assert normalise_bus_id(gpu["pci_bus_id"]) == normalise_bus_id(seen["bus_id"])
        assert gpu["memory_total_bytes"] == int(seen["memory_mib"]) * 2**20
        assert gpu["health"] == "ok"
    cuda_buses = [normalise_bus_id(d["bus_id"]) for d in cuda_view()["devices"]]
    assert sorted(cuda_buses) == sorted(normalise_bus_id(g["pci_bus_id"]) for g in gpus)


def test_run_gives_a_cuda_process_the_gpu_it_leased_and_frees_it_on_exit() -> None:
    topology = gpualloc_json("topo", "show")
    bus_of = {g["index"]: normalise_bus_id(g["pci_bus_id"]) for g in topology["gpus"]}
    done = gpualloc("run", "-n", "1", "--", sys.executable, str(CUDA_CONTEXT))
    job = json.loads(done.stdout.strip().splitlines()[-1])
    assert job["order"] == "PCI_BUS_ID"
    leased = [int(index) for index in job["leased"].split(",")]
    assert len(job["devices"]) == 1, "CUDA showed the job more GPUs than it leased"
    assert normalise_bus_id(job["devices"][0]["bus_id"]) == bus_of[leased[0]]
    status = gpualloc_json("status")
    assert status["gpus"][leased[0]]["state"] == "free"
    assert not [g for g in status["gpus"] if g["lease"]], "a lease outlived its job"


def test_a_cuda_process_started_outside_gpualloc_is_seen_and_avoided() -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    holder = subprocess.Popen(
        [sys.executable, str(CUDA_CONTEXT), "--hold", "120"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert holder.stdout is not None
        ready = json.loads(holder.stdout.readline())
        assert "error" not in ready, ready
        bus = normalise_bus_id(ready["devices"][0]["bus_id"])
        index = next(
            g["index"] for g in gpualloc_json("topo", "show")["gpus"]
            if normalise_bus_id(g["pci_bus_id"]) == bus
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while True:  # NVML lists a context's process once the driver has accounted it
            gpu = gpualloc_json("status")["gpus"][index]
            if gpu["state"] == "foreign" or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert gpu["state"] == "foreign", gpu
        assert holder.pid in [p["pid"] for p in gpu["processes"]], gpu["processes"]
        everything = str(len(gpualloc_json("topo", "show")["gpus"]))
        refused = gpualloc("run", "-n", everything, "--", "true", check=False)
        assert refused.returncode == 10, refused.stderr
    finally:
        finish(holder, timeout_s=30)  # closing its input ends the hold
    assert holder.returncode == 0
    deadline = time.monotonic() + 30
    while gpualloc_json("status")["gpus"][index]["state"] != "free":
        assert time.monotonic() < deadline, "the GPU still looks used after its process ended"
        time.sleep(0.5)


def test_calibrate_measures_what_this_host_allows() -> None:
    count = len(gpualloc_json("topo", "show")["gpus"])
    if count > 1:
        pytest.importorskip("torch", reason="calibrate measures pairs with torch or nvbandwidth")
    result = gpualloc_json("calibrate", "--repeats", "2", "--size-mib", "64")
    assert result["gpus"] == count
    assert result["measured"] is (count > 1)
