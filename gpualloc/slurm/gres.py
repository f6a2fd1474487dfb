"""``gres.conf`` lines for this host: device files, local cores, NVLink counts (issue 7).

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

Limits (said in ``--help``): Slurm 22.05 uses ``Links=`` only to prefer GPUs linked to the first
free one, never to search for the best-linked set (``gpualloc slurm taskprolog`` reorders within
what Slurm gave); ``Cores=`` binds tasks only with a task plugin that uses it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from gpualloc.model.cpuset import format_cpulist
from gpualloc.model.topology import Topology

SYSFS_CPUS = Path("/sys/devices/system/cpu")


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
) -> str:
    """The gres.conf text; ``core_numbers`` maps CPU ids to Slurm core numbers (None: no
    ``Cores=``)."""
    n = topology.gpu_count
    lines = [
        f"# gres.conf for {node or topology.name or 'this host'}, written by gpualloc slurm "
        "gres-conf",
        "# Links=: NVLinks to each GPU in PCI order (-1: itself). Cores=: the GPU's local "
        "cores (Slurm numbering).",
    ]
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
    lines.append("AutoDetect=off")
    prefix = f"NodeName={node} " if node else ""
    for gpu in topology.gpus:
        minor = gpu.minor_number if gpu.minor_number is not None else gpu.index
        fields = [f"{prefix}Name=gpu", f"File={device_dir.rstrip('/')}/nvidia{minor}"]
        if core_numbers is not None:
            cores = sorted({core_numbers[c] for c in gpu.cpu_affinity if c in core_numbers})
            if cores:
                fields.append(f"Cores={format_cpulist(cores)}")
        links = [
            "-1" if other == gpu.index else str(topology.link(gpu.index, other).nvlinks)
            for other in range(n)
        ]
        fields.append(f"Links={','.join(links)}")
        lines.append(" ".join(fields))
    return "\n".join(lines) + "\n"
