"""MIG discovery: the model, NVML, nvidia-smi texts, ``topo show/import``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pynvml
import pytest
from msgspec.structs import replace

from gpualloc.discovery import numa as numa_source
from gpualloc.discovery import nvml as nvml_source
from gpualloc.discovery import resolve
from gpualloc.discovery.mig_text import (
    mig_instances_from_texts,
    parse_gpu_instances,
    parse_gpu_list,
    parse_mig_device_table,
    read_mig_texts,
)
from gpualloc.discovery.nvml import NvmlSession
from gpualloc.errors import ExitCode, TopologyError, TopologyParseError
from gpualloc.model import MigInstance, Topology, parse_mig_profile
from gpualloc.model.mig import parse_mig_label
from gpualloc.topologies import load_bundled
from tests.fake_nvml import FakeNvml
from tests.recordings import RECORDED, recorded

MIB = 1024 * 1024
SEVEN = "mig_nvidia-smi-L_a100-40gb_7x1g.5gb.txt"
LGI = "mig_lgi_a100-40gb_2x3g.20gb.txt"
TABLE = "mig_nvidia-smi-table_2x3g.20gb_TOP-CUT.txt"


# ---- the model -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "slices", "compute", "memory"),
    [
        ("1g.5gb", 1, 1, 5),
        ("3g.20gb", 3, 3, 20),
        ("1c.3g.20gb", 3, 1, 20),
        ("1g.10gb+me", 1, 1, 10),
        ("7g.80gb", 7, 7, 80),
        ("1g.24gb-me", 1, 1, 24),
    ],
)
def test_profiles_parse(text: str, slices: int, compute: int, memory: int) -> None:
    profile = parse_mig_profile(text)
    assert (profile.slices, profile.compute_slices, profile.nominal_memory_gb) == (
        slices,
        compute,
        memory,
    )


@pytest.mark.parametrize("text", ["", "3g", "20gb", "0g.5gb", "3c.1g.5gb", "3g.20GiB", "a100"])
def test_malformed_profiles_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_mig_profile(text)


def test_labels_round_trip() -> None:
    assert parse_mig_label("GPU0/MIG3") == (0, 3)
    assert parse_mig_label("1:2") == (1, 2)
    assert parse_mig_label("gpu2/mig0") == (2, 0)
    assert parse_mig_label("3") is None
    assert parse_mig_label("MIG-ffda444c") is None


def _document(**changes: object) -> dict:
    data = load_bundled("dgx-a100-mig").to_json_dict()
    data.update(changes)
    return data


def test_bundled_mig_topologies_round_trip_through_json() -> None:
    for name in ("dgx-a100-mig", "hgx-h100-mig"):
        topology = load_bundled(name)
        again = Topology.from_json(topology.to_json())
        assert again.mig_instances == topology.mig_instances
        assert topology.mig_instances, name
        for gpu in {m.gpu for m in topology.mig_instances}:
            assert topology.gpus[gpu].mig_enabled is True
            # No GPU has more than 7 GPU slices in instances.
            assert sum(m.slices for m in topology.mig_on(gpu)) <= 7


def test_a_version_1_file_reads_as_a_host_without_mig() -> None:
    data = load_bundled("dgx-a100").to_json_dict()
    data["schema_version"] = 1
    del data["mig_instances"]
    assert Topology.from_json_dict(data).mig_instances == []


def _as_documents(instances: list[MigInstance]) -> list[dict]:
    return [{k: getattr(m, k) for k in MigInstance.__struct_fields__} for m in instances]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda m: [*m, m[0]], "listed twice"),
        (lambda m: [replace(m[0], gpu=9), *m[1:]], "does not exist"),
        (lambda m: [replace(m[1], uuid=m[0].uuid), m[0]], "listed twice"),
    ],
)
def test_impossible_mig_layouts_are_refused(mutate, message: str) -> None:
    instances = load_bundled("dgx-a100-mig").mig_instances
    data = _document(mig_instances=_as_documents(mutate(instances)))
    with pytest.raises(TopologyError, match=message):
        Topology.from_json_dict(data)


def test_a_malformed_profile_in_a_file_is_refused() -> None:
    documents = _as_documents(load_bundled("dgx-a100-mig").mig_instances)
    documents[0]["profile"] = "3x.20gb"
    with pytest.raises(TopologyError, match="not a MIG profile"):
        Topology.from_json_dict(_document(mig_instances=documents))


def test_a_mig_device_on_a_gpu_with_mig_off_is_refused() -> None:
    data = _document()
    data["gpus"][0]["mig_enabled"] = False
    with pytest.raises(TopologyError, match="whose MIG mode is off"):
        Topology.from_json_dict(data)


# ---- nvidia-smi texts ------------------------------------------------------------------------


def test_nvidia_smi_list_with_seven_mig_devices() -> None:
    listed = parse_gpu_list(recorded(SEVEN))
    assert [(g.index, g.name) for g in listed.gpus] == [(0, "NVIDIA A100-SXM4-40GB")]
    assert [m.device for m in listed.mig] == list(range(7))
    assert {m.profile for m in listed.mig} == {"1g.5gb"}
    assert listed.mig[0].uuid == "MIG-ffda444c-c706-57c6-98c9-67c441a0b109"
    assert listed.mig[6].uuid == "MIG-a8e039b8-35d4-590b-80ab-bc9d329d2067"


def test_gpu_instances_and_device_table_join_by_gi() -> None:
    """The real -lgi lists GI 1 at 4:4 before GI 2 at 0:4; the table maps MIG device 0 to GI 1
    (20224 MiB) and device 1 to GI 2 (20096 MiB)."""
    lgi = parse_gpu_instances(recorded(LGI))
    assert [(r.gpu_instance, r.start, r.size, r.profile_id) for r in lgi] == [
        (1, 4, 4, 9),
        (2, 0, 4, 9),
    ]
    table = parse_mig_device_table(recorded(TABLE))
    assert [(r.device, r.gpu_instance, r.memory_total_bytes // MIB) for r in table] == [
        (0, 1, 20224),
        (1, 2, 20096),
    ]
    assert table[0].memory_used_bytes == 11 * MIB
    instances = mig_instances_from_texts(gpu_instances=lgi, devices=table)
    assert [
        (m.label, m.profile, m.placement_start, m.memory_total_bytes // MIB) for m in instances
    ] == [
        ("GPU0/MIG0", "3g.20gb", 4, 20224),
        ("GPU0/MIG1", "3g.20gb", 0, 20096),
    ]
    assert all(m.uuid is None for m in instances)


def test_gpu_instances_alone_cannot_name_the_devices() -> None:
    with pytest.raises(TopologyParseError, match="which MIG device") as info:
        mig_instances_from_texts(gpu_instances=parse_gpu_instances(recorded(LGI)))
    assert "nvidia-smi -L" in (info.value.hint or "")


def test_a_mig_line_that_does_not_parse_is_an_error_naming_it() -> None:
    text = recorded(SEVEN).replace("Device  3:", "Device three:")
    with pytest.raises(TopologyParseError, match="line 5"):
        parse_gpu_list(text)
    with pytest.raises(TopologyParseError, match="not a MIG profile"):
        parse_gpu_list(recorded(SEVEN).replace("MIG 1g.5gb      Device  2", "MIG 1x.5gb Device  2"))


def test_texts_are_recognised_by_their_content() -> None:
    texts = read_mig_texts([("a", recorded(TABLE)), ("b", recorded(LGI))])
    assert texts.listed is None and texts.devices and texts.gpu_instances
    with pytest.raises(TopologyParseError, match="neither"):
        read_mig_texts([("c", recorded("numactl_2socket_x86_delos.txt"))])


# ---- NVML ------------------------------------------------------------------------------------


def _probe(fake: FakeNvml) -> Topology:
    with NvmlSession(fake) as session:
        return session.probe(numa_nodes=[], cpu_count=256)


@pytest.mark.parametrize("name", ["dgx-a100-mig", "hgx-h100-mig"])
def test_nvml_lists_the_mig_devices_of_the_bundled_hosts(name: str) -> None:
    bundled = load_bundled(name)
    found = _probe(FakeNvml.from_topology(bundled))
    assert found.mig_instances == bundled.mig_instances
    assert [g.mig_enabled for g in found.gpus] == [g.mig_enabled for g in bundled.gpus]


def test_without_privileges_placements_are_unknown_and_said_so() -> None:
    fake = FakeNvml.from_topology(load_bundled("dgx-a100-mig"))
    for gpu in fake.gpus:
        gpu.unsupported.add("nvmlDeviceGetGpuInstanceById")
    found = _probe(fake)
    assert all(m.placement_start is None for m in found.mig_instances)
    assert found.mig_instances[0].memory_total_bytes == 4864 * MIB
    notes = [n for n in found.provenance.notes if "MIG placements unknown" in n]
    assert len(notes) == 3  # one per GPU in MIG mode, not one per device


def test_the_profile_comes_from_the_sizes_when_the_name_does_not_say() -> None:
    fake = FakeNvml.from_topology(load_bundled("dgx-a100-mig"))
    fake.gpus[1].unsupported.add("nvmlDeviceGetName")  # the MIG handles of GPU 1
    found = _probe(fake)
    assert [m.profile for m in found.mig_on(1)] == ["3g.20gb", "3g.20gb"]


def test_a_new_mig_layout_invalidates_the_cached_topology(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml.from_topology(load_bundled("dgx-a100-mig"))
    monkeypatch.setattr(nvml_source, "load_pynvml", lambda: fake)
    monkeypatch.setattr(numa_source, "discover_numa", lambda notes: [])
    assert len(resolve.resolve_topology().mig_on(0)) == 7
    fake.gpus[0].mig = fake.gpus[0].mig[:3]  # an administrator destroyed four instances
    assert len(resolve.resolve_topology().mig_on(0)) == 3
    fake.gpus[0].mig_mode = 0
    fake.gpus[0].mig = []
    again = resolve.resolve_topology()
    assert again.gpus[0].mig_enabled is False and not again.mig_on(0)


def test_nvidia_smi_fallback_reads_the_mig_devices(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without NVML: ``--query-gpu`` says MIG is on, ``-L`` and the table say what is there."""
    fake = FakeNvml([], {})
    fake.init_error = pynvml.NVMLError_DriverNotLoaded()
    monkeypatch.setattr(nvml_source, "load_pynvml", lambda: fake)
    monkeypatch.setattr(numa_source, "discover_numa", lambda notes: [])
    query = (
        "0, GPU-838f60d9-651f-9166-ea42-f9da674a6947, 00000000:07:00.0, "
        "NVIDIA A100-SXM4-40GB, 1324821083800, 40960, Enabled, Disabled, 4, 16, 535.1\n"
    )
    script = tmp_path / "bin" / "nvidia-smi"
    script.parent.mkdir()
    script.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        f"  topo) sed '1,/^$/d' {RECORDED / '1gpu_rtx-pro-6000_wsl2_empty-affinity_topo.txt'} ;;\n"
        "  nvlink) exit 3 ;;\n"
        f"  -L) sed '1,/^$/d' {RECORDED / SEVEN} ;;\n"
        f"  --query-gpu*) printf '%s' '{query}' ;;\n"
        "  *) exit 9 ;;\n"
        "esac\n"
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}:{os.environ['PATH']}")
    topology = resolve.resolve_topology()
    assert topology.provenance.source == "nvidia-smi"
    assert [m.uuid for m in topology.mig_instances][:1] == [
        "MIG-ffda444c-c706-57c6-98c9-67c441a0b109"
    ]
    assert len(topology.mig_instances) == 7
    assert any("MIG memory unknown" in n for n in topology.provenance.notes)
    gpu = topology.gpus[0]  # mig.mode.pending: disabled at the next reset
    assert (gpu.mig_enabled, gpu.mig_pending, gpu.serial) == (True, False, "1324821083800")


def test_a_mig_mode_pending_a_reset_is_read_and_renews_the_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``nvidia-smi -i N -mig 0|1`` on a GPU that cannot be reset now changes NVML's pending
    mode only: b2653dd read the current one alone, and its cache key held neither, so
    ``topo show``, ``status`` and ``doctor`` showed the old mode until ``--refresh``."""
    fake = FakeNvml.from_topology(load_bundled("dgx-a100-mig"))
    monkeypatch.setattr(nvml_source, "load_pynvml", lambda: fake)
    monkeypatch.setattr(numa_source, "discover_numa", lambda notes: [])
    assert resolve.resolve_topology().gpus[0].mig_pending is True  # cached from here on
    fake.gpus[0].mig_pending = 0  # an administrator turned MIG off; GPU 0 still runs jobs
    fake.gpus[5].mig_pending = 1
    topology = resolve.resolve_topology()
    assert [(g.mig_enabled, g.mig_pending) for g in topology.gpus][:6] == [
        (True, False), (True, True), (True, True), (False, False), (False, False), (False, True),
    ]  # fmt: skip
    from gpualloc.cli.topology_view import mig_changes

    assert mig_changes(topology) == [
        "GPU 0: MIG disabling at next reset (on until then)",
        "GPU 5: MIG enabled, pending reset (off until the GPU is reset)",
    ]


# ---- the CLI ---------------------------------------------------------------------------------


def _saved(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name.replace(".txt", ".out")
    path.write_text(recorded(name))
    return path


def test_topo_show_lists_the_mig_devices(cli) -> None:
    result = cli("--topology", "dgx-a100-mig", "topo", "show")
    assert result.exit_code == 0, result.stderr
    assert "12 MIG devices on GPU 0-2" in result.stdout
    assert "MIG devices" in result.stdout
    row = next(line for line in result.stdout.splitlines() if line.strip().startswith("GPU1/MIG0"))
    assert row.split()[1:6] == ["3g.20gb", "3", "20", "GiB", "1/0"]
    data = json.loads(cli("--topology", "dgx-a100-mig", "topo", "show", "--json").stdout)
    assert len(data["mig_instances"]) == 12
    assert data["mig_instances"][7]["memory_total_bytes"] == 20224 * MIB


def test_topo_import_of_nvidia_smi_list_alone(cli, tmp_path: Path) -> None:
    result = cli("topo", "import", "--mig", str(_saved(tmp_path, SEVEN)), "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["gpus"][0]["mig_enabled"] is True
    assert data["gpus"][0]["uuid"] == "GPU-838f60d9-651f-9166-ea42-f9da674a6947"
    assert [m["profile"] for m in data["mig_instances"]] == ["1g.5gb"] * 7
    shown = cli("topo", "import", "--mig", str(_saved(tmp_path, SEVEN))).stdout
    assert "~4.0 GiB" not in shown and "~5.0 GiB" in shown  # nominal size, marked as such


def test_topo_import_adds_gpu_instances_and_table_to_a_topo_matrix(cli, tmp_path: Path) -> None:
    topo = tmp_path / "topo.txt"
    topo.write_text(recorded("1gpu_rtx-pro-6000_wsl2_empty-affinity_topo.txt"))
    result = cli(
        "topo",
        "import",
        str(topo),
        "--mig",
        str(_saved(tmp_path, LGI)),
        "--mig",
        str(_saved(tmp_path, TABLE)),
        "--json",
    )
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert [(m["gpu_instance"], m["placement_start"]) for m in data["mig_instances"]] == [
        (1, 4),
        (2, 0),
    ]


def test_topo_import_errors_are_one_line_with_a_hint(cli, tmp_path: Path) -> None:
    result = cli("topo", "import", "--mig", str(_saved(tmp_path, LGI)))
    assert result.exit_code == ExitCode.TOPOLOGY_PARSE
    assert result.stderr.startswith("error: without a 'nvidia-smi topo -m' file")
    assert "Traceback" not in result.stderr
    two = tmp_path / "two.txt"
    two.write_text(recorded("2gpu_pcie_phb_hf-docs_topo.txt"))
    result = cli("topo", "import", str(two), "--mig", str(_saved(tmp_path, SEVEN)))
    assert result.exit_code == ExitCode.TOPOLOGY_PARSE
    assert "'nvidia-smi -L' lists 1 GPU but the topology has 2" in result.stderr
