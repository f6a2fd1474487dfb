"""The host as the placement engine sees it: dense matrices and bitmasks built once per decision.

Placement never touches discovery (house style): it reads a :class:`~gpualloc.model.Topology`
and turns it into plain lists, because the searches look pairs up millions of times and a list
lookup costs less than a model's attribute.
"""

from __future__ import annotations

from msgspec import Struct

from gpualloc.model.paths import PciePath
from gpualloc.model.topology import Topology

# Edge classes of MAPA's effective-bandwidth model (paper section 3.4.3): x, y, z.
DOUBLE_NVLINK, SINGLE_NVLINK, PCIE = 0, 1, 2

_SWITCH_PATHS = frozenset({PciePath.BOARD, PciePath.PIX, PciePath.PXB})
# Paths that stay below one host bridge (``nvidia-smi topo -m``'s legend: PHB traverses a PCIe
# host bridge, NODE crosses between host bridges of one NUMA node, SYS the CPUs' interconnect).
_ROOT_COMPLEX_PATHS = _SWITCH_PATHS | {PciePath.PHB}


_BUILT: dict[int, tuple[Topology, HostGraph]] = {}
"""id(topology) -> (the topology, its graph): the topology is kept, so the id is never reused
while the entry stands."""


class HostGraph(Struct, frozen=True):
    """Pairwise facts about the GPUs of one host, indexed by GPU index.

    - ``bandwidth[a][b]``: estimated one-direction bandwidth, GB/s (0 on the diagonal).
    - ``nvlink_bandwidth[a][b]``: the same for NVLinked pairs, 0 for PCIe-only pairs.
    - ``nvlinks[a][b]``: bonded NVLinks between the pair (0: PCIe only).
    - ``nvswitch[a][b]``: the pair's NVLinks run through an NVSwitch.
    - ``pcie[a][b]``: the PCIe path class, ``None`` when unknown.
    - ``mapa_class[a][b]``: MAPA's x/y/z class (double NVLink, single NVLink, PCIe).
    - ``socket[g]``: the GPU's NUMA node (-1 when unknown); ``switch_group[g]``: GPUs that share
      a PCIe switch tree (``BOARD``/``PIX``/``PXB`` paths) have the same group id;
      ``root_complex[g]``: GPUs below the same PCIe host bridge (those paths and ``PHB``) have
      the same id (a GPU whose paths are unknown is alone).
    """

    gpu_count: int
    bandwidth: tuple[tuple[float, ...], ...]
    nvlink_bandwidth: tuple[tuple[float, ...], ...]
    nvlinks: tuple[tuple[int, ...], ...]
    nvswitch: tuple[tuple[bool, ...], ...]
    pcie: tuple[tuple[PciePath | None, ...], ...]
    mapa_class: tuple[tuple[int, ...], ...]
    socket: tuple[int, ...]
    switch_group: tuple[int, ...]
    root_complex: tuple[int, ...]
    max_nvlinks: int
    published_model_fits: bool
    """True when every NVLinked pair has one or two direct links, as on the DGX-1 V100 that
    MAPA's Table 2 was fitted on (and at least one pair is NVLinked)."""

    @classmethod
    def from_topology(cls, topology: Topology) -> HostGraph:
        """The graph of ``topology``; built once per topology object (a long-running process,
        the broker, places on the same topology thousands of times)."""
        built = _BUILT.get(id(topology))
        if built is not None and built[0] is topology:
            return built[1]
        graph = cls._build(topology)
        if len(_BUILT) >= 8:
            _BUILT.clear()
        _BUILT[id(topology)] = (topology, graph)
        return graph

    @classmethod
    def _build(cls, topology: Topology) -> HostGraph:
        n = topology.gpu_count
        bandwidth = [[0.0] * n for _ in range(n)]
        nvlink_bw = [[0.0] * n for _ in range(n)]
        nvlinks = [[0] * n for _ in range(n)]
        nvswitch = [[False] * n for _ in range(n)]
        pcie: list[list[PciePath | None]] = [[None] * n for _ in range(n)]
        for link in topology.links:
            a, b = link.a, link.b
            for x, y in ((a, b), (b, a)):
                bandwidth[x][y] = link.bandwidth_gbps
                nvlinks[x][y] = link.nvlinks
                nvswitch[x][y] = link.nvswitch
                pcie[x][y] = link.pcie
                if link.nvlinks:
                    nvlink_bw[x][y] = link.bandwidth_gbps
        max_links = max((link.nvlinks for link in topology.links), default=0)
        fits = max_links > 0 and all(
            link.nvlinks <= 2 and not link.nvswitch for link in topology.links
        )
        mapa_class = [[_mapa_class(nvlinks[a][b]) for b in range(n)] for a in range(n)]
        socket = tuple(gpu.numa_node if gpu.numa_node is not None else -1 for gpu in topology.gpus)
        return cls(
            gpu_count=n,
            bandwidth=_freeze(bandwidth),
            nvlink_bandwidth=_freeze(nvlink_bw),
            nvlinks=_freeze(nvlinks),
            nvswitch=_freeze(nvswitch),
            pcie=_freeze(pcie),
            mapa_class=_freeze(mapa_class),
            socket=socket,
            switch_group=_groups(n, pcie, _SWITCH_PATHS),
            root_complex=_groups(n, pcie, _ROOT_COMPLEX_PATHS),
            max_nvlinks=max_links,
            published_model_fits=fits,
        )


def _mapa_class(links: int) -> int:
    """Double NVLink for two or more bonded links, single for one, PCIe for none."""
    if links >= 2:
        return DOUBLE_NVLINK
    return SINGLE_NVLINK if links == 1 else PCIE


def _freeze(rows: list[list]) -> tuple[tuple, ...]:
    return tuple(tuple(row) for row in rows)


def _groups(
    n: int, pcie: list[list[PciePath | None]], joined: frozenset[PciePath]
) -> tuple[int, ...]:
    """Union-find over pairs whose PCIe path is one of ``joined``."""
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a in range(n):
        for b in range(a + 1, n):
            if pcie[a][b] in joined:
                parent[find(a)] = find(b)
    return tuple(find(g) for g in range(n))
