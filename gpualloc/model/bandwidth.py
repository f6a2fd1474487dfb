"""The one table behind every link-bandwidth estimate, and the estimate itself.

Every figure is a *unidirectional* data rate in GB/s (10^9 bytes per second), the unit NVIDIA
uses for ``nvidia-smi nvlink -s`` and the unit of the MAPA paper's bandwidths. A pair's estimate is:

- NVLinked pair: ``links x per-link rate``. The per-link rate is the one the driver reported for
  these GPUs when a source told it (``nvidia-smi nvlink -s``), else the table's rate for the GPU
  architecture (:mod:`gpualloc.model.catalog`) where it differs from its generation's, else the
  table's rate for the link's NVLink generation. Through an NVSwitch the same formula holds: a
  GPU's links into the switch fabric are all usable to any one peer.
- PCIe-only pair: ``lane rate(generation) x lanes x path factor``, with the lower generation and
  width of the two GPUs. The path factor is the penalty for a path that climbs above a PCIe switch;
  ``SYS`` carries the cost of crossing the CPU interconnect.

The table is a validated struct, so it can be overridden in full or in part from a JSON file
(``--bandwidth-table FILE`` / ``GPUALLOC_BANDWIDTH_TABLE``); later issues calibrate it against
measurements.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from msgspec import Struct, field

from gpualloc.errors import FileAccessError, TopologyError
from gpualloc.model.paths import PciePath
from gpualloc.model.validation import (
    PositiveInt,
    ValidationError,
    describe_validation_error,
    from_builtins,
    to_builtins,
)

MAX_RATE_GBPS = 100_000.0
"""The highest per-link or per-lane rate a table may state (no link comes near it)."""


class BandwidthTable(Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Per-link and per-lane data rates and PCIe path penalties. Units: GB/s, one direction."""

    nvlink_link_gbps: dict[int, float] = field(
        default_factory=lambda: {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 5: 50.0}
    )
    """Per-link, per-direction NVLink rate by NVLink generation. Sources: NVIDIA Tesla P100
    whitepaper (NVLink 1: 4 links, 160 GB/s bidirectional -> 20), Tesla V100 whitepaper (NVLink
    2: 6 links, 300 GB/s -> 25), A100 whitepaper (NVLink 3: 12 links, 600 GB/s -> 25), H100
    whitepaper (NVLink 4: 18 links, 900 GB/s -> 25), Blackwell architecture brief (NVLink 5: 18
    links, 1.8 TB/s -> 50)."""
    nvlink_link_gbps_by_architecture: dict[str, float] = field(
        default_factory=lambda: {"ampere-ga102": 14.0625}
    )
    """Per-link rates of GPU architectures whose NVLink runs slower than their generation's
    (keys are catalog architectures). Source: RTX A6000 datasheet, NVLink bridge 112.5 GB/s
    bidirectional over 4 links -> 14.0625 (also RTX 3090, A40, A5000)."""
    default_nvlink_generation: PositiveInt = 2
    """Generation assumed when no source tells it (a bare 'nvidia-smi topo -m' names no GPU
    model). 2 is the generation of the MAPA paper's DGX-1 V100."""
    pcie_lane_gbps: dict[int, float] = field(
        default_factory=lambda: {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
    )
    """Per-lane, per-direction PCIe rate after line encoding, by PCIe generation. Source:
    PCI-SIG base specifications (2.5/5 GT/s with 8b/10b; 8/16/32 GT/s with 128b/130b; 64 GT/s
    PAM4 with 242B/256B FLITs)."""
    default_pcie_generation: PositiveInt = 3
    """PCIe generation assumed when no source tells it (most GPUs of 2016-2020)."""
    default_pcie_width: PositiveInt = 16
    """PCIe lanes assumed when unknown."""
    pcie_path_factor: dict[PciePath, float] = field(
        default_factory=lambda: {
            PciePath.BOARD: 1.0,
            PciePath.PIX: 1.0,
            PciePath.PXB: 0.9,
            PciePath.PHB: 0.8,
            PciePath.NODE: 0.7,
            PciePath.SYS: 0.5,
        }
    )
    """Fraction of the PCIe link rate that peer traffic achieves along each path class.

    SYS at one half is measured: the Kubernetes GPU-topology proposal (seed 001) publishes a
    DGX-1 V100's bandwidth matrix in which the PCIe-only pairs (PCIe 3.0 x16, 15.75 GB/s each
    way, through the CPUs) move 14.6 to 17.6 GB/s counted both ways (two readings of 4.6 and
    5.0 aside), i.e. 0.46 to 0.56 of the link each way. Its figures are read as both ways
    because its NVLink pairs, 96.4 and 48.4, are two and one NVLink 2 links (50 and 25 GB/s
    each way) counted so. Peer traffic across QPI/UPI is staged through host memory (CUDA C
    Programming Guide, 'Peer-to-Peer Memory Access'). PIX, PXB, PHB and NODE are gpualloc's
    prior, ordered as NVML's topology levels, pending measurements of such hosts
    (``topo import --bandwidth-matrix``)."""
    pcie_path_factor_by_generation: dict[int, dict[PciePath, float]] = field(
        default_factory=lambda: {4: {PciePath.SYS: 0.7}}
    )
    """Path factors for pairs whose PCIe generation (the lower of the two GPUs') is the key's
    or newer, the newest key that applies winning; paths it does not name keep
    :attr:`pcie_path_factor`. SYS from PCIe 4.0 on is measured: six RTX A6000 (PCIe 4.0 x16,
    31.5 GB/s) copy 21.8 to 22.6 GB/s between GPUs of different groups (nvbandwidth,
    NVIDIA/nvbandwidth#50; docs/evaluation.md section 5), 0.70 of the link where the DGX-1's
    PCIe 3.0 path through the CPUs gave 0.5. One host: the factor is that host's until more
    recordings say otherwise."""
    unknown_path_factor: float = 0.5
    """Factor for a pair whose PCIe path is unknown: assume the worst (SYS)."""
    nccl_nvlink_efficiency: float = 0.8
    """Share of a ring's slowest NVLink rate that NCCL's all-reduce bus bandwidth reaches, large
    messages. Measured (nccl-tests, docs/evaluation.md section 5): 0.78 on A100 through NVSwitch
    (235 of 300 GB/s, twice), 0.84 on A40 over an NV4 bridge (47.5 of 56.25). Only collectives
    are scaled (:func:`gpualloc.model.rings.allreduce_busbw_gbps`), not copies, which reach
    0.97 of the link (DGX Station, p2pBandwidthLatencyTest)."""
    nvswitch_copy_efficiency: float = 0.84
    """Share of a pair's NVLink rate that a copy between two GPUs reaches through an NVSwitch
    (p2pBandwidthLatencyTest, nvbandwidth; not collectives, which have their own factor).
    Published: 8x H100 SXM (NVLink 4, 18 links, 450 GB/s each way) copy 371 to 377 GB/s one
    way and 740 to 749 GB/s both ways, 0.82 to 0.84 (NVIDIA/nccl#1264, where a second owner's
    376 GB/s is quoted too). No recording here has a copy through an NVSwitch: one host type,
    outside this project's recordings. Direct NVLinks are not scaled (a DGX Station's NV2 pairs
    reach 0.97 of the link, tests/fixtures/measured)."""
    nccl_staged_efficiency: float = 0.24
    """Share of the staged copy rate (:attr:`staged_copy_factor`) that NCCL's all-reduce bus
    bandwidth reaches over a ring with a pair that has no peer access: NCCL then moves data
    through shared host memory (its SHM transport), as it does under ``NCCL_P2P_DISABLE=1``.
    Measured (nccl-tests, tests/fixtures/measured, docs/evaluation.md section 5) with P2P
    disabled: 0.24 on an A40 pair across PCIe switches (3.6 of 15.0 GB/s), 0.10 on four A40s
    across sockets (1.4 of 14.2), 0.37 on four A100s of a DGX A100 (5.2 of 14.2); the median is
    taken. Three runs on two hosts, and they spread: out of sample (each fitted on the others)
    the errors are large, and docs/evaluation.md says so."""
    staged_copy_factor: float = 0.5
    """Fraction of the PCIe link rate a copy between two GPUs without peer access achieves
    (staged through host memory: the CUDA C Programming Guide, 'Peer-to-Peer Memory Access').
    Measured (tests/fixtures/measured, docs/evaluation.md section 5): 0.36 between two RTX
    2080 Ti without P2P (5.7 of 15.75 GB/s, PCIe 3.0), 0.50 with P2P disabled on a DGX Station
    (7.9 of 15.75 each way), 0.70 on the 6-GPU PCIe 4.0 host of NVIDIA/nccl#814 (22 of 31.5);
    the middle one is taken."""
    staged_path_factor: dict[PciePath, float] = field(
        default_factory=lambda: {
            PciePath.BOARD: 1.0,
            PciePath.PIX: 1.0,
            PciePath.PXB: 1.0,
            PciePath.PHB: 1.0,
            PciePath.NODE: 0.95,
            PciePath.SYS: 0.9,
        }
    )
    """The path's share of :attr:`staged_copy_factor`, a prior that orders, pending
    measurements. A staged copy climbs to the root complex whatever the path, so PIX to PHB are
    alike; across root complexes of one socket (NODE) the host buffer is remote to one GPU's
    root port, and across sockets (SYS) one leg also crosses the CPU interconnect. Without it
    every pair of a host without peer-to-peer (GeForce boards, many VMs) ties, and the lowest
    indices win across sockets while GPUs of one root complex are free
    (tests/test_measured_vs_predicted.py::test_a_staged_copy_is_a_little_slower_the_farther_apart_the_gpus).
    The steps are small so that measured factors, when they come, replace an order rather than
    a claim; an unknown path is priced as SYS."""

    def __post_init__(self) -> None:
        """Every rate and factor finite and positive, factors at most 1: a table with a
        negative factor would give links of -15.8 GB/s that placement uses, and one with a rate
        of 1e308 would write JSON that gpualloc itself refuses
        (tests/test_measured_vs_predicted.py::test_a_bandwidth_table_with_a_negative_factor_or_an_endless_rate_is_refused)."""
        rates: list[tuple[str, Mapping[Any, float]]] = [
            ("nvlink_link_gbps", self.nvlink_link_gbps),
            ("nvlink_link_gbps_by_architecture", self.nvlink_link_gbps_by_architecture),
            ("pcie_lane_gbps", self.pcie_lane_gbps),
        ]
        for name, table in rates:
            for key, rate in table.items():
                if not 0 < rate <= MAX_RATE_GBPS:
                    raise ValueError(f"{name}[{key}] = {rate!r}: a rate is > 0 and <= 100000 GB/s")
        factors: list[tuple[str, float]] = [
            (f"pcie_path_factor[{path.value}]", value)
            for path, value in self.pcie_path_factor.items()
        ]
        factors += [
            (f"pcie_path_factor_by_generation[{gen}][{path.value}]", value)
            for gen, paths in self.pcie_path_factor_by_generation.items()
            for path, value in paths.items()
        ]
        factors += [
            (f"staged_path_factor[{path.value}]", value)
            for path, value in self.staged_path_factor.items()
        ]
        factors += [
            (name, getattr(self, name))
            for name in (
                "unknown_path_factor",
                "nccl_nvlink_efficiency",
                "nvswitch_copy_efficiency",
                "nccl_staged_efficiency",
                "staged_copy_factor",
            )
        ]
        for name, value in factors:
            if not 0 < value <= 1:
                raise ValueError(f"{name} = {value!r}: a factor is > 0 and <= 1")

    def nvlink_rate(self, generation: int | None) -> float:
        """Per-link rate for an NVLink generation (None: the default generation)."""
        if generation is None:
            generation = self.default_nvlink_generation
        if generation in self.nvlink_link_gbps:
            return self.nvlink_link_gbps[generation]
        # A generation newer than the table: the newest rate the table knows is a lower bound.
        older = [g for g in self.nvlink_link_gbps if g < generation]
        return self.nvlink_link_gbps[max(older) if older else min(self.nvlink_link_gbps)]

    def pcie_rate(self, generation: int | None, width: int | None) -> float:
        """Raw PCIe link rate for a generation and width, with the defaults for unknowns."""
        gen = generation if generation in self.pcie_lane_gbps else self.default_pcie_generation
        return self.pcie_lane_gbps[gen] * (width or self.default_pcie_width)

    def path_factor(self, path: PciePath | None, generation: int | None = None) -> float:
        """The path penalty for a pair of this PCIe generation (None: the default one); unknown
        paths get :attr:`unknown_path_factor`."""
        if path is None:
            return self.unknown_path_factor
        generation = generation or self.default_pcie_generation
        newer = [g for g in self.pcie_path_factor_by_generation if g <= generation]
        if newer and path in (factors := self.pcie_path_factor_by_generation[max(newer)]):
            return factors[path]
        return self.pcie_path_factor.get(path, self.unknown_path_factor)


DEFAULT_BANDWIDTH_TABLE = BandwidthTable()


def load_bandwidth_table(path: Path) -> BandwidthTable:
    """Read a JSON override; fields it leaves out keep their default values."""
    from gpualloc.user_files import json_document, read_user_text

    text = read_user_text(path, "bandwidth table", error=FileAccessError)
    try:
        data: Any = json_document(text)
    except json.JSONDecodeError as exc:
        raise TopologyError(
            f"bandwidth table {path} is not JSON: {exc.msg} at line {exc.lineno}",
            hint="the file is a JSON object with fields of BandwidthTable, e.g. "
            '{"pcie_path_factor": {"SYS": 0.4}}',
        ) from exc
    return bandwidth_table_from(data, f"bandwidth table {path}")


def bandwidth_table_from(data: Any, origin: str) -> BandwidthTable:
    """The default table with the overrides in ``data`` (a mapping, as in the JSON file or a
    ``[bandwidth_table]`` section of config.toml); ``origin`` names it in errors."""
    if not isinstance(data, dict):
        raise TopologyError(f"{origin} must be a JSON object / TOML table")
    merged = to_builtins(DEFAULT_BANDWIDTH_TABLE)
    for key, value in data.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            # JSON and TOML keys are strings: "2" overrides the default for generation 2.
            merged[key] = {str(k): v for k, v in {**merged[key], **value}.items()}
        else:
            merged[key] = value
    try:
        return from_builtins(merged, BandwidthTable)
    except ValidationError as exc:
        raise TopologyError(
            f"{origin}: {_where(exc, data)}",
            hint=f"a table's fields: {', '.join(BandwidthTable.__struct_fields__)}",
        ) from exc


def _where(exc: ValidationError, overrides: dict[str, Any]) -> str:
    """The error, naming the entry of a mapping that is wrong (msgspec says only ``[...]``)."""
    described = describe_validation_error(exc)
    for key, value in overrides.items():
        if isinstance(value, dict) and described.startswith(f"{key}[...]"):
            for entry, rate in value.items():
                try:
                    from_builtins({key: {str(entry): rate}}, BandwidthTable)
                except ValidationError:
                    return described.replace("[...]", f".{entry}", 1)
    return described


def estimate_link_bandwidth_gbps(
    *,
    nvlinks: int,
    nvlink_generation: int | None,
    nvlink_link_gbps: float | None,
    pcie: PciePath | None,
    pcie_generation: int | None,
    pcie_width: int | None,
    peer_access: bool | None = None,
    table: BandwidthTable = DEFAULT_BANDWIDTH_TABLE,
) -> float:
    """Estimated one-direction bandwidth between two GPUs, in GB/s (see the module docstring).

    ``nvlink_link_gbps`` is a per-link rate known for these GPUs (driver report or GPU family);
    ``pcie_generation`` and ``pcie_width`` are the lower of the two GPUs' values, or None.
    ``peer_access`` False (the driver refuses P2P): a copy staged through host memory, a little
    slower the farther apart the GPUs are (:attr:`BandwidthTable.staged_path_factor`).
    """
    if peer_access is False:
        rate = table.pcie_rate(pcie_generation, pcie_width)
        path = table.staged_path_factor.get(
            pcie or PciePath.SYS, table.staged_path_factor[PciePath.SYS]
        )
        return round(rate * table.staged_copy_factor * path, 3)
    if nvlinks > 0:
        per_link = nvlink_link_gbps or table.nvlink_rate(nvlink_generation)
        return round(nvlinks * per_link, 3)
    rate = table.pcie_rate(pcie_generation, pcie_width)
    return round(rate * table.path_factor(pcie, pcie_generation), 3)
