"""NUMA binding of a job to its GPUs' sockets: what to bind, and how.

A GPU's DMA buffers and the CPU threads feeding it are fastest on the GPU's own NUMA node; a job
scheduled on the far socket pays the CPU interconnect on every copy (the DRB paper measures this
as part of the communication cost, seed 000 section 3). ``--numa auto`` (the default):

- every chosen GPU on one node N: ``numactl --cpunodebind=N --membind=N``;
- GPUs on several nodes: bind to the union of those nodes (CPUs and memory);
- numactl missing: set the CPU affinity directly and say that memory is not bound;
- a topology that does not describe this host, or a GPU whose node is unknown: bind nothing
  (``--dry-run`` still shows what would be bound).

The kernel's view wins over the topology's: node CPUs come from sysfs and are intersected with the
CPUs and memory nodes this process may use (a cgroup cpuset, a Slurm step, ``taskset``), so a
binding never asks for what the kernel would refuse. Planning is pure (:func:`plan_binding`);
:meth:`HostNuma.read` is the only I/O.
"""

import os
import re
from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import NamedTuple

from gpualloc.errors import RequestError
from gpualloc.model.cpuset import format_cpulist, parse_cpulist

SYSFS_NODES = Path("/sys/devices/system/node")


class NumaMode(str, Enum):
    AUTO = "auto"
    """Bind when the topology is this host's and the nodes are known; otherwise do not."""
    BIND = "bind"
    """Bind, or fail: for jobs that must not run unbound."""
    NONE = "none"
    """Never bind."""


class HostNuma(NamedTuple):
    """This machine's NUMA nodes and what this process may use, as the kernel reports them."""

    node_cpus: dict[int, frozenset[int]]
    allowed_cpus: frozenset[int]
    allowed_mems: frozenset[int]
    numactl: str | None
    """Path of the numactl binary, None when it is not installed."""

    @classmethod
    def read(cls, sysfs_nodes: Path = SYSFS_NODES) -> "HostNuma":
        node_cpus: dict[int, frozenset[int]] = {}
        for node in sysfs_nodes.glob("node[0-9]*"):
            try:
                node_cpus[int(node.name[4:])] = frozenset(
                    parse_cpulist((node / "cpulist").read_text().strip())
                )
            except (OSError, ValueError):
                continue
        allowed_cpus = frozenset(os.sched_getaffinity(0))
        if not node_cpus:  # no sysfs NUMA information: one node holding every CPU
            node_cpus = {0: allowed_cpus}
        return cls(
            node_cpus=node_cpus,
            allowed_cpus=allowed_cpus,
            allowed_mems=_allowed_mems() or frozenset(node_cpus),
            numactl=_which("numactl"),
        )


def _which(program: str) -> str | None:
    """``shutil.which`` for one program name: :mod:`shutil` imports ``bz2`` and ``lzma``,
    which every ``run`` would load for one lookup
    (tests/test_startup_imports.py pins what ``run`` may import)."""
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(directory or ".", program)  # noqa: PTH118  (no pathlib here)
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):  # noqa: PTH112
            return candidate
    return None


def _allowed_mems() -> frozenset[int]:
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return frozenset()
    match = re.search(r"^Mems_allowed_list:\s*(\S+)", status, re.MULTILINE)
    try:
        return frozenset(parse_cpulist(match.group(1))) if match else frozenset()
    except ValueError:
        return frozenset()


class Binding(NamedTuple):
    """How the job will be bound. ``method`` ``none`` keeps ``nodes`` when they are known, so
    that ``--dry-run`` can say what would have been bound."""

    method: str
    """``numactl``, ``affinity`` (numactl missing: sched_setaffinity) or ``none``."""
    nodes: tuple[int, ...] = ()
    cpus: frozenset[int] = frozenset()
    memory_bound: bool = False
    whole_nodes: bool = True
    """The CPUs are whole nodes (``--cpunodebind``), not a part trimmed by the cpuset
    (``--physcpubind``)."""
    reason: str = ""
    """Why this binding, or why none: shown by ``--dry-run`` and warnings."""

    def argv_prefix(self) -> list[str]:
        """The numactl words that go before the job's command (empty unless ``numactl``)."""
        if self.method != "numactl":
            return []
        nodes = ",".join(str(n) for n in self.nodes)
        words = ["numactl"]
        if self.whole_nodes:
            words.append(f"--cpunodebind={nodes}")
        else:
            words.append(f"--physcpubind={format_cpulist(self.cpus)}")
        if self.memory_bound:
            words.append(f"--membind={nodes}")
        return [*words, "--"]

    def as_if_bound(self) -> list[str]:
        """The numactl words this binding would use on the topology's own host (for
        ``--dry-run`` on a recorded topology, where nothing is bound)."""
        if self.method != "none" or not self.nodes:
            return self.argv_prefix()
        return Binding("numactl", self.nodes, memory_bound=True).argv_prefix()

    def as_json(self) -> dict[str, object]:
        return {
            "method": self.method,
            "nodes": list(self.nodes),
            "cpus": format_cpulist(self.cpus),
            "memory_bound": self.memory_bound,
            "reason": self.reason or None,
        }

    def describe(self) -> str:
        nodes = ",".join(str(n) for n in self.nodes)
        if self.method == "numactl":
            memory = f", memory on node {nodes}" if self.memory_bound else ", memory not bound"
            return f"CPUs of NUMA node {nodes} ({format_cpulist(self.cpus)}){memory}"
        if self.method == "affinity":
            return f"CPU affinity {format_cpulist(self.cpus)} (node {nodes}); {self.reason}"
        return f"not bound: {self.reason}"


def plan_binding(
    gpu_nodes: Sequence[int | None],
    mode: NumaMode,
    *,
    this_host: bool,
    host: HostNuma | None,
) -> Binding:
    """The binding for GPUs on ``gpu_nodes`` (the topology's NUMA node of each chosen GPU).

    ``host`` is this machine's NUMA view (None when ``this_host`` is False). With
    :attr:`NumaMode.BIND`, a job that cannot be bound raises :class:`RequestError` instead of
    running unbound.
    """
    binding = _plan(gpu_nodes, mode, this_host=this_host, host=host)
    if mode is NumaMode.BIND and binding.method == "none":
        raise RequestError(
            f"--numa bind: cannot bind the job ({binding.reason})",
            hint="use --numa auto to run it unbound, or give this host's topology",
        )
    return binding


def _plan(
    gpu_nodes: Sequence[int | None],
    mode: NumaMode,
    *,
    this_host: bool,
    host: HostNuma | None,
) -> Binding:
    unknown = [i for i, node in enumerate(gpu_nodes) if node is None]
    nodes = tuple(sorted({node for node in gpu_nodes if node is not None}))
    if mode is NumaMode.NONE:
        return Binding("none", nodes, reason="binding turned off (--numa none)")
    if unknown:
        return Binding("none", nodes, reason="the NUMA node of a chosen GPU is unknown")
    if not nodes:
        return Binding("none", reason="no GPU was chosen")
    if not this_host or host is None:
        return Binding(
            "none",
            nodes,
            reason="the topology does not describe this host, so its NUMA nodes are not "
            "this machine's",
        )
    missing = [n for n in nodes if n not in host.node_cpus]
    if missing:
        return Binding("none", nodes, reason=f"NUMA node {missing[0]} does not exist here")
    node_cpus = frozenset().union(*(host.node_cpus[n] for n in nodes))
    cpus = node_cpus & host.allowed_cpus
    if not cpus:
        return Binding(
            "none",
            nodes,
            reason=f"this process may not use the CPUs of NUMA node "
            f"{','.join(map(str, nodes))} (cpuset {format_cpulist(host.allowed_cpus)})",
        )
    whole = cpus == node_cpus
    memory = all(n in host.allowed_mems for n in nodes)
    if host.numactl is None:
        return Binding(
            "affinity",
            nodes,
            cpus,
            memory_bound=False,
            whole_nodes=whole,
            reason="numactl is not installed, so memory is not bound (install numactl)",
        )
    return Binding("numactl", nodes, cpus, memory_bound=memory, whole_nodes=whole)
