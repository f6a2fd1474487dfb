"""Every real ``NVRM: Xid`` line in ``fixtures/measured/xid`` (published kernel logs, each with
its source) is parsed, and classified as NVIDIA's Xid catalogue says: a GPU fault, or the
program's error / a benign event."""

from __future__ import annotations

from pathlib import Path

import pytest
from msgspec.structs import replace

from gpualloc.discovery import xid
from gpualloc.measurements.provenance import split_provenance
from gpualloc.topologies import load_bundled

XID_LOGS = Path(__file__).parent / "fixtures" / "measured" / "xid"

EXPECTED = {
    "xid119_gsp_timeout_azure_distributed_nhc.txt": [("0002:00:00", 119, "GSP RPC timeout")],
    "xid13_109_gpud_pr46.txt": [("0000:CB:00", 13, None)] * 3 + [("0000:CB:00", 109, None)],
    "xid144_145_149_nvlink_gpud_pr1160_1174.txt": [
        ("0000:01:00", 144, None),  # "Nonfatal"
        ("0000:00:00", 149, "NVLink NETIR error (fatal)"),
        ("0000:00:00", 149, "NVLink NETIR error (fatal)"),
        ("0019:01:00", 149, "NVLink NETIR error (fatal)"),
        ("0018:01:00", 145, None),  # "Nonfatal"
    ],
    "xid31_13_32_desktop_dxvk1027.txt": [("0000:01:00", 31, None)]
    + [("0000:01:00", 13, None)] * 4
    + [("0000:01:00", 32, None)],
    "xid32_31_laptop_bumblebee677.txt": [("0000:01:00", 32, None)] * 2 + [("0000:01:00", 31, None)],
    "xid48_dbe_gpuoperator1146.txt": [("0000:07:00", 48, "double-bit ECC error")],
    "xid63_row_remap_mlengineering.txt": [("0000:10:1C", 63, None)],
}


def test_every_recorded_xid_file_is_covered() -> None:
    assert sorted(p.name for p in XID_LOGS.glob("*.txt")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_real_xid_lines_are_parsed_and_classified(name: str) -> None:
    _, lines = split_provenance((XID_LOGS / name).read_text())  # a note quotes a hand-made line
    text = "\n".join(lines)
    events = xid.xid_events(text)
    assert len(events) == text.count("NVRM: Xid")  # no line missed, none invented
    got = [(event.device, event.code, xid.fault_of(event)) for event in events]
    assert got == EXPECTED[name]


def test_a_real_fatal_line_makes_the_gpu_a_fault_and_the_programs_error_does_not() -> None:
    topology = load_bundled("dgx1-v100")
    gpus = list(topology.gpus)
    gpus[2] = replace(gpus[2], pci_bus_id="00000000:07:00.0")  # the DBE's GPU
    gpus[3] = replace(gpus[3], pci_bus_id="00000000:CB:00.0")  # Xid 13 and 109
    topology = replace(topology, gpus=gpus)
    log = (XID_LOGS / "xid48_dbe_gpuoperator1146.txt").read_text() + (
        XID_LOGS / "xid13_109_gpud_pr46.txt"
    ).read_text()
    (fault,) = xid.xid_faults(topology, log)
    assert (fault.gpu, fault.detail) == (2, "Xid 48: double-bit ECC error")
