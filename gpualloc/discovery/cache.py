"""On-disk cache of the discovered topology.

Probing NVML pair by pair is slow on big hosts (a Kubernetes device-plugin issue reports about
0.6 s per GPU pair), and the answer changes only when the machine reboots, the driver changes or
GPUs are swapped. So the topology is cached under a key of boot id, driver version and GPU UUIDs,
all cheap to read; ``--refresh`` re-probes. The cache is an optimisation: a cache that cannot be
read or written is ignored, never an error.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from msgspec import Struct
from msgspec.structs import asdict

from gpualloc.atomic import write_text_atomic
from gpualloc.errors import TopologyError
from gpualloc.model.topology import Topology


class CacheKey(Struct, frozen=True):
    """What must be unchanged for a cached topology to still describe this host."""

    source: str
    boot_id: str | None
    driver_version: str | None
    gpu_uuids: tuple[str | None, ...]
    mig_uuids: tuple[str | None, ...] = ()
    """The MIG devices' UUIDs: an administrator can change the MIG layout without any GPU
    UUID or the driver changing."""
    mig_modes: tuple[str, ...] = ()
    """Each GPU's MIG mode now and after its next reset (``on>off``), which change alike."""


def cache_dir() -> Path:
    """``$GPUALLOC_CACHE_DIR``, else ``$XDG_CACHE_HOME/gpualloc``, else ``~/.cache/gpualloc``."""
    if explicit := os.environ.get("GPUALLOC_CACHE_DIR"):
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpualloc"


CALIBRATION_FILE = "calibration.json"
"""Where ``gpualloc calibrate`` keeps its measurements, in :func:`cache_dir`."""


def _path(source: str) -> Path:
    return cache_dir() / f"topology-{source}.json"


def load_cached(key: CacheKey) -> Topology | None:
    """The cached topology if its key matches ``key`` exactly, else None."""
    found = load_stored(key.source)
    return found[1] if found is not None and found[0] == key else None


def load_stored(source: str) -> tuple[CacheKey, Topology] | None:
    """The last topology cached for ``source`` and its key, whatever the key (what a GPU that
    stopped answering was, before: :mod:`gpualloc.discovery.lost_gpus`); None if unreadable."""
    try:
        document = json.loads(_path(source).read_text())
        stored = document["key"]
        stored["gpu_uuids"] = tuple(stored["gpu_uuids"])
        stored["mig_uuids"] = tuple(stored.get("mig_uuids", ()))
        stored["mig_modes"] = tuple(stored.get("mig_modes", ()))
        key = CacheKey(**stored)
        return key, Topology.from_json_dict(document["topology"], origin=str(_path(source)))
    except (OSError, ValueError, KeyError, TypeError, TopologyError):
        return None


def store_cached(key: CacheKey, topology: Topology) -> None:
    """Write atomically, so readers never see half a file; failures are ignored."""
    document = {"key": asdict(key), "topology": topology.to_json_dict()}
    with contextlib.suppress(OSError):
        write_text_atomic(_path(key.source), json.dumps(document, sort_keys=True))
