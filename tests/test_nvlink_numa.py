"""``nvidia-smi nvlink -s``, ``numactl --hardware`` and sysfs NUMA parsing; combined imports."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpualloc.discovery.numa import parse_numactl_hardware, read_sysfs_numa
from gpualloc.discovery.nvlink_status import parse_nvlink_status
from gpualloc.discovery.recorded import import_smi_texts
from gpualloc.errors import TopologyParseError
from tests.recordings import recorded

GIB = 1024**3


def test_nvlink_status_v100_with_uuids() -> None:
    gpus = parse_nvlink_status(recorded("nvlink_status_v100-sxm2-8gpu_vast.txt"))
    assert [g.index for g in gpus] == list(range(8))
    assert all(g.active_links == 6 and g.link_gbps == 25.781 for g in gpus)
    assert gpus[0].uuid == "GPU-2b5fbbe0-802e-d2fd-c501-69ec52b11bb7"
    assert gpus[0].name == "Tesla V100-SXM2-32GB"


def test_nvlink_status_old_format_without_uuid_and_author_snip() -> None:
    gpus = parse_nvlink_status(recorded("nvlink_status_dgx1-v100_microway_SNIPPED.txt"))
    assert [g.index for g in gpus] == [0, 7]
    assert gpus[0].uuid is None
    assert gpus[0].snipped and not gpus[1].snipped


def test_nvlink_status_snipped_h100_block_keeps_rate() -> None:
    gpus = parse_nvlink_status(recorded("nvlink_status_h100-sxm5-8gpu_vm_SNIPPED.txt"))
    assert len(gpus) == 8
    assert all(g.snipped and g.link_gbps == 26.562 for g in gpus)
    assert sorted(gpus[0].links) == [0, 1, 17]


def test_nvlink_status_all_links_inactive() -> None:
    gpus = parse_nvlink_status(recorded("nvlink_status_3x-rtx-a6000_one-bridge_inactive.txt"))
    assert [g.active_links for g in gpus] == [4, 4, 0]
    assert gpus[2].link_gbps is None


def test_nvlink_status_inactive_links_and_units() -> None:
    text = "GPU 0: NVIDIA B200 (UUID: GPU-1)\n\t Link 0: 53.125 GB/s\n\t Link 1: <inactive>\n"
    gpus = parse_nvlink_status(text)
    assert gpus[0].links == {0: 53.125, 1: None}
    assert gpus[0].active_links == 1


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("hello\n", "not a line"),
        ("\t Link 0: 25.781 GB/s\n", "before any"),
        ("GPU 0: X\n\t Link 0: fast\n", "neither"),
        ("GPU 0: X\nGPU 0: X\n", "appears twice"),
        ("", "no 'GPU n:' block"),
    ],
)
def test_nvlink_status_malformed(text: str, message: str) -> None:
    with pytest.raises(TopologyParseError, match=message):
        parse_nvlink_status(text)


def test_comments_and_prompts_above_the_output_are_skipped() -> None:
    numa = "# recorded on delos\n$ numactl -H\nnode 0 cpus: 0 1\n"
    assert parse_numactl_hardware(numa)[0].cpus == [0, 1]
    nvlink = "root@host:~# nvidia-smi nvlink -s\nGPU 0: A (UUID: GPU-1)\n\t Link 0: 25 GB/s\n"
    assert parse_nvlink_status(nvlink)[0].active_links == 1


def test_numactl_two_sockets() -> None:
    nodes = parse_numactl_hardware(recorded("numactl_2socket_x86_delos.txt"))
    assert [n.id for n in nodes] == [0, 1]
    assert nodes[0].cpus[:3] == [0, 1, 2] and 40 in nodes[0].cpus and 20 not in nodes[0].cpus
    assert nodes[1].memory_total_bytes == 774135 * 1024**2
    assert nodes[0].distances == {0: 10, 1: 21}


def test_numactl_nps4_with_trailing_spaces() -> None:
    nodes = parse_numactl_hardware(recorded("numactl_2socket_epyc_nps4_8numa_8x-mi210-node.txt"))
    assert len(nodes) == 8
    assert nodes[3].distances[0] == 12 and nodes[3].distances[7] == 32
    assert len(nodes[7].cpus) == 32


def test_numactl_cpuless_gpu_memory_node() -> None:
    text = (
        "available: 3 nodes (0,8,255)\n"
        "node 0 cpus: 0 1\nnode 0 size: 100 MB\nnode 0 free: 50 MB\n"
        "node 8 cpus: 2 3\nnode 8 size: 100 MB\nnode 8 free: 50 MB\n"
        "node 255 cpus:\nnode 255 size: 16128 MB\nnode 255 free: 16000 MB\n"
        "node distances:\nnode   0   8  255\n"
        "  0:  10  40  80\n  8:  40  10  80\n 255:  80  80  10\n"
    )
    nodes = parse_numactl_hardware(text)
    assert [n.id for n in nodes] == [0, 8, 255]
    assert nodes[2].cpus == [] and nodes[2].memory_total_bytes == 16128 * 1024**2
    assert nodes[2].distances == {0: 80, 8: 80, 255: 10}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("node 0 cpus: 0 x\n", "not a number"),
        ("weird line\n", "not a line"),
        ("available: 1 nodes (0)\n", "no 'node N cpus:'"),
        ("available: 2 nodes (0-1)\nnode 0 cpus: 0\n", "declares nodes"),
        ("node 0 cpus: 0\nnode distances:\nnode   0   1\n  0:  10\n", "1 value for 2"),
    ],
)
def test_numactl_malformed(text: str, message: str) -> None:
    with pytest.raises(TopologyParseError, match=message):
        parse_numactl_hardware(text)


def test_sysfs_numa(tmp_path: Path) -> None:
    for node, cpus, distance in (("node0", "0-3", "10 21"), ("node1", "4-7", "21 10")):
        directory = tmp_path / node
        directory.mkdir()
        (directory / "cpulist").write_text(cpus + "\n")
        (directory / "distance").write_text(distance + "\n")
        (directory / "meminfo").write_text(f"Node {node[-1]} MemTotal:       1024 kB\n")
    (tmp_path / "possible").write_text("0-1\n")
    nodes = read_sysfs_numa(tmp_path)
    assert [(n.id, n.cpus, n.distances) for n in nodes] == [
        (0, [0, 1, 2, 3], {0: 10, 1: 21}),
        (1, [4, 5, 6, 7], {0: 21, 1: 10}),
    ]
    assert nodes[0].memory_total_bytes == 1024 * 1024
    assert read_sysfs_numa(tmp_path / "absent") == []


def test_import_with_all_companions_fills_names_rates_and_numa() -> None:
    topology = import_smi_texts(
        recorded("dgx1-v100_vast_topo.txt"),
        nvlink_text=recorded("nvlink_status_v100-sxm2-8gpu_vast.txt"),
        numa_text=recorded("numactl_2socket_x86_delos.txt"),
    )
    gpu = topology.gpus[5]
    assert gpu.name == "Tesla V100-SXM2-32GB"
    assert gpu.uuid == "GPU-72ed3bc4-b1e1-12c5-3709-2b564db7ce0b"
    assert gpu.nvlinks_active == 6 and gpu.nvlink_generation == 2
    assert topology.link(0, 3).bandwidth_gbps == pytest.approx(2 * 25.781)
    assert topology.numa_nodes[1].memory_total_bytes == 774135 * 1024**2
    assert not any(link.nvswitch for link in topology.links)


def test_import_uses_family_link_rate_for_bridged_a6000() -> None:
    topology = import_smi_texts(
        recorded("3x-rtx-a6000_one-nvlink-bridge_topo.txt"),
        nvlink_text=recorded("nvlink_status_3x-rtx-a6000_one-bridge_inactive.txt"),
    )
    assert topology.link(0, 1).bandwidth_gbps == pytest.approx(4 * 14.062)
    assert topology.gpus[2].nvlinks_active == 0
    assert topology.gpus[2].nvlink_generation is None


def test_nvswitch_inferred_from_link_counts_with_and_without_names() -> None:
    bare = import_smi_texts(recorded("hgx-h100_vm-passthrough_rhel-ai_topo.txt"))
    assert all(link.nvswitch and link.nvlinks == 18 for link in bare.links)
    named = import_smi_texts(
        recorded("hgx-h100_vm-passthrough_rhel-ai_topo.txt"),
        nvlink_text=recorded("nvlink_status_h100-sxm5-8gpu_vm_SNIPPED.txt"),
    )
    assert named.link(0, 1).bandwidth_gbps == pytest.approx(18 * 26.562)
    assert named.link(0, 1).nvlink_generation == 4
    bridged = import_smi_texts(recorded("4x-a100-pcie_nv12-bridge-pairs_4numa-vm_topo.txt"))
    assert not any(link.nvswitch for link in bridged.links)


def test_import_rejects_nvlink_file_of_another_host() -> None:
    with pytest.raises(TopologyParseError, match="same host"):
        import_smi_texts(
            recorded("2x-rtx5090_threadripper_phb_topo.txt"),
            nvlink_text=recorded("nvlink_status_v100-sxm2-8gpu_vast.txt"),
        )


def test_numactl_fills_gpu_numa_node_when_topo_says_na() -> None:
    text = (
        "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\n"
        "GPU0\t X \tSYS\t0-3\tN/A\nGPU1\tSYS\t X \t4-7\tN/A\n"
    )
    numa = "node 0 cpus: 0 1 2 3\nnode 1 cpus: 4 5 6 7\n"
    topology = import_smi_texts(text, numa_text=numa)
    assert [g.numa_node for g in topology.gpus] == [0, 1]
