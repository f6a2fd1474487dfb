"""Which topology a command works on.

Order: ``--topology NAME|PATH`` or ``$GPUALLOC_TOPOLOGY``; else NVML; else
nvidia-smi; else :class:`~gpualloc.errors.NoGpuFound` with a hint to try a bundled topology.
Discovered topologies are cached (see :mod:`.cache`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from gpualloc.errors import DiscoveryUnavailable, NoGpuFound, TopologyNotFound
from gpualloc.model.bandwidth import DEFAULT_BANDWIDTH_TABLE, BandwidthTable
from gpualloc.model.topology import Topology

if TYPE_CHECKING:
    from gpualloc.config import Config
    from gpualloc.discovery.cache import CacheKey
    from gpualloc.discovery.nvml import NvmlSession
    from gpualloc.discovery.smi import QueriedGpu

TOPOLOGY_ENV = "GPUALLOC_TOPOLOGY"
NO_GPU_HINT = "try a bundled topology: --topology dgx1-v100 (gpualloc topo list shows them all)"


def resolve_topology(
    spec: str | None = None,
    *,
    refresh: bool = False,
    table: BandwidthTable | None = None,
) -> Topology:
    """The topology named by ``spec`` (or ``$GPUALLOC_TOPOLOGY``), else this host's."""
    spec = spec or os.environ.get(TOPOLOGY_ENV) or None
    if spec:
        return load_named_topology(spec, table=table)
    return discover_host(refresh=refresh, table=table or DEFAULT_BANDWIDTH_TABLE)


def configured_bandwidth_table(config: Config, flag: Path | None = None) -> BandwidthTable | None:
    """The link bandwidth overrides in effect (``--bandwidth-table``, else a JSON file or a
    ``[bandwidth_table]`` table of a config file), or None for the built-in table."""
    from gpualloc.errors import TopologyError
    from gpualloc.model.bandwidth import bandwidth_table_from, load_bandwidth_table

    resolved = config.resolve("bandwidth_table", flag)
    if resolved.value is None:
        return None
    try:
        if isinstance(resolved.value, dict):
            return bandwidth_table_from(resolved.value, f"{resolved.source}: [bandwidth_table]")
        return load_bandwidth_table(resolved.value)
    except TopologyError as exc:
        if "fields:" not in (exc.hint or ""):  # no hint, or one naming a Python class
            exc.hint = bandwidth_table_hint()
        if isinstance(resolved.value, dict):  # a bad value of a config file: exit 15, as any
            from gpualloc.errors import ConfigError

            raise ConfigError(exc.message, hint=exc.hint) from None
        raise


def bandwidth_table_hint() -> str:
    """What a bandwidth table holds, for an error about one: its fields, by name, not the Python
    class (tests/test_bad_input_files.py::test_a_bandwidth_table_error_names_the_fields)."""
    fields = ", ".join(BandwidthTable.__struct_fields__)
    return (
        "a bandwidth table is a JSON object (in config.toml a [bandwidth_table] table) of "
        f'some of the fields: {fields}; e.g. {{"pcie_path_factor": {{"SYS": 0.4}}}}'
    )


def load_named_topology(spec: str, *, table: BandwidthTable | None = None) -> Topology:
    """A bundled topology by name, or a topology file (JSON or ``topo -m`` text) by path.

    A spec that looks like a path (a ``/``, or a ``.json``/``.txt`` suffix) is always a file;
    a bare name is a bundled topology first, then a file in the current directory.
    """
    from gpualloc.topologies import bundled_names, load_bundled
    from gpualloc.user_files import expand_user, names_anything

    try:
        path = expand_user(spec)
    except ValueError as exc:
        raise TopologyNotFound(f"--topology: {exc}", hint="check the path") from None
    looks_like_path = os.sep in spec or spec.endswith((".json", ".txt"))
    if not looks_like_path and spec in bundled_names():
        topology = load_bundled(spec)
        return topology.with_bandwidth_table(table) if table is not None else topology
    if looks_like_path or names_anything(path):
        from gpualloc.discovery.recorded import load_topology_file

        # Read whether or not it seems to exist: the reading says why it cannot be read (a
        # directory we may not enter is not "does not exist", a name too long is too long).
        return load_topology_file(path, table=table)
    return load_bundled(spec)  # raises TopologyNotFound with the closest names as a hint


def discover_host(
    *, refresh: bool = False, table: BandwidthTable = DEFAULT_BANDWIDTH_TABLE
) -> Topology:
    """Probe this host: NVML first, nvidia-smi if NVML cannot be used."""
    try:
        return _discover_nvml(refresh=refresh, table=table)
    except DiscoveryUnavailable as nvml_problem:
        try:
            topology = _discover_nvidia_smi(refresh=refresh, table=table)
        except DiscoveryUnavailable as smi_problem:
            raise NoGpuFound(
                f"no NVIDIA GPU found ({nvml_problem}; {smi_problem})", hint=NO_GPU_HINT
            ) from smi_problem
        topology.provenance.notes.insert(0, f"NVML unusable ({nvml_problem}); used nvidia-smi")
        return topology


def _discover_nvml(*, refresh: bool, table: BandwidthTable) -> Topology:
    from gpualloc.discovery import cache
    from gpualloc.discovery.numa import discover_numa
    from gpualloc.discovery.nvml import NvmlSession

    with NvmlSession() as session:
        key = _nvml_key(session)
        if not refresh and (cached := cache.load_cached(key)) is not None:
            return with_calibration(cached.with_bandwidth_table(table), key)
        notes: list[str] = []
        topology = session.probe(numa_nodes=discover_numa(notes), table=table)
    topology.provenance.notes.extend(notes)
    topology = _name_lost(topology, key)
    cache.store_cached(key, topology)
    return with_calibration(topology, key)


def _name_lost(topology: Topology, key: CacheKey) -> Topology:
    """The topology with its lost GPUs named by what else still knows them (the driver's
    sysfs, the last discovery: :mod:`gpualloc.discovery.lost_gpus`)."""
    from gpualloc.model.topology import Health

    if all(gpu.health != Health.LOST for gpu in topology.gpus):
        return topology
    from gpualloc.discovery import cache
    from gpualloc.discovery.lost_gpus import name_lost_gpus, nvidia_gpu_bus_ids

    stored = cache.load_stored(key.source)
    previous, same_boot = (stored[1], stored[0].boot_id == key.boot_id) if stored else (None, False)
    return name_lost_gpus(topology, previous, nvidia_gpu_bus_ids(), same_boot=same_boot)


def _discover_nvidia_smi(*, refresh: bool, table: BandwidthTable) -> Topology:
    from gpualloc.discovery import cache
    from gpualloc.discovery.numa import discover_numa
    from gpualloc.discovery.smi import discover_with_nvidia_smi, query_gpus

    queried = query_gpus()
    if not queried:
        raise DiscoveryUnavailable("nvidia-smi lists no GPU")
    key = _smi_key(queried)
    if not refresh and (cached := cache.load_cached(key)) is not None:
        return with_calibration(cached.with_bandwidth_table(table), key)
    notes: list[str] = []
    topology = discover_with_nvidia_smi(
        queried=queried, numa_nodes=discover_numa(notes), table=table
    )
    topology.provenance.notes.extend(notes)
    cache.store_cached(key, topology)
    return with_calibration(topology, key)


def host_key() -> CacheKey:
    """What identifies this host's GPUs (NVML, else nvidia-smi): the key of its cache and of
    its calibration. :class:`NoGpuFound` when there is no GPU."""
    from gpualloc.discovery.nvml import NvmlSession
    from gpualloc.discovery.smi import query_gpus

    try:
        with NvmlSession() as session:
            return _nvml_key(session)
    except DiscoveryUnavailable as nvml_problem:
        try:
            queried = query_gpus()
        except DiscoveryUnavailable as smi_problem:
            raise NoGpuFound(f"no NVIDIA GPU found ({nvml_problem}; {smi_problem})") from None
        if not queried:
            raise NoGpuFound(
                f"no NVIDIA GPU found ({nvml_problem}; nvidia-smi lists none)"
            ) from None
        return _smi_key(queried)


def _nvml_key(session: NvmlSession) -> CacheKey:
    from gpualloc.boot import boot_id
    from gpualloc.discovery.cache import CacheKey
    from gpualloc.discovery.nvml_mig import mig_modes

    return CacheKey(
        source="nvml",
        boot_id=boot_id(),
        driver_version=session.driver_version(),
        gpu_uuids=tuple(session.gpu_uuids()),
        mig_uuids=session.mig_uuids(),
        mig_modes=mig_modes(session.nvml, session.device_count()),
    )


def _smi_key(queried: list[QueriedGpu]) -> CacheKey:
    from gpualloc.boot import boot_id
    from gpualloc.discovery.cache import CacheKey
    from gpualloc.discovery.nvml_mig import mode_key

    return CacheKey(
        source="nvidia-smi",
        boot_id=boot_id(),
        driver_version=queried[0].driver_version,
        gpu_uuids=tuple(q.uuid for q in queried),
        mig_uuids=_smi_mig_uuids() if any(q.mig_enabled for q in queried) else (),
        mig_modes=tuple(mode_key(q.mig_enabled, q.mig_pending) for q in queried),
    )


def _smi_mig_uuids() -> tuple[str | None, ...]:
    """The MIG device UUIDs ``nvidia-smi -L`` lists (asked only when a GPU is in MIG mode)."""
    from gpualloc.discovery.mig_text import parse_gpu_list
    from gpualloc.discovery.smi import list_gpus_text
    from gpualloc.errors import DiscoveryError, TopologyParseError

    try:
        return tuple(m.uuid for m in parse_gpu_list(list_gpus_text()).mig)
    except (DiscoveryError, TopologyParseError):
        return ("unreadable",)  # a layout no host has; matches only a probe that failed alike


def with_calibration(topology: Topology, key: CacheKey) -> Topology:
    """This host's topology with the bandwidths ``gpualloc calibrate`` measured on these GPUs
    and this driver, if any (a calibration that cannot be used is ignored, as the cache is)."""
    from gpualloc.discovery.cache import CALIBRATION_FILE, cache_dir

    if not (cache_dir() / CALIBRATION_FILE).exists():
        return topology  # the usual case: no module more to import
    from gpualloc.discovery.bandwidth_matrix import apply_measured_bandwidth
    from gpualloc.discovery.calibration import saved_for
    from gpualloc.errors import TopologyError

    calibration = saved_for(key)
    if calibration is None or not calibration.matrix:
        return topology
    try:
        measured = apply_measured_bandwidth(topology, calibration.matrix)
    except TopologyError:
        return topology
    measured.provenance.notes.append(
        f"link bandwidths measured by 'gpualloc calibrate' ({calibration.method}, "
        f"{calibration.measured_at})"
    )
    return measured
