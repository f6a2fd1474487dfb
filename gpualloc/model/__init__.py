"""Pure data: the host topology model. No I/O, no discovery (house style: ``model/``).

The names below are loaded when first asked for (PEP 562), so that importing one small module
of the package (``gpualloc.model.cpuset``, which ``run`` needs) does not load the topology's
msgspec models, which ``run`` through the broker never builds.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "DEFAULT_BANDWIDTH_TABLE": "bandwidth",
    "BandwidthTable": "bandwidth",
    "MigInstance": "mig",
    "MigProfile": "mig",
    "parse_mig_profile": "mig",
    "PciePath": "paths",
    "SCHEMA_VERSION": "topology",
    "Gpu": "topology",
    "GpuProcess": "topology",
    "Health": "topology",
    "Link": "topology",
    "NumaNode": "topology",
    "Provenance": "topology",
    "Topology": "topology",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"gpualloc.model.{_WHERE[name]}"), name)
