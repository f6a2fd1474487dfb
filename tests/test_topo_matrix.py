"""``nvidia-smi topo -m`` parsing, against every recorded output and hand-made variants."""

from __future__ import annotations

import pytest

from gpualloc.discovery.smi import topology_from_smi_texts
from gpualloc.discovery.topo_matrix import parse_topo_matrix
from gpualloc.errors import TopologyParseError
from gpualloc.model import PciePath
from tests.recordings import RECORDED, recorded

# file -> (GPUs, devices incl. NICs, {pair: kind}, GPU0 CPU affinity, GPU0 NUMA node)
EXPECTED = {
    "1gpu-gb10_dgx-spark_4nic_topo.txt": (1, 5, {}, "0-19", 0),
    "1gpu_rtx-pro-6000_wsl2_empty-affinity_topo.txt": (1, 1, {}, "", None),
    "2gpu_nvlink-bridge_nv2_hf-docs_topo.txt": (2, 2, {(0, 1): "NV2"}, "0-23", None),
    "2gpu_pcie_phb_hf-docs_topo.txt": (2, 2, {(0, 1): "PHB"}, "0-11", None),
    "2x-rtx5090_threadripper_phb_topo.txt": (2, 2, {(0, 1): "PHB"}, "0-63", 0),
    "3x-rtx-a6000_one-nvlink-bridge_topo.txt": (
        3, 3, {(0, 1): "NV4", (0, 2): "NODE", (1, 2): "NODE"}, "0-31,64-95", 0,
    ),
    "4gpu_nv4-bridge-pairs_2socket_interleaved-cpus_topo.txt": (
        4, 4, {(0, 1): "NV4", (2, 3): "NV4", (0, 2): "SYS", (1, 3): "SYS"}, "0,2,4,6,8,10", 0,
    ),
    "4x-a100-pcie_nv12-bridge-pairs_4numa-vm_topo.txt": (
        4, 4, {(0, 1): "NV12", (2, 3): "NV12", (1, 2): "SYS"}, "0-23", 0,
    ),
    "4x-a100-sxm4_nv12_rocenic_topo.txt": (4, 5, {(0, 3): "NV12"}, "32-63,96-127", 1),
    "5gpu_mixed-quadro-rtx8000-v100_phb_vllm-collect-env_topo.txt": (
        5, 5, {(0, 4): "PHB", (2, 3): "PHB"}, "0-15", 0,
    ),
    "8x4090_pcie_vast_2socket_6plus2_topo.txt": (
        8, 8, {(0, 1): "PHB", (0, 2): "NODE", (5, 6): "SYS", (6, 7): "PHB"}, "0-35,72-107", 0,
    ),
    "aws-p3.16xlarge-like_v100_vm_topo.txt": (
        8, 8, {(0, 1): "NV1", (0, 3): "NV2", (0, 5): "PHB", (4, 7): "NV2"}, "0-63", None,
    ),
    "dgx-a100_10nic_nicN-no-gpunumaid_topo.txt": (8, 18, {(0, 7): "NV12"}, "48-63,176-191", 3),
    "dgx-a100_12nic_mlx5-columns_topo.txt": (8, 20, {(2, 5): "NV12"}, "48-63,176-191", 3),
    "dgx1-v100_vast_topo.txt": (
        8, 9, {(0, 1): "NV1", (0, 3): "NV2", (0, 5): "SYS", (2, 6): "NV1", (6, 7): "NV2"},
        "0-19,40-59", 0,
    ),
    "hgx-h100_12nic_numa-off_topo.txt": (8, 20, {(0, 7): "NV18"}, "0-191", 0),
    "hgx-h100_8nic_sglang20859_misaligned-spaces_topo.txt": (
        8, 16, {(3, 4): "NV18"}, "0-47,96-143", 0,
    ),
    "hgx-h100_vm-passthrough_rhel-ai_topo.txt": (8, 8, {(1, 2): "NV18"}, "0-63", 0),
    "hgx-h200_10nic_topo.txt": (8, 18, {(0, 4): "NV18"}, "0-63,128-191", 0),
    "ibm-ac922_4gpu_power9_topo.txt": (
        4, 10, {(0, 1): "NV3", (2, 3): "NV3", (0, 2): "SYS"}, "0-63", 0,
    ),
    "ibm-ac922_6gpu_power9_glued-nic-header_HANDMADE_topo.txt": (
        6, 10, {(0, 2): "NV2", (3, 5): "NV2", (2, 3): "SYS"}, "0-87", 0,
    ),
}  # fmt: skip


def test_every_recorded_matrix_has_an_expectation() -> None:
    files = {p.name for p in RECORDED.glob("*topo.txt")}
    negative = {
        "dgx2_16gpu_nv6_10nic_PARTIAL_topo.txt",
        "hgx-h100_12nic_numa-off_MALFORMED-paste_topo.txt",
    }
    assert files == set(EXPECTED) | negative


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recorded_matrix(name: str) -> None:
    gpus, devices, kinds, cpus, numa = EXPECTED[name]
    matrix = parse_topo_matrix(recorded(name), source=name)
    assert matrix.gpu_count == gpus
    assert len(matrix.devices) == devices
    assert len(matrix.rows) == devices
    topology = topology_from_smi_texts(recorded(name), origin=name)
    assert topology.gpu_count == gpus
    for (a, b), kind in kinds.items():
        assert topology.link(a, b).kind == kind, (a, b)
    gpu0 = topology.gpus[0]
    assert ",".join(_runs(gpu0.cpu_affinity)) == cpus
    assert gpu0.numa_node == numa


def _runs(cpus: list[int]) -> list[str]:
    from gpualloc.model.cpuset import format_cpulist

    return [format_cpulist(cpus)] if cpus else []


def test_numa_affinity_of_every_gpu_on_the_npS4_dgx_a100() -> None:
    topology = topology_from_smi_texts(recorded("dgx-a100_12nic_mlx5-columns_topo.txt"))
    assert [g.numa_node for g in topology.gpus] == [3, 3, 1, 1, 7, 7, 5, 5]
    assert [n.id for n in topology.numa_nodes] == [1, 3, 5, 7]


def test_vm_numa_range_leaves_no_single_node() -> None:
    topology = topology_from_smi_texts(recorded("aws-p3.16xlarge-like_v100_vm_topo.txt"))
    assert topology.gpus[0].numa_node is None
    assert topology.gpus[0].numa_affinity == [0, 1]
    assert any("spans nodes 0-1" in note for note in topology.provenance.notes)


def test_power9_numa_ids_are_kept() -> None:
    topology = topology_from_smi_texts(recorded("ibm-ac922_4gpu_power9_topo.txt"))
    assert [g.numa_node for g in topology.gpus] == [0, 0, 8, 8]


GLUED = "ibm-ac922_6gpu_power9_glued-nic-header_HANDMADE_topo.txt"


@pytest.mark.parametrize("separator", ["\t", "  "])
def test_header_names_run_together_are_split_by_the_row_labels(separator: str) -> None:
    """'mlx5_2mlx5_3' in the header (a name that fills its column), with
    tabs as recorded and with spaces as a terminal copy has them."""
    text = recorded(GLUED).replace("\t", separator)
    matrix = parse_topo_matrix(text, source=GLUED)
    assert matrix.devices[6:] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert matrix.cell("mlx5_2", "mlx5_3") == "PIX"
    assert matrix.rows[3].affinity == {"CPU Affinity": "88-175", "NUMA Affinity": "8"}
    assert any("mlx5_2mlx5_3 -> mlx5_2 mlx5_3" in note for note in matrix.notes)
    topology = topology_from_smi_texts(text, origin=GLUED)
    assert [g.numa_node for g in topology.gpus] == [0, 0, 0, 8, 8, 8]


def test_glued_header_with_rows_that_do_not_match_is_still_an_error() -> None:
    """The split is taken only when it turns the header into the rows' labels exactly."""
    text = recorded(GLUED).replace("\nmlx5_3\t", "\nmlx5_9\t")
    with pytest.raises(TopologyParseError):
        parse_topo_matrix(text, source=GLUED)


def test_nics_are_not_gpus_and_nic_legend_is_read() -> None:
    matrix = parse_topo_matrix(recorded("hgx-h200_10nic_topo.txt"))
    assert matrix.gpu_labels == [f"GPU{i}" for i in range(8)]
    assert matrix.nic_legend["NIC0"] == "mlx5_0"
    assert matrix.cell("GPU3", "NIC0") == "PIX"


def test_malformed_paste_names_line_and_token() -> None:
    with pytest.raises(TopologyParseError) as info:
        parse_topo_matrix(recorded("hgx-h100_12nic_numa-off_MALFORMED-paste_topo.txt"))
    assert info.value.token == "PIXNODE"
    assert info.value.line_number == 7
    assert "GPU5" in str(info.value)


def test_truncated_output_is_an_error_not_a_smaller_host() -> None:
    text = recorded("dgx2_16gpu_nv6_10nic_PARTIAL_topo.txt")
    with pytest.raises(TopologyParseError, match=r"rows GPU5\.\.GPU15 are missing"):
        parse_topo_matrix(text)
    partial = parse_topo_matrix(text, require_complete=False)
    assert partial.gpu_count == 16
    assert [r.label for r in partial.rows] == ["GPU0", "GPU1", "GPU2", "GPU3", "GPU4"]
    assert partial.cell("GPU0", "GPU15") == "NV6"
    assert partial.cell("GPU4", "mlx5_2") == "PIX"


OLD_DRIVER_SOC = """\
        GPU0    GPU1    GPU2    GPU3    CPU Affinity
GPU0     X      PIX     SOC     SOC     0-7,16-23
GPU1    PIX      X      SOC     SOC     0-7,16-23
GPU2    SOC     SOC      X      PHB     8-15,24-31
GPU3    SOC     SOC     PHB      X      8-15,24-31

Legend:

  X   = Self
  SOC = Path traverses a socket-level link (e.g. QPI)
  PHB = Path traverses a PCIe host bridge
  PXB = Path traverses multiple PCIe internal switches
  PIX = Path traverses a PCIe internal switch
"""


def test_old_soc_legend_is_reported_as_sys() -> None:
    topology = topology_from_smi_texts(OLD_DRIVER_SOC)
    assert topology.link(0, 2).pcie is PciePath.SYS
    assert topology.link(0, 1).pcie is PciePath.PIX
    assert topology.link(2, 3).kind == "PHB"
    assert topology.gpus[2].cpu_affinity[:2] == [8, 9]


def test_literal_caret_escape_codes_and_prompt_lines_and_crlf() -> None:
    text = (
        "$ nvidia-smi topo -m\r\n"
        "\t^[[4mGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID^[[0m\r\n"
        "GPU0\t X \tNV8\t0-55\t0\t\tN/A\r\n"
        "GPU1\tNV8\t X \t0-55\t0\t\tN/A\r\n"
    )
    topology = topology_from_smi_texts(text)
    assert topology.link(0, 1).nvlinks == 8


def test_indented_markdown_paste_with_blank_line_between_rows() -> None:
    text = (
        "    \tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\n"
        "    GPU0\t X \tSYS\t0-11\t0\n"
        "\n"
        "    GPU1\tSYS\t X \t12-23\t1\n"
    )
    topology = topology_from_smi_texts(text)
    assert topology.link(0, 1).pcie is PciePath.SYS
    assert topology.gpus[1].numa_node == 1


GRACE_HOPPER = (
    "\tGPU0\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    "GPU0\t X \tSYS\t0-71\t0\t\t1\n"
    "NIC0\tSYS\t X \t\t\t\t\n"
)


def test_gpu_numa_id_of_coherent_hosts() -> None:
    topology = topology_from_smi_texts(GRACE_HOPPER)
    assert topology.gpus[0].gpu_numa_node == 1
    assert topology.gpus[0].numa_node == 0


@pytest.mark.parametrize(
    ("text", "message", "token"),
    [
        ("no matrix here\n", "no header row", None),
        ("\tGPU0\tGPU1\nGPU0\t X \tNV2\nGPU1\tNV1\t X \n", "not symmetric", "NV1"),
        ("\tGPU0\tGPU1\nGPU0\t X \tNV2\nGPU7\tNV2\t X \n", "expected the row of GPU1", "GPU7"),
        ("\tGPU0\tGPU1\nGPU0\tNV2\tNV2\nGPU1\tNV2\t X \n", "diagonal", "NV2"),
        ("\tGPU0\tGPU1\nGPU0\t X \tQPI\nGPU1\tQPI\t X \n", "not a link class", "QPI"),
        ("\tGPU0\tGPU1\nGPU0\t X \nGPU1\tSYS\t X \n", "has 1 matrix cell;", None),
        ("\tGPU1\tGPU0\nGPU1\t X \tSYS\n", "no header row", None),
        ("\tGPU0\tGPU2\nGPU0\t X \tSYS\nGPU2\tSYS\t X \n", "in order", "GPU2"),
        ("\tGPU0\tCPU Affinity\nGPU0\t X \t0-3x\n", "not a valid CPU Affinity", "0-3x"),
        ("\tGPU0\tCPU Affinity\nGPU0\t X \t0-3\t7\n", "more values", "7"),
        ("\tGPU0\tCPU Affinity\tfoo\nGPU0\t X \t0-3\n", "unexpected text", "foo"),
    ],
)
def test_malformed_inputs(text: str, message: str, token: str | None) -> None:
    with pytest.raises(TopologyParseError, match=message) as info:
        parse_topo_matrix(text, source="t.txt")
    assert info.value.token == token
    assert str(info.value).startswith("t.txt")
