"""What gpualloc predicts for a host, set against what a benchmark measured there.

Two kinds of figure are compared, each with the prediction placement actually uses:

- a GPU pair's copy bandwidth (nvbandwidth, p2pBandwidthLatencyTest): the topology's link
  bandwidth (estimated from link classes, :mod:`gpualloc.model.bandwidth`) against the slower of
  the two measured directions (one-way GB/s, as :func:`.recognise.pairwise_copy` reads them);
- a collective's bus bandwidth (nccl-tests, the largest message): the best ring through the
  GPU set, scaled by NCCL's efficiency over NVLink (:func:`gpualloc.model.rings.
  allreduce_busbw_gbps`), against ``busbw``, which nccl-tests scales so that it compares with
  link rates.

The error of a comparison is ``predicted / measured - 1``; a model that is right within 25 %
has ``|error| <= 0.25``. Runs with ``NCCL_P2P_DISABLE=1`` are predicted as the transport NCCL
uses where peers have no access to each other (host memory: :attr:`BandwidthTable.
nccl_staged_efficiency`); runs across hosts measure the network, and are left out.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from msgspec import Struct

from gpualloc.measurements.recognise import pairwise_copy
from gpualloc.measurements.records import Recording
from gpualloc.model.bandwidth import DEFAULT_BANDWIDTH_TABLE, BandwidthTable
from gpualloc.model.paths import PciePath
from gpualloc.model.rings import allreduce_busbw_gbps
from gpualloc.model.topology import Link, Topology


class Comparison(Struct, frozen=True, kw_only=True):
    """One GPU set: what the model predicts, what was measured, and over what link."""

    what: str
    """``copy`` (a pair's one-way copy) or ``all-reduce busbw`` (a collective's)."""
    gpus: tuple[int, ...]
    """The host's GPU indices (the topology's numbering)."""
    path: str
    """The slowest link class the set uses (``NV12``, ``PIX``, ``SYS``...)."""
    predicted_gbps: float
    measured_gbps: float
    counted: bool = True
    """False for runs that measure something other than the host (P2P disabled, across hosts)."""
    why_not_counted: str = ""

    @property
    def error(self) -> float:
        return self.predicted_gbps / self.measured_gbps - 1


def compare_recording(
    recording: Recording,
    topology: Topology,
    *,
    gpu_map: Sequence[int] | None = None,
    table: BandwidthTable = DEFAULT_BANDWIDTH_TABLE,
    model_p2p_off: bool = True,
) -> list[Comparison]:
    """Every GPU set of ``recording`` against ``topology``'s prediction.

    ``gpu_map[i]`` is the topology's GPU for the recording's GPU ``i`` (default: the same index),
    for a recording made on part of a host or on a host modelled by a bigger bundled one.
    ``model_p2p_off`` False: a run with ``NCCL_P2P_DISABLE=1`` is predicted as if peers had
    access (what gpualloc did before it modelled the transport; docs/evaluation.md's *before*).
    """
    mapped = list(gpu_map) if gpu_map is not None else list(range(topology.gpu_count))
    comparisons: list[Comparison] = []
    if recording.tool != "nccl-tests":
        matrix = pairwise_copy(recording).matrix
        for a in range(len(matrix)):
            for b in range(a + 1, len(matrix)):
                gpus: tuple[int, ...] = (mapped[a], mapped[b])
                comparisons.append(
                    Comparison(
                        what="copy",
                        gpus=gpus,
                        path=topology.link(*gpus).kind,
                        predicted_gbps=copy_gbps(topology.link(*gpus), table),
                        measured_gbps=min(matrix[a][b], matrix[b][a]),
                    )
                )
    for run in recording.collectives:
        seen = run.gpus if run.gpus is not None else tuple(range(run.gpu_count))
        if not run.single_host:
            continue  # across hosts: the network's figure, nothing of this host's model
        gpus = tuple(mapped[g] for g in seen)
        comparisons.append(
            _collective(topology, gpus, run.largest.busbw, run.p2p_disabled, table, model_p2p_off)
        )
    return comparisons


def _collective(
    topology: Topology,
    gpus: tuple[int, ...],
    busbw: float,
    p2p_disabled: bool,
    table: BandwidthTable,
    model_p2p_off: bool = True,
) -> Comparison:
    staged = p2p_disabled and model_p2p_off
    predicted = allreduce_busbw_gbps(topology, gpus, table, peer_to_peer=not staged)
    pairs = [topology.link(a, b) for i, a in enumerate(gpus) for b in gpus[i + 1 :]]
    if p2p_disabled:  # through host memory: the PCIe path is the link that matters
        slowest = min(pairs, key=lambda link: (link.pcie is None, -_NEARNESS.get(link.pcie, 0)))
        path = slowest.pcie.value if slowest.pcie is not None else "PCIe"
    else:
        path = min(pairs, key=lambda link: link.bandwidth_gbps).kind
    return Comparison(
        what="all-reduce busbw, P2P off" if p2p_disabled else "all-reduce busbw",
        gpus=gpus,
        path=path,
        predicted_gbps=predicted,
        measured_gbps=busbw,
    )


_NEARNESS: dict[PciePath | None, int] = {path: rank for rank, path in enumerate(PciePath)}
"""PCIe paths by nearness (:class:`PciePath` lists them nearest first); the farthest is slowest."""


def copy_gbps(link: Link, table: BandwidthTable = DEFAULT_BANDWIDTH_TABLE) -> float:
    """What a copy between the link's GPUs reaches: its bandwidth, scaled by
    :attr:`BandwidthTable.nvswitch_copy_efficiency` through an NVSwitch."""
    if link.nvlinks and link.nvswitch:
        return link.bandwidth_gbps * table.nvswitch_copy_efficiency
    return link.bandwidth_gbps


def median_abs_error(comparisons: Sequence[Comparison]) -> float | None:
    """Median ``|predicted/measured - 1|`` over the counted comparisons."""
    errors = [abs(c.error) for c in comparisons if c.counted]
    return statistics.median(errors) if errors else None
