"""Topologies through the command line: named (bundled, a file, ``GPUALLOC_TOPOLOGY``), read
(raw ``nvidia-smi topo -m`` text, an import with its companions or from stdin), shown, listed
and recorded; and the one-line error with its exit code where none can be had."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from gpualloc.errors import ExitCode
from tests.cli_harness import Result
from tests.recordings import RECORDED, recorded

Cli = Callable[..., Result]


def test_a_mixed_hosts_headers_name_its_models(cli: Cli, tmp_path: Path) -> None:
    """b2653dd named the model only where every GPU was of one: '8 GPUs, PCIe only'."""
    from msgspec.structs import replace

    from gpualloc.topologies import load_bundled

    base = load_bundled("pcie-8gpu-2socket")
    names = ["NVIDIA A100-SXM4-40GB"] * 4 + ["NVIDIA L40S"] * 3 + [None]
    gpus = [replace(g, name=name) for g, name in zip(base.gpus, names, strict=True)]
    path = tmp_path / "mixed.json"
    path.write_text(replace(base, gpus=gpus).to_json())
    models = "4x NVIDIA A100-SXM4-40GB + 3x NVIDIA L40S + 1 unknown"
    shown = cli("--topology", str(path), "topo", "show")
    assert shown.stdout.splitlines()[0].startswith(f"pcie-8gpu-2socket: 8 GPUs ({models}), ")
    assert cli("--topology", str(path), "status").stdout.splitlines()[0].endswith(f"({models})")
    doctor = cli("--topology", str(path), "doctor")
    assert doctor.stdout.splitlines()[0] == f"gpualloc doctor: {models}"
    assert cli("--topology", "dgx1-v100", "doctor").stdout.splitlines()[0] == "gpualloc doctor"


def test_topo_show_renders_the_dgx1_v100_cube_mesh(cli: Cli) -> None:
    result = cli("--topology", "dgx1-v100", "topo", "show")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "dgx1-v100: 8 GPUs x Tesla V100-SXM2-32GB, NVLink (NV1/NV2), 2 NUMA nodes"
    links = lines.index("Links")
    assert lines[links + 2].split() == [
        "GPU0",
        "X",
        "NV1",
        "NV1",
        "NV2",
        "NV2",
        "SYS",
        "SYS",
        "SYS",
    ]
    assert lines[links + 9].split() == [
        "GPU7",
        "SYS",
        "SYS",
        "SYS",
        "NV1",
        "NV2",
        "NV1",
        "NV2",
        "X",
    ]
    pcie = lines.index("PCIe paths (also under NVLinked pairs)")
    assert lines[pcie + 2].split()[1:4] == ["X", "PIX", "PHB"]
    bandwidth = next(i for i, line in enumerate(lines) if line.startswith("Bandwidth"))
    assert lines[bandwidth + 2].split()[1:6] == ["X", "25.0", "25.0", "50.0", "50.0"]
    assert "NUMA nodes" in lines
    assert any(line.split()[:3] == ["1", "20-39,60-79", "256"] for line in lines)
    assert "\x1b[" not in result.stdout  # plain when not a terminal
    assert result.stderr == ""


@pytest.mark.parametrize("name", ["dgx2", "summit-node", "single-gpu", "nvlink-pairs-4gpu"])
def test_topo_show_every_shape(cli: Cli, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert cli("--topology", name, "topo", "show").exit_code == 0
    monkeypatch.setattr("gpualloc.cli.output.stdout_is_terminal", lambda: True)
    rich = cli("--topology", name, "topo", "show")
    assert rich.exit_code == 0 and "GPUs" in rich.stdout and "NUMA nodes" in rich.stdout


def test_topo_show_json_is_the_model(cli: Cli) -> None:
    result = cli("--topology", "hgx-h100", "topo", "show", "--json")
    data = json.loads(result.stdout)
    assert len(data["gpus"]) == 8
    assert data["links"][0] == data["links"][0] | {
        "a": 0, "b": 1, "kind": "NV18", "nvlinks": 18, "nvswitch": True, "bandwidth_gbps": 450.0
    }  # fmt: skip


def test_topology_from_the_environment(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUALLOC_TOPOLOGY", "minsky-p100")
    assert json.loads(cli("topo", "show", "--json").stdout)["name"] == "minsky-p100"


def test_topology_from_a_raw_text_file(cli: Cli) -> None:
    path = RECORDED / "ibm-ac922_4gpu_power9_topo.txt"
    result = cli("--topology", str(path), "topo", "show", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["links"][0]["kind"] == "NV3"


def test_topo_list(cli: Cli) -> None:
    text = cli("topo", "list").stdout
    assert "dgx1-v100" in text and "torus-2d-16" in text
    data = json.loads(cli("topo", "list", "--json").stdout)
    by_name = {entry["name"]: entry for entry in data}
    assert by_name["dgx2"]["gpus"] == 16
    assert [entry["name"] for entry in data] == sorted(by_name)


def test_topo_import_with_companions_to_a_file(cli: Cli, tmp_path: Path) -> None:
    out = tmp_path / "v100.json"
    result = cli(
        "topo", "import", str(RECORDED / "dgx1-v100_vast_topo.txt"),
        "--nvlink", str(RECORDED / "nvlink_status_v100-sxm2-8gpu_vast.txt"),
        "--numa", str(RECORDED / "numactl_2socket_x86_delos.txt"),
        "-o", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "" and f"wrote {out} (8 GPUs)" in result.stderr
    shown = cli("--topology", str(out), "topo", "show", "--json")
    data = json.loads(shown.stdout)
    assert data["gpus"][0]["name"] == "Tesla V100-SXM2-32GB"
    assert data["numa_nodes"][0]["memory_total_bytes"] == 772696 * 1024**2


def test_topo_import_from_stdin(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO(recorded("2x-rtx5090_threadripper_phb_topo.txt")))
    data = json.loads(cli("topo", "import", "-", "--json", "--name", "tr").stdout)
    assert data["name"] == "tr" and data["links"][0]["kind"] == "PHB"


def test_topo_record_of_a_named_topology(cli: Cli, tmp_path: Path) -> None:
    out = tmp_path / "host.json"
    assert cli("--topology", "dgx-a100", "topo", "record", "-o", str(out)).exit_code == 0
    assert json.loads(out.read_text())["gpus"][0]["numa_node"] == 3


def test_bandwidth_table_option(cli: Cli, tmp_path: Path) -> None:
    table = tmp_path / "table.json"
    table.write_text('{"nvlink_link_gbps": {"2": 30}}')
    data = json.loads(
        cli(
            "--bandwidth-table", str(table), "--topology", "dgx1-v100", "topo", "show", "--json"
        ).stdout
    )
    assert data["links"][2]["bandwidth_gbps"] == 60.0


# ---- no topology to be had -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--topology", "dgx1v100", "topo", "show"], ExitCode.TOPOLOGY_NOT_FOUND, "dgx1-v100"),
        (
            ["--topology", "/nope.json", "topo", "show"],
            ExitCode.TOPOLOGY_NOT_FOUND,
            "does not exist",
        ),
        (
            ["topo", "import", str(RECORDED / "hgx-h100_12nic_numa-off_MALFORMED-paste_topo.txt")],
            ExitCode.TOPOLOGY_PARSE,
            "PIXNODE",
        ),
        (["topo", "import", "/nope.txt"], ExitCode.IO, "does not exist"),
        (["--bandwidth-table", "/nope", "topo", "list"], ExitCode.IO, "does not exist"),
        (["topo", "frobnicate"], ExitCode.USAGE, "error: no such command 'frobnicate'"),
    ],
)
def test_errors_are_one_line_with_an_exit_code(
    cli: Cli, args: list[str], code: int, message: str
) -> None:
    result = cli(*args)
    assert result.exit_code == code
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_no_gpu_and_no_topology(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    import pynvml

    from gpualloc.discovery import nvml
    from tests.fake_nvml import FakeNvml

    fake = FakeNvml([], {})
    fake.init_error = pynvml.NVMLError_LibraryNotFound()
    monkeypatch.setattr(nvml, "load_pynvml", lambda: fake)
    monkeypatch.setenv("PATH", "/nonexistent")
    result = cli("topo", "show")
    assert result.exit_code == ExitCode.NO_GPU
    lines = result.stderr.splitlines()
    assert lines[0].startswith("error: no NVIDIA GPU found")
    assert (
        lines[1]
        == "hint: try a bundled topology: --topology dgx1-v100 (gpualloc topo list shows them all)"
    )


def test_debug_shows_the_traceback(cli: Cli) -> None:
    result = cli("--debug", "--topology", "/etc/hostname", "topo", "show")
    assert result.exit_code == ExitCode.TOPOLOGY_PARSE
    assert "Traceback" in result.stderr
