"""MIG layouts from nvidia-smi text: ``nvidia-smi -L``, ``nvidia-smi mig -lgi`` and the
``MIG devices`` table of plain ``nvidia-smi``.

Each says part of the story. ``-L`` names every MIG device (profile, device index, MIG UUID)
under its parent GPU (name, GPU UUID). The ``MIG devices`` table gives each device's GPU
instance, compute instance and memory. ``mig -lgi`` (root only) gives each GPU instance's
profile and placement, but not which device it became. :func:`mig_instances_from_texts` joins
them: devices by (GPU, device index), GPU instances by (GPU, GI id).

The formats are those of the real outputs in ``tests/fixtures/topologies/mig_*``; a line that
looks like a MIG entry but does not parse is an error naming the line, never skipped.
"""

from __future__ import annotations

import re

from msgspec import Struct
from msgspec.structs import replace

from gpualloc.errors import TopologyParseError
from gpualloc.model.mig import MigInstance, parse_mig_profile
from gpualloc.model.printable import count_of
from gpualloc.model.topology import Gpu, Health, Provenance, Topology
from gpualloc.user_files import shown_value

_MIB = 1024 * 1024

_GPU_LINE = re.compile(r"^GPU\s+(\d+):\s+(.*?)\s+\(UUID:\s*([^)]+)\)\s*$")
_MIG_LINE = re.compile(r"^\s+MIG\s+(\S+)\s+Device\s+(\d+):\s+\(UUID:\s*([^)]+)\)\s*$")
_LGI_ROW = re.compile(r"^\|\s*(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+):(\d+)\s*\|\s*$")
_TABLE_ROW = re.compile(r"^\|\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s*\|\s*(\d+)MiB\s*/\s*(\d+)MiB\s*\|")


class ListedGpu(Struct, frozen=True):
    """A ``GPU n: <name> (UUID: ...)`` line of ``nvidia-smi -L``."""

    index: int
    name: str
    uuid: str


class ListedMig(Struct, frozen=True):
    """A ``MIG <profile> Device n: (UUID: ...)`` line of ``nvidia-smi -L``."""

    gpu: int
    device: int
    profile: str
    uuid: str


class GpuInstanceRow(Struct, frozen=True):
    """A row of ``nvidia-smi mig -lgi``."""

    gpu: int
    profile: str
    profile_id: int
    gpu_instance: int
    start: int
    size: int


class MigDeviceRow(Struct, frozen=True):
    """A row of the ``MIG devices`` table of ``nvidia-smi``."""

    gpu: int
    gpu_instance: int
    compute_instance: int
    device: int
    memory_used_bytes: int
    memory_total_bytes: int


class GpuList(Struct, frozen=True):
    """``nvidia-smi -L``: the GPUs and their MIG devices."""

    gpus: list[ListedGpu]
    mig: list[ListedMig]


def parse_gpu_list(text: str, *, source: str = "nvidia-smi -L") -> GpuList:
    """Parse ``nvidia-smi -L`` (with or without MIG devices)."""
    gpus: list[ListedGpu] = []
    mig: list[ListedMig] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if match := _GPU_LINE.match(line):
            if int(match[1]) != len(gpus):  # a GPU twice or out of order: whose MIG is whose?
                raise TopologyParseError(
                    f"{source}, line {number}: GPU {match[1]} where GPU {len(gpus)} comes next "
                    "(nvidia-smi -L lists the GPUs 0, 1, 2, ... in order)"
                )
            gpus.append(ListedGpu(int(match[1]), match[2], match[3].strip()))
        elif match := _MIG_LINE.match(line):
            if not gpus:
                raise TopologyParseError(f"{source}, line {number}: a MIG device before any GPU")
            mig.append(
                ListedMig(
                    gpus[-1].index,
                    int(match[2]),
                    _profile(match[1], source, number),
                    match[3].strip(),
                )
            )
        elif line.lstrip().startswith(("GPU ", "MIG ")):
            raise TopologyParseError(
                f"{source}, line {number}: not a GPU or MIG line of 'nvidia-smi -L': "
                f"{shown_value(line.strip())}"
            )
    if not gpus:
        raise TopologyParseError(
            f"{source}: no 'GPU n: ... (UUID: ...)' line; not 'nvidia-smi -L' output"
        )
    return GpuList(gpus=gpus, mig=mig)


def parse_gpu_instances(text: str, *, source: str = "nvidia-smi mig -lgi") -> list[GpuInstanceRow]:
    """Parse the ``GPU instances`` table of ``nvidia-smi mig -lgi``."""
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if "MIG" not in line or not line.startswith("|"):
            continue
        match = _LGI_ROW.match(line.rstrip())
        if match is None:
            raise TopologyParseError(
                f"{source}, line {number}: a GPU instance row that does not parse: "
                f"{shown_value(line.strip())}"
            )
        rows.append(
            GpuInstanceRow(
                gpu=int(match[1]),
                profile=_profile(match[2], source, number),
                profile_id=int(match[3]),
                gpu_instance=int(match[4]),
                start=int(match[5]),
                size=int(match[6]),
            )
        )
    return rows


def parse_mig_device_table(text: str, *, source: str = "nvidia-smi") -> list[MigDeviceRow]:
    """Parse the ``MIG devices`` table of plain ``nvidia-smi`` (other tables are ignored)."""
    rows = []
    inside = False
    for number, line in enumerate(text.splitlines(), 1):
        if "MIG devices:" in line:
            inside = True
            continue
        if not line.strip() or "Processes:" in line:
            inside = False  # the table ends at the blank line before the next one
            continue
        if not inside or not re.match(r"^\|\s*\d", line):
            continue  # borders, headings, and the BAR1 line newer drivers add under each row
        match = _TABLE_ROW.match(line)
        if match is None:
            raise TopologyParseError(
                f"{source}, line {number}: a MIG device row that does not parse: "
                f"{shown_value(line.strip())}"
            )
        gpu, gi, ci, device, used, total = (int(value) for value in match.groups())
        rows.append(MigDeviceRow(gpu, gi, ci, device, used * _MIB, total * _MIB))
    return rows


def _profile(text: str, source: str, number: int) -> str:
    try:
        return parse_mig_profile(text).name
    except ValueError as exc:
        raise TopologyParseError(f"{source}, line {number}: {exc}") from None


def mig_instances_from_texts(
    *,
    listed: GpuList | None = None,
    gpu_instances: list[GpuInstanceRow] | None = None,
    devices: list[MigDeviceRow] | None = None,
) -> list[MigInstance]:
    """Join what the texts say into MIG instances.

    The devices come from ``-L`` or from the table (which one knows them decides which
    exist); the ``-lgi`` rows add profiles and placements by GI id. ``-lgi`` alone does not say
    which device each GI became, so it cannot stand alone.
    """
    gpu_instances = gpu_instances or []
    devices = devices or []
    by_device = {(row.gpu, row.device): row for row in devices}
    by_gi = {(row.gpu, row.gpu_instance): row for row in gpu_instances}
    if listed is not None and listed.mig:
        keys = [(m.gpu, m.device) for m in listed.mig]
    elif devices:
        keys = [(row.gpu, row.device) for row in devices]
    elif gpu_instances:
        raise TopologyParseError(
            "'nvidia-smi mig -lgi' does not say which MIG device each GPU instance is",
            hint="add the output of 'nvidia-smi -L' or of plain 'nvidia-smi' (MIG devices table)",
        )
    else:
        return []
    named = {(m.gpu, m.device): m for m in listed.mig} if listed is not None else {}
    instances = []
    for gpu, device in keys:
        row = by_device.get((gpu, device))
        gi = row.gpu_instance if row is not None else None
        gi_row = by_gi.get((gpu, gi)) if gi is not None else None
        name = named.get((gpu, device))
        profile = name.profile if name else gi_row.profile if gi_row else None
        if profile is None:
            raise TopologyParseError(
                f"the profile of MIG device {gpu}/{device} is in none of the texts",
                hint="add the output of 'nvidia-smi -L' or 'nvidia-smi mig -lgi'",
            )
        instances.append(
            MigInstance(
                gpu=gpu,
                device=device,
                profile=profile,
                uuid=name.uuid if name else None,
                gpu_instance=gi,
                compute_instance=row.compute_instance if row is not None else None,
                memory_total_bytes=row.memory_total_bytes if row is not None else None,
                placement_start=gi_row.start if gi_row else None,
                placement_size=gi_row.size if gi_row else None,
            )
        )
    return instances


class MigTexts(Struct):
    """The MIG texts given to ``topo import --mig``, each recognised by its content."""

    listed: GpuList | None = None
    gpu_instances: list[GpuInstanceRow] | None = None
    devices: list[MigDeviceRow] | None = None

    def instances(self) -> list[MigInstance]:
        return mig_instances_from_texts(
            listed=self.listed, gpu_instances=self.gpu_instances, devices=self.devices
        )


NO_MIG_GPU = "No MIG-enabled devices found"
"""What ``nvidia-smi mig -lgi`` prints on a host none of whose GPUs is in MIG mode."""
SMI_BANNER = re.compile(r"NVIDIA-SMI \S+\s+Driver Version:")
"""The banner of plain ``nvidia-smi``, whose MIG devices table is absent without MIG."""


def read_mig_texts(texts: list[tuple[str, str]]) -> MigTexts:
    """(origin, text) pairs -> :class:`MigTexts`; which output each is, is read from it. A host
    without MIG says so in both forms (``mig -lgi``'s one line, plain ``nvidia-smi`` without a
    MIG devices table): read as no MIG device (a real H200's, in tests/fixtures/device)."""
    found = MigTexts()
    for origin, text in texts:
        if NO_MIG_GPU in text:
            found.gpu_instances = []
        elif SMI_BANNER.search(text) and "MIG devices:" not in text:
            found.devices = []
        elif "GPU instances:" in text:
            found.gpu_instances = parse_gpu_instances(text, source=origin)
        elif "MIG devices:" in text:
            found.devices = parse_mig_device_table(text, source=origin)
        elif re.search(r"^GPU\s+\d+:.*\(UUID:", text, re.MULTILINE):
            found.listed = parse_gpu_list(text, source=origin)
        else:
            raise TopologyParseError(
                f"{origin}: neither 'nvidia-smi -L', 'nvidia-smi mig -lgi' nor 'nvidia-smi' "
                "output (no GPU list, 'GPU instances:' or 'MIG devices:' table)"
            )
    return found


def with_mig_layout(topology: Topology, texts: MigTexts) -> Topology:
    """``topology`` with the MIG devices the texts describe (parents marked MIG-enabled), and
    the GPU names and UUIDs of ``nvidia-smi -L`` where the topology lacks them."""
    instances = texts.instances()
    gpus = list(topology.gpus)
    for instance in instances:
        if instance.gpu >= len(gpus):
            raise TopologyParseError(
                f"the MIG texts describe GPU {instance.gpu} but the topology has "
                f"{count_of(len(gpus), 'GPU')}; are they from the same host?"
            )
    if texts.listed is not None:
        if len(texts.listed.gpus) != len(gpus):
            raise TopologyParseError(
                f"'nvidia-smi -L' lists {count_of(len(texts.listed.gpus), 'GPU')} but the "
                f"topology has {len(gpus)}; are they from the same host?"
            )
        for row in texts.listed.gpus:
            gpu = gpus[row.index]
            gpus[row.index] = replace(gpu, name=gpu.name or row.name, uuid=gpu.uuid or row.uuid)
    for parent in {instance.gpu for instance in instances}:
        gpus[parent] = replace(gpus[parent], mig_enabled=True)
    try:
        return replace(topology, gpus=gpus, mig_instances=instances).validated()
    except ValueError as exc:  # a device or a UUID twice: the texts contradict themselves
        raise TopologyParseError(
            f"the MIG texts describe no layout a GPU can have: {exc}"
        ) from None


def topology_from_gpu_list(texts: MigTexts, *, origin: str, name: str | None = None) -> Topology:
    """A topology from ``nvidia-smi -L`` alone: the GPUs and their MIG devices, links unknown
    (exact for a one-GPU host; give ``topo -m`` as well for more)."""
    from gpualloc.discovery.assemble import assemble_topology

    if texts.listed is None:
        raise TopologyParseError(
            "without a 'nvidia-smi topo -m' file, --mig needs 'nvidia-smi -L' output",
            hint="it names the GPUs; add it, or give the topo -m file",
        )
    gpus = [
        Gpu(index=row.index, name=row.name, uuid=row.uuid, health=Health.UNKNOWN)
        for row in texts.listed.gpus
    ]
    notes = [] if len(gpus) == 1 else ["links unknown: 'nvidia-smi -L' does not show them"]
    topology = assemble_topology(
        gpus=gpus,
        pairs={},
        numa_nodes=[],
        provenance=Provenance(source="file", origin=origin, notes=notes),
        name=name,
    )
    return with_mig_layout(topology, texts)
