"""Pure data: the host topology model. No I/O, no discovery (house style: ``model/``)."""

from gpualloc.model.bandwidth import DEFAULT_BANDWIDTH_TABLE, BandwidthTable
from gpualloc.model.mig import MigInstance, MigProfile, parse_mig_profile
from gpualloc.model.paths import PciePath
from gpualloc.model.topology import (
    SCHEMA_VERSION,
    Gpu,
    GpuProcess,
    Health,
    Link,
    NumaNode,
    Provenance,
    Topology,
)

__all__ = [
    "DEFAULT_BANDWIDTH_TABLE",
    "SCHEMA_VERSION",
    "BandwidthTable",
    "Gpu",
    "GpuProcess",
    "Health",
    "Link",
    "MigInstance",
    "MigProfile",
    "NumaNode",
    "PciePath",
    "Provenance",
    "Topology",
    "parse_mig_profile",
]
