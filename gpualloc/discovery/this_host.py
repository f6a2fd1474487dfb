"""Whether a topology describes the machine gpualloc runs on.

Only then may gpualloc act on it physically: bind the job to the GPUs' NUMA nodes, ask NVML who
runs on the GPUs, and use the host's own ledger. A topology discovered here (NVML or nvidia-smi)
describes this host, and so does a file ``gpualloc topo record`` wrote on this host (same source,
same machine id where the file has one, else same host name: a recording from another machine
of the same name, such as two cloud VMs called ``vm``, is not this host). A bundled topology,
an imported ``nvidia-smi topo -m`` text, or a file recorded elsewhere does not: gpualloc then
plans and keeps leases for it, but binds nothing and watches no real GPU.
"""

from __future__ import annotations

from gpualloc import boot
from gpualloc.model.topology import Topology

DISCOVERED_SOURCES = ("nvml", "nvidia-smi")


def describes_this_host(topology: Topology, hostname: str | None = None) -> bool:
    provenance = topology.provenance
    if provenance.source not in DISCOVERED_SOURCES:
        return False
    if provenance.machine_id is not None:
        here = boot.machine_id()
        if here is not None:
            return provenance.machine_id == here
    return provenance.hostname is None or provenance.hostname == (hostname or boot.hostname())
