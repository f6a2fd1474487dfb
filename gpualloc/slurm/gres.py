"""``gres.conf`` lines for this host: device files, local cores, NVLink counts.

Debian's Slurm has no NVML plugin in main (``gpu_nvml.so`` ships in contrib), so slurmd cannot
detect GPUs or their links itself; an explicit ``gres.conf`` is the only way to tell it. One line
per GPU, in PCI bus order (NVML's order):

- ``File=/dev/nvidiaN``: N is the GPU's device minor number (NVML ``nvmlDeviceGetMinorNumber``);
  a recorded topology without minor numbers assumes N = index, and says so.
- ``Cores=``: the GPU's local cores in Slurm's abstract numbering (cores numbered socket by
  socket, one number per core whatever its hardware threads). On this host they come from sysfs
  (each CPU's package and core id). A recorded topology has no thread layout, so its cores are
  derived only when ``--threads-per-core`` is given, assuming Linux's usual enumeration (the
  first thread of every core, then the second threads: CPU c sits on core c mod (CPUs /
  threads)) and NUMA nodes standing in for sockets.
- ``Links=``: the number of NVLinks to each GPU in PCI order, -1 for itself.

MIG: a GPU with MIG enabled is not handed out whole; each of its MIG devices gets a
line of its own, as Slurm's ``AutoDetect=nvml`` (gpu_nvml.c) makes them:

- ``Type=<gpu type>_<profile>``, e.g. ``nvidia_a100-sxm4-40gb_3g.20gb``; the GPU type is the
  NVML name in lower case with spaces as underscores (Slurm's ``gpu_common_underscorify_tolower``)
  unless ``gpu_type`` is given. Whole GPUs on such a host get ``Type=<gpu type>``, so that
  ``Gres=gpu:<type>:N`` in slurm.conf can count every kind.
- ``MultipleFiles=/dev/nvidiaN,/dev/nvidia-caps/nvidia-capG,/dev/nvidia-caps/nvidia-capC``: the
  parent's device file, then the capability devices granting access to the GPU instance (G) and
  the compute instance (C). The driver lists their minor numbers in
  ``/proc/driver/nvidia-caps/mig-minors`` (``gpu0/gi2/access 21``, ``gpu0/gi2/ci0/access 22``);
  without that file they are computed from the driver's fixed layout (see :func:`cap_minor`).
- No ``Links=`` on such a host: Slurm reads Links as one entry per GRES record, and MIG devices
  have no NVLink peers of their own.

Limits (said in ``--help``): Slurm 22.05 uses ``Links=`` only to prefer GPUs linked to the first
free one, never to search for the best-linked set (``gpualloc slurm taskprolog`` reorders within
what Slurm gave); ``Cores=`` binds tasks only with a task plugin that uses it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from msgspec import Struct

from gpualloc.errors import RequestError, TopologyError
from gpualloc.model.cpuset import format_cpulist
from gpualloc.model.mig import MigInstance
from gpualloc.model.printable import printable
from gpualloc.model.topology import Gpu, Topology
from gpualloc.user_files import shown_value

SYSFS_CPUS = Path("/sys/devices/system/cpu")
MIG_MINORS = Path("/proc/driver/nvidia-caps/mig-minors")

CapKey = tuple[int, int, int | None]
"""(GPU minor number, GPU instance id, compute instance id or None for the GI's own access)."""

_MIG_MINOR_LINE = re.compile(r"^gpu(\d+)/gi(\d+)/(?:ci(\d+)/)?access\s+(\d+)$")

# The driver's layout of /dev/nvidia-caps minors (nvidia-caps.c; the numbers in Slurm's gres.conf
# documentation follow it): 1 and 2 are config and monitor, then per GPU 15 GPU instances, each
# with its own access minor followed by those of its 8 compute instances.
_FIRST_GPU_MINOR = 3
_GPU_INSTANCES_PER_GPU = 15
_COMPUTE_INSTANCES_PER_GI = 8
_MINORS_PER_GI = 1 + _COMPUTE_INSTANCES_PER_GI
_MINORS_PER_GPU = _GPU_INSTANCES_PER_GPU * _MINORS_PER_GI


def parse_mig_minors(text: str) -> dict[CapKey, int]:
    """``/proc/driver/nvidia-caps/mig-minors`` -> {(gpu, gi, ci or None): minor}; other lines
    (``config 1``, ``monitor 2``, ``gpuN/gi/.../access`` of other forms) are skipped."""
    minors: dict[CapKey, int] = {}
    for line in text.splitlines():
        match = _MIG_MINOR_LINE.match(line.strip())
        if match:
            ci = int(match[3]) if match[3] is not None else None
            minors[(int(match[1]), int(match[2]), ci)] = int(match[4])
    return minors


def cap_minor(key: CapKey) -> int:
    """The minor number the driver gives the capability ``key`` when its table is not at hand:
    3 + 135 * gpu + 9 * gi, plus 1 + ci for a compute instance."""
    gpu, gi, ci = key
    minor = _FIRST_GPU_MINOR + gpu * _MINORS_PER_GPU + gi * _MINORS_PER_GI
    return minor if ci is None else minor + 1 + ci


def slurm_gpu_type(gpu: Gpu) -> str:
    """The type name Slurm's NVML plugin derives from the GPU's name: lower case, spaces as
    underscores (``NVIDIA A100-SXM4-40GB`` -> ``nvidia_a100-sxm4-40gb``)."""
    kind = (gpu.name or "gpu").strip().lower().replace(" ", "_")
    if _unsafe(kind):
        raise TopologyError(
            f"GPU {gpu.index}'s name {shown_value(kind)} holds a character gres.conf cannot carry",
            hint="give the type with --gpu-type, or fix the name in the topology file",
        )
    return kind


def _unsafe(value: str) -> bool:
    """Whether ``value`` could end its gres.conf line or start another key: a control
    character (a newline makes a live line of its own), a space, ``=`` or ``#``."""
    return any(not c.isprintable() or c.isspace() or c in "=#" for c in value)


def check_gres_value(value: str | None, option: str) -> None:
    """Refuse a value given on the command line for a gres.conf field that would write more
    than that field (``--node $'n1\\nNodeName=evil ...'``: gres.conf(5) is read line by line,
    so a newline would start a line of the caller's)."""
    if value is None:
        return
    example = f"e.g. {option} n1" if option == "--node" else "one word"
    if not value:
        raise RequestError(
            f"{option} is empty", hint=f"give it a value ({example}), or leave it out"
        )
    bad = next((c for c in value if _unsafe(c)), None)
    if bad is not None:
        raise RequestError(
            f"{option} {shown_value(value)} holds {bad!r}, which would end or split its gres.conf "
            "line",
            hint=f"give {option} a single word as slurm.conf spells it ({example})",
        )


def sysfs_core_numbers(root: Path = SYSFS_CPUS) -> dict[int, int]:
    """CPU id -> Slurm's abstract core number, from each CPU's package and core id."""
    places: dict[int, tuple[int, int]] = {}
    for cpu_dir in root.glob("cpu[0-9]*"):
        try:
            package = int((cpu_dir / "topology" / "physical_package_id").read_text())
            core = int((cpu_dir / "topology" / "core_id").read_text())
        except (OSError, ValueError):
            continue
        places[int(cpu_dir.name[3:])] = (package, core)
    ranks = {place: rank for rank, place in enumerate(sorted(set(places.values())))}
    return {cpu: ranks[place] for cpu, place in places.items()}


def enumerated_core_numbers(topology: Topology, threads_per_core: int) -> dict[int, int]:
    """CPU id -> Slurm core number under Linux's usual enumeration (see the module docstring),
    numbered socket by socket with the NUMA nodes standing in for sockets."""
    node_of = {c: node.id for node in topology.numa_nodes for c in node.cpus}
    cpus = sorted(set(node_of) or {c for gpu in topology.gpus for c in gpu.cpu_affinity})
    if not cpus:
        return {}
    cores = max(1, (max(cpus) + 1) // threads_per_core)
    places = {cpu: (node_of.get(cpu, 0), cpu % cores) for cpu in cpus}
    ranks = {place: rank for rank, place in enumerate(sorted(set(places.values())))}
    return {cpu: ranks[place] for cpu, place in places.items()}


def gres_conf(
    topology: Topology,
    *,
    node: str | None = None,
    core_numbers: Mapping[int, int] | None = None,
    device_dir: str = "/dev",
    mig_minors: Mapping[CapKey, int] | None = None,
    gpu_type: str | None = None,
) -> str:
    """The gres.conf text; ``core_numbers`` maps CPU ids to Slurm core numbers (None: no
    ``Cores=``); ``mig_minors`` is the driver's capability table (None: computed);
    ``gpu_type`` replaces the type Slurm would derive from the GPU's name."""
    check_gres_value(node, "--node")
    check_gres_value(device_dir, "--device-dir")
    check_gres_value(gpu_type, "--gpu-type")
    n = topology.gpu_count
    device_dir = device_dir.rstrip("/")
    has_mig = any(gpu.mig_enabled for gpu in topology.gpus)
    lines = [
        f"# gres.conf for {printable(node or topology.name or 'this host', 80)}, written by "
        "gpualloc slurm "
        "gres-conf",
        "# Links=: NVLinks to each GPU in PCI order (-1: itself). Cores=: the GPU's local "
        "cores (Slurm numbering).",
    ]
    if has_mig:
        lines[1] = "# Cores=: the GPU's local cores (Slurm numbering)."
    if any(gpu.minor_number is None for gpu in topology.gpus):
        lines.append(
            "# Device minor numbers unknown: File= assumes /dev/nvidiaN with N = index; check "
            "with 'nvidia-smi -q | grep Minor'."
        )
    if core_numbers is None:
        lines.append(
            "# No Cores=: this topology does not describe this host; give --threads-per-core "
            "to derive them."
        )
    if has_mig:
        lines.append(
            "# MIG: one line per MIG device, Type=<gpu type>_<profile> as AutoDetect=nvml names "
            "them; no Links= on this host (Slurm indexes them by GRES record, and MIG devices "
            "have no NVLinks of their own)."
        )
        if mig_minors is None:
            lines.append(
                "# nvidia-caps minors computed from the driver's layout; check them against "
                f"{MIG_MINORS}."
            )
    lines.append("AutoDetect=off")
    prefix = f"NodeName={node} " if node else ""
    unlisted = [m for m in topology.mig_instances if not _listable(m)]
    lines += [
        f"# {m.label} ({m.profile}): GPU/compute instance ids unknown, so are its nvidia-caps "
        "files; rediscover with NVML or import 'nvidia-smi' output"
        for m in unlisted
    ]
    if has_mig:
        lines.append("# Slurm numbers these GPUs 0, 1, ... in this order (SLURM_JOB_GPUS).")
    for record in gres_records(topology):
        gpu = topology.gpu(record.gpu)
        minor = _minor(gpu)
        device_file = f"{device_dir}/nvidia{minor}"
        kind = gpu_type or slurm_gpu_type(gpu)
        fields = [f"{prefix}Name=gpu"]
        if record.mig is not None:
            caps = [
                f"{device_dir}/nvidia-caps/nvidia-cap{_cap(key, mig_minors)}"
                for key in record.cap_keys(minor)
            ]
            fields += [
                f"Type={kind}_{record.mig.profile}",
                f"MultipleFiles={','.join([device_file, *caps])}",
            ]
        else:
            fields += [f"Type={kind}"] if has_mig else []
            fields.append(f"File={device_file}")
        fields += _cores_field(gpu, core_numbers)
        if not has_mig:
            links = [
                "-1" if other == gpu.index else str(topology.link(gpu.index, other).nvlinks)
                for other in range(n)
            ]
            fields.append(f"Links={','.join(links)}")
        lines.append(" ".join(fields))
    return "\n".join(lines) + "\n"


class GresRecord(Struct, frozen=True):
    """One ``gres.conf`` line: a whole GPU, or one MIG device of it."""

    gpu: int
    mig: MigInstance | None = None

    def cap_keys(self, minor: int) -> list[CapKey]:
        """The capabilities a MIG device's job needs: its GPU instance, its compute instance."""
        assert self.mig is not None and _listable(self.mig)
        gi, ci = self.mig.gpu_instance, self.mig.compute_instance
        return [(minor, gi, None), (minor, gi, ci)]  # type: ignore[list-item]


def gres_records(topology: Topology) -> list[GresRecord]:
    """The GPUs gres.conf lists, in the order Slurm numbers them (``SLURM_JOB_GPUS``).

    On a host without MIG, whole GPUs by index (Slurm numbers them by their ``/dev/nvidiaN``, see
    :mod:`gpualloc.slurm.job`). On a host with MIG, Slurm 22.05 numbers the records by position
    after grouping them by type in order of first appearance (seen with ``srun --gres`` on the
    test cluster), so the records come grouped that way and their order is the numbering: MIG
    devices of each profile, then the whole GPUs. MIG devices whose instance ids are unknown
    cannot be listed and are left out.
    """
    records = [
        GresRecord(gpu.index) if not gpu.mig_enabled else GresRecord(gpu.index, mig)
        for gpu in topology.gpus
        for mig in (topology.mig_on(gpu.index) if gpu.mig_enabled else [None])
        if mig is None or _listable(mig)
    ]
    if not any(gpu.mig_enabled for gpu in topology.gpus):
        return records
    kinds: dict[tuple[str, str | None], int] = {}
    for record in records:
        kinds.setdefault(_kind(topology, record), len(kinds))
    return sorted(records, key=lambda record: kinds[_kind(topology, record)])


def slurm_gpu_numbers(topology: Topology) -> dict[int, GresRecord]:
    """Slurm's GPU number -> the record it stands for: the device minor number on a host
    without MIG (index when unknown), the position in :func:`gres_records` on one with MIG."""
    records = gres_records(topology)
    if any(gpu.mig_enabled for gpu in topology.gpus):
        return dict(enumerate(records))
    return {_minor(topology.gpu(record.gpu)): record for record in records}


def _kind(topology: Topology, record: GresRecord) -> tuple[str, str | None]:
    profile = record.mig.profile if record.mig is not None else None
    return slurm_gpu_type(topology.gpu(record.gpu)), profile


def _listable(instance: MigInstance) -> bool:
    return instance.gpu_instance is not None and instance.compute_instance is not None


def _minor(gpu: Gpu) -> int:
    return gpu.minor_number if gpu.minor_number is not None else gpu.index


def _cap(key: CapKey, mig_minors: Mapping[CapKey, int] | None) -> int:
    if mig_minors is None:
        return cap_minor(key)
    if key not in mig_minors:
        gpu, gi, ci = key
        what = f"gpu{gpu}/gi{gi}" + (f"/ci{ci}" if ci is not None else "")
        raise TopologyError(
            f"the MIG minors table has no {what}/access, which the topology's MIG layout needs",
            hint="give the mig-minors file of the host the topology was recorded on",
        )
    return mig_minors[key]


def _cores_field(gpu: Gpu, core_numbers: Mapping[int, int] | None) -> list[str]:
    if core_numbers is None:
        return []
    cores = sorted({core_numbers[c] for c in gpu.cpu_affinity if c in core_numbers})
    return [f"Cores={format_cpulist(cores)}"] if cores else []
