"""What a recording holds once read: matrices, collective runs, and where they came from."""

from __future__ import annotations

from typing import Literal

from msgspec import Struct

from gpualloc.errors import TopologyParseError

Tool = Literal["nvbandwidth", "p2pBandwidthLatencyTest", "nccl-tests"]
Endpoints = Literal["gpu-to-gpu", "host-to-gpu", "gpu-to-host", "host-gpu-both", "gpu-local"]
Pattern = Literal["one-way", "bidirectional-each", "bidirectional-sum", "latency", "connectivity"]


class PairMatrix(Struct, frozen=True, kw_only=True):
    """One matrix of a recording.

    For ``gpu-to-gpu`` matrices ``values[a][b]`` is the figure for data going from GPU ``a`` to
    GPU ``b`` whatever way the tool printed it (nvbandwidth's ``GPU(row) <- GPU(column)`` is
    transposed here); the diagonal, a GPU's copy to itself, is ``None``, as are pairs printed
    ``N/A``. Host matrices (and ``gpu-local``) have one row, a figure per GPU.
    """

    testcase: str
    """nvbandwidth's testcase name (``device_to_device_memcpy_read_ce``), or a name made from
    p2pBandwidthLatencyTest's section title (``unidirectional_p2p_enabled_writes``)."""
    title: str
    """The line the tool printed above the matrix, verbatim."""
    endpoints: Endpoints
    pattern: Pattern
    """``one-way``: one copy at a time; ``bidirectional-each``: one direction's rate while the
    other runs (nvbandwidth); ``bidirectional-sum``: both directions added (p2pBandwidth-
    LatencyTest); ``latency``: microseconds; ``connectivity``: 1 where P2P access exists."""
    unit: str
    values: list[list[float | None]]
    engine: str = ""
    """How the copy was made: ``CE`` (copy engine), ``SM`` (kernel) or empty (not said)."""
    p2p: bool | None = None
    """p2pBandwidthLatencyTest: whether peer access was enabled; None where not said."""

    @property
    def gpu_count(self) -> int:
        return len(self.values[0]) if self.values else 0

    def one_way(self, source: int, target: int) -> float | None:
        """GB/s from ``source`` to ``target`` on one direction of the pair, where measured."""
        value = self.values[source][target]
        if value is None or self.pattern in ("latency", "connectivity"):
            return None
        return value / 2 if self.pattern == "bidirectional-sum" else value


class CollectiveRow(Struct, frozen=True):
    """One message size of an nccl-tests table: algorithm and bus bandwidth, GB/s."""

    size_bytes: int
    algbw: float
    busbw: float
    in_place_algbw: float
    in_place_busbw: float


class CollectiveRun(Struct, frozen=True, kw_only=True):
    """One nccl-tests run: a collective over a set of GPUs, its table and average."""

    operation: str | None
    """``all_reduce`` etc., from the command line or the test's banner; None where not printed."""
    gpu_count: int
    gpus: tuple[int, ...] | None
    """The host's GPU indices the ranks used (``Rank ... device N`` lines, mapped through
    ``CUDA_VISIBLE_DEVICES`` where the command set it); None when the output does not say."""
    bus_ids: tuple[str, ...] = ()
    hosts: tuple[str, ...] = ()
    """Distinct host names of the ranks (empty when no ``Rank`` lines were printed)."""
    gpu_names: tuple[str, ...] = ()
    p2p_disabled: bool = False
    """``NCCL_P2P_DISABLE=1`` on the command line: peers exchanged through host memory."""
    command: str | None = None
    rows: tuple[CollectiveRow, ...] = ()
    average_busbw: float | None = None

    @property
    def largest(self) -> CollectiveRow:
        """The row of the largest message: the bandwidth a long all-reduce settles at."""
        return max(self.rows, key=lambda row: row.size_bytes)

    @property
    def single_host(self) -> bool:
        return len(self.hosts) <= 1


class Recording(Struct, frozen=True, kw_only=True):
    """A benchmark's output as gpualloc read it."""

    tool: Tool
    source: str
    provenance: dict[str, str] = {}
    """The fixture header (``# source:``, ``# machine:``, ``# captured-by:``, ``# note:``)."""
    devices: tuple[str, ...] = ()
    """GPU names in device order, where the tool printed them."""
    matrices: tuple[PairMatrix, ...] = ()
    collectives: tuple[CollectiveRun, ...] = ()
    notes: tuple[str, ...] = ()
    """What was in the file but not read as a figure (waived testcases, a cut run)."""

    def matrix(self, testcase: str) -> PairMatrix | None:
        return next((m for m in self.matrices if m.testcase == testcase), None)


class Finding(Struct, frozen=True):
    """One pair that measured wrong, and the figures that show it."""

    kind: str
    """``p2p-slower-than-staged`` or ``below-link-class``."""
    gpus: tuple[int, int]
    detail: str


class CutTable(ValueError):
    """A table that is not whole: skipped with a note, the rest of the output still read."""


def matrix_recording(
    tool: Tool,
    *,
    source: str,
    provenance: dict[str, str],
    devices: dict[int, str],
    matrices: list[PairMatrix],
    notes: list[str],
) -> Recording:
    """The recording of a matrix benchmark; one line of refusal when no whole matrix was read."""
    if not matrices:
        raise TopologyParseError(
            f"a {tool} output with no complete matrix" + (f" ({notes[0]})" if notes else ""),
            source=source,
            hint=f"save the whole output of {tool} to the file",
        )
    return Recording(
        tool=tool,
        source=source,
        provenance=provenance,
        devices=tuple(devices[i] for i in sorted(devices)),
        matrices=tuple(matrices),
        notes=tuple(notes),
    )
