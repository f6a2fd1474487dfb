"""The NVML source against the data-driven fake; the resolver's fallbacks; the cache."""

from __future__ import annotations

import os
from pathlib import Path

import pynvml
import pytest
from msgspec.structs import replace

from gpualloc.discovery import numa as numa_source
from gpualloc.discovery import nvml as nvml_source
from gpualloc.discovery import resolve
from gpualloc.discovery.live import live_processes
from gpualloc.discovery.nvml import NvmlSession, normalise_bus_id
from gpualloc.discovery.processes import parse_compute_apps_csv
from gpualloc.errors import DiscoveryUnavailable, NoGpuFound
from gpualloc.model import Health, PciePath, Topology
from gpualloc.topologies import load_bundled
from tests.fake_nvml import FakeNvml, probe


@pytest.fixture(autouse=True)
def fake_sysfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty /sys/bus/pci/devices, so the host's real PCI devices never leak in."""
    root = tmp_path / "sys-pci"
    root.mkdir()
    monkeypatch.setattr(nvml_source, "SYSFS_PCI_DEVICES", root)
    return root


def link_summary(topology: Topology) -> list[tuple[int, int, str, PciePath | None, bool, float]]:
    return [
        (link.a, link.b, link.kind, link.pcie, link.nvswitch, link.bandwidth_gbps)
        for link in topology.links
    ]


@pytest.mark.parametrize("name", ["dgx1-v100", "dgx1-p100", "summit-node", "pcie-8gpu-2socket"])
def test_direct_nvlink_hosts_match_the_bundled_model(name: str) -> None:
    bundled = load_bundled(name)
    found = probe(FakeNvml.from_topology(bundled))
    assert link_summary(found) == link_summary(bundled)
    assert [g.cpu_affinity for g in found.gpus] == [g.cpu_affinity for g in bundled.gpus]
    assert [g.numa_node for g in found.gpus] == [g.numa_node for g in bundled.gpus]
    assert found.provenance.source == "nvml"
    assert found.provenance.driver_version == "580.82.07"
    assert found.provenance.cuda_version == "13.0"


@pytest.mark.parametrize("name", ["hgx-h100", "dgx-a100", "dgx2"])
def test_nvswitch_links_are_recognised(name: str) -> None:
    bundled = load_bundled(name)
    found = probe(FakeNvml.from_topology(bundled))
    assert link_summary(found) == link_summary(bundled)
    assert all(link.nvswitch for link in found.links)


def test_each_nvlink_is_queried_once_per_gpu_not_per_pair() -> None:
    fake = FakeNvml.from_topology(load_bundled("hgx-h100"))
    probe(fake)
    # 8 GPUs x 18 links each; a per-pair loop would ask 8 x 7 x 18 times.
    assert fake.calls["nvmlDeviceGetNvLinkRemotePciInfo"] == 8 * 18
    assert fake.calls["nvmlDeviceGetTopologyCommonAncestor"] == 2 * 28


def test_unsupported_fields_become_unknown_with_notes() -> None:
    fake = FakeNvml.from_topology(load_bundled("dgx1-v100"))
    fake.gpus[2].unsupported = {
        "nvmlDeviceGetMigMode",
        "nvmlDeviceGetMaxPcieLinkGeneration",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetNumaNodeId",
    }
    found = probe(fake)
    gpu = found.gpus[2]
    assert gpu.mig_enabled is None and gpu.memory_total_bytes is None
    assert gpu.numa_node == 0  # inferred: its CPU affinity lies within node 0
    assert gpu.pcie_generation == 3  # from the V100 family, with a note
    assert gpu.health is Health.OK
    assert "GPU2 MIG mode: not supported by this GPU or driver" in found.provenance.notes
    assert found.gpus[1].mig_enabled is False


def test_numa_node_falls_back_to_sysfs(fake_sysfs: Path) -> None:
    fake = FakeNvml.from_topology(load_bundled("dgx1-v100"))
    fake.gpus[6].unsupported = {"nvmlDeviceGetNumaNodeId"}
    device = fake_sysfs / "0000:16:00.0"
    device.mkdir()
    (device / "numa_node").write_text("1\n")
    assert probe(fake).gpus[6].numa_node == 1


def test_a_lost_gpu_is_marked_and_has_no_links() -> None:
    fake = FakeNvml.from_topology(load_bundled("dgx1-v100"))
    fake.gpus[3].lost_on = {"nvmlDeviceGetNvLinkState"}
    fake.gpus[5].lost_on = {"*"}
    found = probe(fake)
    assert found.gpus[3].health is Health.LOST
    assert found.gpus[5].health is Health.LOST
    assert found.gpus[0].health is Health.OK
    assert found.link(0, 3).nvlinks == 0 and found.link(0, 3).pcie is None
    assert found.link(1, 5).kind == "UNKNOWN"
    assert found.link(0, 4).kind == "NV2"
    assert any("GPU5: lost" in note for note in found.provenance.notes)


def _serials(fake: FakeNvml) -> FakeNvml:
    for index, gpu in enumerate(fake.gpus):
        gpu.serial = f"13248210838{index:02d}"
    return fake


def test_a_lost_gpu_keeps_the_name_nvml_gave_before_it_fell_off() -> None:
    """A failing GPU trips on its first memory or ECC query (NVIDIA's mock NVML does so);
    b2653dd asked the bus id, UUID and name after the memory, and so listed the GPU as '?'."""
    fake = _serials(FakeNvml.from_topology(load_bundled("dgx1-v100")))
    fake.gpus[3].lost_on = {"nvmlDeviceGetMemoryInfo"}
    gpu = probe(fake).gpus[3]
    assert gpu.health is Health.LOST
    assert (gpu.pci_bus_id, gpu.uuid, gpu.serial) == (
        "00000000:13:00.0", fake.gpus[3].uuid, "1324821083803"
    )  # fmt: skip
    assert probe(FakeNvml.from_topology(load_bundled("dgx1-v100"))).gpus[0].serial is None


def test_a_gpu_lost_before_discovery_is_named_by_the_last_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """NVML answers nothing about a GPU lost since the last discovery, not even its handle:
    its bus id, UUID and serial come from the cached topology of that discovery."""
    fake = _serials(FakeNvml.from_topology(load_bundled("dgx1-v100")))
    monkeypatch.setattr(nvml_source, "load_pynvml", lambda: fake)
    monkeypatch.setattr(numa_source, "discover_numa", lambda notes: [])
    good = resolve.resolve_topology().gpus[5]
    fake.gpus[5].lost_on = {"*"}
    found = resolve.resolve_topology()
    gpu = found.gpus[5]
    assert gpu.health is Health.LOST
    assert (gpu.pci_bus_id, gpu.uuid, gpu.serial, gpu.name) == (
        good.pci_bus_id, good.uuid, "1324821083805", good.name
    )  # fmt: skip
    (note,) = [n for n in found.provenance.notes if n.startswith("GPU5 is lost")]
    assert f"bus {good.pci_bus_id}, UUID {good.uuid}, serial 1324821083805" in note
    assert "from the discovery of" in note
    assert resolve.resolve_topology().gpus[5].serial == "1324821083805"  # kept in the cache


def test_a_gpu_lost_with_no_discovery_before_is_named_by_the_drivers_sysfs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from gpualloc.discovery import lost_gpus

    fake = FakeNvml.from_topology(load_bundled("dgx1-v100"))
    fake.gpus[5].lost_on = {"*"}
    driver = tmp_path / "drivers-nvidia"
    for index in range(8):  # the driver holds every GPU, the lost one too, and an NVSwitch
        (driver / f"0000:{0x10 + index:02x}:00.0").mkdir(parents=True)
        (driver / f"0000:{0x10 + index:02x}:00.0" / "class").write_text("0x030200\n")
    (driver / "0000:a0:00.0").mkdir()
    (driver / "0000:a0:00.0" / "class").write_text("0x068000\n")
    (driver / "new_id").write_text("")
    monkeypatch.setattr(lost_gpus, "NVIDIA_DRIVER", driver)
    monkeypatch.setattr(nvml_source, "load_pynvml", lambda: fake)
    monkeypatch.setattr(numa_source, "discover_numa", lambda notes: [])
    found = resolve.resolve_topology()
    assert found.gpus[5].pci_bus_id == "00000000:15:00.0"
    assert any(n.startswith("GPU5 is lost: bus 00000000:15:00.0") for n in found.provenance.notes)
    fake.gpus[6].lost_on = {"*"}
    assert resolve.resolve_topology().gpus[6].pci_bus_id == "00000000:16:00.0"  # the last one
    monkeypatch.setenv("GPUALLOC_CACHE_DIR", str(tmp_path / "no-discovery-before"))
    two = resolve.resolve_topology()  # two spare bus ids: either could be either GPU's
    assert [two.gpus[i].identity() for i in (5, 6)] == ["bus id, UUID and serial unknown"] * 2


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (pynvml.NVMLError_LibraryNotFound(), "no NVIDIA driver is installed"),
        (pynvml.NVMLError_DriverNotLoaded(), "driver is not loaded"),
        (pynvml.NVMLError_NoPermission(), "failed to initialise"),
    ],
)
def test_nvml_unavailable(error: Exception, message: str) -> None:
    fake = FakeNvml.from_topology(load_bundled("single-gpu"))
    fake.init_error = error
    with pytest.raises(DiscoveryUnavailable, match=message), NvmlSession(fake):
        pass


def test_no_gpus_is_no_gpu_found() -> None:
    with pytest.raises(NoGpuFound, match="NVML sees no GPU"):
        probe(FakeNvml([], {}))


def test_bus_ids_compare_across_spellings() -> None:
    assert normalise_bus_id("0000:8a:00.0") == normalise_bus_id(b"00000000:8A:00.0")


@pytest.fixture
def fake_host(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    """Make this machine look like a DGX-1 V100 to the resolver."""
    fake = FakeNvml.from_topology(load_bundled("dgx1-v100"))
    monkeypatch.setattr(nvml_source, "load_pynvml", lambda: fake)
    monkeypatch.setattr(numa_source, "discover_numa", lambda notes: [])
    monkeypatch.setattr(nvml_source.os, "cpu_count", lambda: 80)
    return fake


def test_resolver_uses_nvml_then_its_cache(fake_host: FakeNvml, isolated_environment: Path) -> None:
    first = resolve.resolve_topology()
    assert first.provenance.source == "nvml"
    assert first.gpus[7].cpu_affinity == load_bundled("dgx1-v100").gpus[7].cpu_affinity
    assert (isolated_environment / "topology-nvml.json").exists()
    probes = fake_host.calls["nvmlDeviceGetTopologyCommonAncestor"]
    second = resolve.resolve_topology()
    assert fake_host.calls["nvmlDeviceGetTopologyCommonAncestor"] == probes
    assert link_summary(second) == link_summary(first)
    resolve.resolve_topology(refresh=True)
    assert fake_host.calls["nvmlDeviceGetTopologyCommonAncestor"] == 2 * probes


def test_cache_is_invalidated_when_a_gpu_changes(fake_host: FakeNvml) -> None:
    resolve.resolve_topology()
    probes = fake_host.calls["nvmlDeviceGetTopologyCommonAncestor"]
    fake_host.gpus[0].uuid = "GPU-replaced"
    assert resolve.resolve_topology().gpus[0].uuid == "GPU-replaced"
    assert fake_host.calls["nvmlDeviceGetTopologyCommonAncestor"] == 2 * probes


def test_corrupt_cache_is_ignored(fake_host: FakeNvml, isolated_environment: Path) -> None:
    isolated_environment.mkdir(parents=True)
    (isolated_environment / "topology-nvml.json").write_text("{not json")
    assert resolve.resolve_topology().gpu_count == 8


def test_unwritable_cache_is_not_an_error(
    fake_host: FakeNvml, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("GPUALLOC_CACHE_DIR", str(blocker / "sub"))
    assert resolve.resolve_topology().gpu_count == 8


def test_without_nvml_and_nvidia_smi_no_gpu_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml([], {})
    fake.init_error = pynvml.NVMLError_LibraryNotFound()
    monkeypatch.setattr(nvml_source, "load_pynvml", lambda: fake)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(NoGpuFound) as info:
        resolve.resolve_topology()
    assert "nvidia-smi is not installed" in info.value.message
    assert "--topology dgx1-v100" in (info.value.hint or "")


def test_falls_back_to_nvidia_smi(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A fake nvidia-smi on PATH answering with recorded outputs."""
    from tests.recordings import RECORDED

    fake = FakeNvml([], {})
    fake.init_error = pynvml.NVMLError_DriverNotLoaded()
    monkeypatch.setattr(nvml_source, "load_pynvml", lambda: fake)
    monkeypatch.setattr(numa_source, "discover_numa", lambda notes: [])
    query = "".join(
        f"{i}, GPU-{i}, 00000000:{i + 10}:00.0, NVIDIA H200, [N/A], 143771, Disabled, Disabled, "
        "5, 16, 570.1\n"
        for i in range(8)
    )
    script = tmp_path / "bin" / "nvidia-smi"
    script.parent.mkdir()
    script.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        f"  topo) sed '1,/^$/d' {RECORDED / 'hgx-h200_10nic_topo.txt'} ;;\n"
        "  nvlink) exit 3 ;;\n"
        f"  *) printf '%s' '{query}' ;;\n"
        "esac\n"
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}:{os.environ['PATH']}")
    topology = resolve.resolve_topology()
    assert topology.provenance.source == "nvidia-smi"
    assert topology.gpus[7].uuid == "GPU-7"
    assert topology.gpus[0].memory_total_bytes == 143771 * 1024 * 1024
    assert topology.gpus[0].pcie_generation == 5
    assert topology.link(0, 7).nvswitch
    assert topology.provenance.driver_version == "570.1"
    assert any("used nvidia-smi" in n for n in topology.provenance.notes)
    assert any("nvlink -s failed" in n for n in topology.provenance.notes)


def test_compute_processes_are_matched_to_gpus_by_uuid(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML's running-process lists, one GPU unable to answer; the topology's indices come from
    UUIDs, so a topology whose GPU order differs from NVML's still lines up."""
    topology = load_bundled("dgx1-v100")
    fake = FakeNvml.from_topology(topology)
    fake.gpus[2].processes = [(os.getpid(), 512 * 2**20)]
    fake.gpus[5].processes = [(4_000_000, None)]  # in another pid namespace: no name
    fake.gpus[6].unsupported.add("nvmlDeviceGetComputeRunningProcesses")
    monkeypatch.setattr(nvml_source, "load_pynvml", lambda: fake)
    report = live_processes(topology)
    assert report.source == "nvml" and report.notes == []
    mine, other = report.processes
    assert (mine.gpu, mine.pid, mine.used_memory_bytes) == (2, os.getpid(), 512 * 2**20)
    assert mine.name and mine.user  # this process, described by psutil
    assert (other.gpu, other.name, other.used_memory_bytes) == (5, None, None)
    swapped = replace(
        topology, gpus=[replace(g, uuid=topology.gpus[7 - g.index].uuid) for g in topology.gpus]
    )
    assert [p.gpu for p in live_processes(swapped).processes] == [5, 2]


def test_without_nvml_or_nvidia_smi_processes_are_unknown_and_said_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeNvml([], {})
    fake.init_error = pynvml.NVMLError_LibraryNotFound()
    monkeypatch.setattr(nvml_source, "load_pynvml", lambda: fake)
    monkeypatch.setenv("PATH", "/nonexistent")
    report = live_processes(load_bundled("dgx1-v100"))
    assert report.processes == [] and report.source == "none"
    assert "GPUs used outside gpualloc are not detected" in report.notes[0]


def test_nvidia_smi_compute_apps_csv() -> None:
    text = "GPU-aaa, 4242, 1024\nGPU-bbb, 17, [N/A]\n\nNo running processes found\n"
    assert [(p.uuid, p.pid, p.used_memory_bytes) for p in parse_compute_apps_csv(text)] == [
        ("GPU-aaa", 4242, 1024 * 2**20),
        ("GPU-bbb", 17, None),
    ]
