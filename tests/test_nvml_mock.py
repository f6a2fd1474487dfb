"""The real NVML path against NVIDIA's own mock NVML: ``nvml_mock`` tier.

``../shared/nvml-mock/libnvidia-ml.so.1`` is k8s-test-infra's ``mocknvml``, the library
NVIDIA's device plugin tests against; the real ``nvidia-ml-py`` loads it through
``LD_LIBRARY_PATH``, and ``MOCK_NVML_CONFIG`` names the GPUs it reports (six upstream profiles
and ten fault variants, 16 in all). Each test runs gpualloc as a user would, with no
``--topology``: discovery goes through NVML. Where the mock differs from real NVML (its README
lists how) the test follows real NVML and says so. Skipped where ``../shared`` is absent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
MOCK = ROOT.parent / "shared" / "nvml-mock"
PROFILES = sorted([*MOCK.glob("*.yaml"), *MOCK.glob("variants/*.yaml")]) if MOCK.is_dir() else []
VARIANTS = ROOT / "tests" / "fixtures" / "nvml-mock"
"""This project's own variants of the mock's profiles (their README says whence)."""

pytestmark = [
    pytest.mark.nvml_mock,
    pytest.mark.slow,
    pytest.mark.skipif(not (MOCK / "libnvidia-ml.so.1").exists(), reason=f"no mock NVML in {MOCK}"),
]
yaml = pytest.importorskip("yaml", reason="PyYAML reads the mock's profiles (the test extra)")


def _ids(path: Path) -> str:
    return path.stem


def _spec(profile: Path) -> dict[str, Any]:
    return yaml.safe_load(profile.read_text())


def _device(spec: dict[str, Any], index: int) -> dict[str, Any]:
    """A device of the profile: its own fields over ``device_defaults`` (as the mock merges)."""
    merged = dict(spec.get("device_defaults") or {})
    merged.update(spec["devices"][index])
    return merged


def _bus_key(bus_id: str) -> tuple[int, ...]:
    parts = bus_id.replace(".", ":").split(":")
    return tuple(int(p, 16) for p in parts)


def _gpualloc(
    profile: Path, home: Path, *args: str, shim: bool = True
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUALLOC_", "MOCK_NVML"))}
    env |= {
        "LD_LIBRARY_PATH": str(MOCK),
        "MOCK_NVML_CONFIG": str(profile),
        "GPUALLOC_CACHE_DIR": str(home / "cache"),
        "GPUALLOC_STATE_DIR": str(home / "state"),
        "PYTHONPATH": os.pathsep.join(
            [str(ROOT), *([str(MOCK / "tools" / "pyshim")] if shim else [])]
        ),
    }
    return subprocess.run(
        [sys.executable, "-m", "gpualloc", *args],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("profile", PROFILES, ids=_ids)
def test_discovery_through_nvml_matches_the_profile(profile: Path, tmp_path: Path) -> None:
    spec = _spec(profile)
    shown = _gpualloc(profile, tmp_path, "topo", "show", "--json")
    assert shown.returncode == 0, shown.stderr
    assert "Traceback" not in shown.stderr
    topology = json.loads(shown.stdout)
    gpus = topology["gpus"]
    assert len(gpus) == len(spec["devices"])
    complexes = {
        device.upper(): complex_["numa_node"]
        for complex_ in (spec.get("pcie_topology") or {}).get("root_complexes", [])
        for device in complex_.get("devices", [])
    }
    lost = {"a100-lost": {3}, "a100-fob-mid": {5}}.get(profile.stem, set())
    for gpu in gpus:
        device = _device(spec, gpu["index"])
        if gpu["health"] == "lost":  # NVML answers a lost GPU's UUID, name, memory no more
            assert gpu["index"] in lost, gpu
            continue
        assert gpu["health"] == "ok", gpu
        assert gpu["uuid"] == device["uuid"]
        assert gpu["serial"] == device["serial"]
        assert _bus_key(gpu["pci_bus_id"]) == _bus_key(device["pci"]["bus_id"])
        assert gpu["name"] == device["name"]
        assert gpu["memory_total_bytes"] == device["memory"]["total_bytes"]
        pcie = device.get("pcie") or {}
        if "max_link_gen" in pcie:
            assert gpu["pcie_generation"] == pcie["max_link_gen"]
        numa = complexes.get(device["pci"]["bus_id"].upper())
        if numa is not None and profile.stem != "gh200-like":  # Grace: see the next test
            assert gpu["numa_node"] == numa, gpu
    if profile.stem == "gh200-like":  # NVML's NUMA id is the GPU's own memory node (Grace)
        (gpu,) = gpus
        assert (gpu["numa_node"], gpu["gpu_numa_node"]) == (0, 1), "CPU side from affinity"
    nvlink = spec.get("nvlink") or {}
    gone = {g["index"] for g in gpus if g["health"] == "lost"}
    links = [link for link in topology["links"] if not {link["a"], link["b"]} & gone]
    if not nvlink.get("links_per_gpu") and not any("nvlinks" in d for d in spec["devices"]):
        assert not any(link["nvlinks"] for link in links), "a profile without NVLink"
    rate = nvlink.get("bandwidth_per_link_mbps")
    for gpu in gpus:  # the driver's per-link rate (field values), not the version's (item 6)
        if gpu["health"] == "ok" and any(link["nvlinks"] for link in links):
            assert gpu["nvlink_link_gbps"] == pytest.approx(rate / 1000), gpu
    if nvlink.get("switches") and nvlink.get("links_per_gpu") and "down" not in profile.stem:
        assert all(link["nvswitch"] for link in links)
        assert all(link["nvlinks"] == nvlink["links_per_gpu"] for link in links)


@pytest.mark.parametrize("profile", PROFILES, ids=_ids)
def test_run_exports_the_gpus_it_leased_by_bus_order(profile: Path, tmp_path: Path) -> None:
    """``CUDA_DEVICE_ORDER=PCI_BUS_ID`` numbers GPUs by bus id; NVML by its own enumeration.
    On the L40S profile those differ, and b2653dd exported NVML's indices: the job ran on GPUs
    it did not hold."""
    spec = _spec(profile)
    count = min(2, len(spec["devices"]))
    ran = _gpualloc(
        profile, tmp_path, "run", "-n", str(count), "--",
        "sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES $GPUALLOC_GPUS $CUDA_DEVICE_ORDER"',
    )  # fmt: skip
    if profile.stem in ("a100-mig",):  # every GPU in MIG mode: none can be leased whole
        assert ran.returncode == 9 and "MIG mode" in ran.stderr, ran.stderr
        return
    assert ran.returncode == 0, ran.stderr
    visible, leased, order = ran.stdout.split()
    assert order == "PCI_BUS_ID"
    by_bus = sorted(
        range(len(spec["devices"])), key=lambda i: _bus_key(_device(spec, i)["pci"]["bus_id"])
    )
    cuda_sees = [by_bus[int(ordinal)] for ordinal in visible.split(",")]
    assert cuda_sees == [int(g) for g in leased.split(",")], (visible, leased)


@pytest.mark.parametrize("profile", PROFILES, ids=_ids)
def test_every_command_answers_on_every_profile(profile: Path, tmp_path: Path) -> None:
    """doctor, status, plan and metrics answer, with the outcome each fault documents."""
    faulty = {
        "a100-ecc": "GPU 2",
        "a100-fob-mid": "GPU 5",
        "a100-lost": "GPU 3",
        # links already down at discovery: b2653dd said "every link up"
        "dgx1v-linkdown": "NVLink port 2 down while port 5 is up",
        "h100-switchdown": "16 NVSwitch links up where its peers have 18",
    }
    for args in (["status", "--json"], ["metrics"], ["doctor"], ["plan", "-n", "1"]):
        done = _gpualloc(profile, tmp_path, *args)
        assert "Traceback" not in done.stderr, done.stderr
        if args[0] == "doctor" and profile.stem in faulty:
            assert done.returncode == 17, done.stderr  # a GPU or a link is unhealthy
            assert faulty[profile.stem] in done.stdout + done.stderr
        elif args[0] == "plan" and profile.stem == "a100-mig":
            assert done.returncode == 9 and "MIG mode" in done.stderr
            assert "asks for 1 GPU but" in done.stderr, "not '1 GPUs'"
            assert "no MIG device exists yet" in done.stderr, "not 'plan a MIG device'"
        else:
            assert done.returncode == 0, (args, done.stderr)
    if profile.stem == "a100-lost":  # lost, not merely unhealthy
        metrics = _gpualloc(profile, tmp_path, "metrics").stdout
        assert 'gpualloc_gpus{state="lost"} 1' in metrics
        assert 'gpualloc_gpus{state="unhealthy"} 0' in metrics
    if profile.stem == "a100-procs":  # GPU 1 runs two processes gpualloc did not start
        status = json.loads(_gpualloc(profile, tmp_path, "status", "--json").stdout)
        foreign = {g["index"] for g in status["gpus"] if g["state"] == "foreign"}
        assert foreign == {1}, status["gpus"]
        assert {p["pid"] for p in status["gpus"][1]["processes"]} == {1, 999999}
        planned = _gpualloc(profile, tmp_path, "plan", "-n", "8")
        assert planned.returncode == 10, planned.stderr  # as run says: taken now
        assert "GPU 1 taken" in planned.stderr and "pid 999999" in planned.stderr
        what_if = _gpualloc(profile, tmp_path, "plan", "-n", "8", "--assume-free")
        assert "note: GPU 1 runs processes now; this what-if counts every GPU free" in (
            what_if.stderr
        )
        dry = _gpualloc(profile, tmp_path, "run", "-n", "8", "--dry-run", "--", "true")
        assert dry.returncode == 10, "a GPU with a foreign process is not free"


@pytest.mark.parametrize(
    ("name", "args", "nearer"),
    [
        ("b200", ["-n", "2", "--busy", "0,1,2"], {4, 5}),  # b2653dd: 3,4 across the sockets
        ("l40s", ["-n", "4"], {0, 1, 4, 5}),  # b2653dd: 0,1,2,3, two sockets
    ],
)
def test_without_peer_to_peer_the_nearer_gpus_win(
    name: str, args: list[str], nearer: set[int], tmp_path: Path
) -> None:
    """On hosts whose GPUs copy through host memory (the mock's B200 and
    L40S report no P2P, as GeForce boards and many VMs do) every pair was priced alike, and
    the lowest indices won across sockets while GPUs of one root complex were free."""
    planned = _gpualloc(MOCK / f"{name}.yaml", tmp_path, "plan", *args, "--json")
    assert planned.returncode == 0, planned.stderr
    data = json.loads(planned.stdout)
    assert set(data["gpus"]) == nearer
    assert len(set(data["numa_nodes"])) == 1


@pytest.mark.parametrize(
    ("variant", "absent", "present"),
    [("h100-mig", "1g.5gb", "1g.10gb"), ("a30-mig", "1g.5gb", "1g.6gb")],
)
def test_a_profile_the_gpus_lack_is_refused_naming_theirs(
    variant: str, absent: str, present: str, tmp_path: Path
) -> None:
    """MIG profiles are per model (an A100 40GB's 1g.5gb is no H100's nor A30's): b2653dd
    told the administrator to run 'nvidia-smi mig -cgi 1g.5gb', which the driver refuses."""
    profile = VARIANTS / f"{variant}.yaml"
    refused = _gpualloc(profile, tmp_path, "plan", "--mig", absent)
    assert refused.returncode == 9, refused.stderr
    error, *rest = refused.stderr.splitlines()
    assert error.startswith(f"error: no GPU here has MIG profile {absent} (NVIDIA ")
    assert present in error and len(rest) <= 1
    assert "-cgi" not in refused.stderr
    offered = _gpualloc(profile, tmp_path, "plan", "--mig", present)
    assert offered.returncode == 9 and f"-cgi {present} -C" in offered.stderr


@pytest.mark.parametrize(
    ("variant", "memory", "profile"),
    [("h100-mig", "10G", "1g.20gb"), ("a30-mig", "10G", "2g.12gb")],
)
def test_on_an_all_mig_host_mem_offers_a_profile_not_whole_gpus(
    variant: str, memory: str, profile: str, tmp_path: Path
) -> None:
    """Every GPU in MIG mode: no whole GPU can be had, so the hint names the smallest profile
    sure to hold the memory (an H100's 1g.10gb holds 9.75 GiB, not 10)."""
    planned = _gpualloc(VARIANTS / f"{variant}.yaml", tmp_path, "plan", "--mem", memory)
    assert planned.returncode == 9, planned.stderr
    assert f"nvidia-smi mig -i 0 -cgi {profile} -C" in planned.stderr
    assert "whole GPU" not in planned.stderr


def test_a_mig_mode_pending_a_reset_is_shown(tmp_path: Path) -> None:
    """NVML's current and pending MIG modes differ after 'nvidia-smi -mig 1' on a GPU that
    could not be reset: b2653dd read the current mode only and showed nothing pending."""
    profile = VARIANTS / "h100-mig-pending.yaml"
    pending = "GPU 0-7: MIG enabled, pending reset (off until the GPU is reset)"
    shown = _gpualloc(profile, tmp_path, "topo", "show")
    assert shown.returncode == 0, shown.stderr
    assert pending in shown.stdout and "off, on at reset" in shown.stdout
    gpus = json.loads(_gpualloc(profile, tmp_path, "topo", "show", "--json").stdout)["gpus"]
    assert {(g["mig_enabled"], g["mig_pending"]) for g in gpus} == {(False, True)}
    status = _gpualloc(profile, tmp_path, "status")
    assert status.returncode == 0 and pending in status.stdout
    data = json.loads(_gpualloc(profile, tmp_path, "status", "--json").stdout)
    assert {(g["state"], g["mig_pending"]) for g in data["gpus"]} == {("free", True)}
    doctor = _gpualloc(profile, tmp_path, "doctor", "--json")
    assert doctor.returncode == 0, doctor.stderr  # a note, not a problem
    (finding,) = [f for f in json.loads(doctor.stdout)["findings"] if f["check"] == "mig"]
    assert (finding["where"], finding["severity"]) == ("GPU 0-7", "note")
    assert finding["detail"].startswith("MIG enabled, pending reset")


@pytest.mark.parametrize(("variant", "index"), [("a100-lost", 3), ("a100-fob-mid", 5)])
def test_a_lost_gpu_is_named_so_that_its_card_can_be_pulled(
    variant: str, index: int, tmp_path: Path
) -> None:
    """b2653dd listed a GPU that fell off the bus as '?' (no bus id, UUID or serial) in
    'topo show', and 'status' and 'doctor' said only 'fell off the bus'."""
    profile = MOCK / "variants" / f"{variant}.yaml"
    device = _device(_spec(profile), index)
    bus = f"{_bus_key(device['pci']['bus_id'])[0]:08X}:{device['pci']['bus_id'].split(':', 1)[1]}"
    card = f"bus {bus}, UUID {device['uuid']}, serial {device['serial']}"
    doctor = _gpualloc(profile, tmp_path, "doctor", "--json")
    assert doctor.returncode == 17, doctor.stderr
    (finding,) = [f for f in json.loads(doctor.stdout)["findings"] if f["check"] == "health"]
    assert finding["detail"] == f"fell off the bus (NVML: GPU is lost): {card}"
    status = _gpualloc(profile, tmp_path, "status")
    row = next(line for line in status.stdout.splitlines() if line.startswith(f"  {index} "))
    assert card in row
    if variant == "a100-lost":  # lost while discovery reads it (fob-mid: only later)
        shown = _gpualloc(profile, tmp_path, "--refresh", "topo", "show")
        row = next(line for line in shown.stdout.splitlines() if line.startswith(f"  {index} "))
        assert bus in row and row.split()[-1] == "lost"
        assert f"GPU {index} lost: {card}" in shown.stdout
        gpu = json.loads(_gpualloc(profile, tmp_path, "topo", "show", "--json").stdout)["gpus"][3]
        assert (gpu["pci_bus_id"], gpu["uuid"], gpu["serial"]) == (
            bus, device["uuid"], device["serial"]
        )  # fmt: skip


def test_a_mixed_hosts_headers_name_its_models(tmp_path: Path) -> None:
    """The heterogeneous box of 1CatAI/1Cat-vLLM#641: b2653dd's header said '4 GPUs, PCIe
    only', naming neither model."""
    profile = VARIANTS / "mixed-rtx8000-v100.yaml"
    models = "2x Quadro RTX 8000 + 2x Tesla V100-PCIE-32GB"
    shown = _gpualloc(profile, tmp_path, "topo", "show")
    assert shown.stdout.startswith(f"NVML: 4 GPUs ({models}), PCIe only"), shown.stdout[:200]
    assert f"({models})" in _gpualloc(profile, tmp_path, "status").stdout.splitlines()[0]
    assert _gpualloc(profile, tmp_path, "doctor").stdout.startswith(f"gpualloc doctor: {models}")
