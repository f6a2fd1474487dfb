"""Which benchmark wrote a file, and the pairwise copy bandwidth placement takes from it."""

from __future__ import annotations

from msgspec import Struct

from gpualloc.errors import TopologyParseError
from gpualloc.measurements.nccl_tests import looks_like_nccl_tests, read_nccl_tests
from gpualloc.measurements.nvbandwidth import looks_like_nvbandwidth, read_nvbandwidth
from gpualloc.measurements.p2p_latency_test import looks_like_p2p_test, read_p2p_test
from gpualloc.measurements.records import PairMatrix, Recording

PAIRWISE_PREFERENCE = (
    "device_to_device_memcpy_write_ce",
    "device_to_device_memcpy_read_ce",
    "device_to_device_memcpy_write_sm",
    "device_to_device_memcpy_read_sm",
    "unidirectional_p2p_enabled_writes",
    "unidirectional_p2p_enabled_reads",
    "device_to_device_bidirectional_memcpy_write_ce",
    "device_to_device_bidirectional_memcpy_read_ce",
    "bidirectional_p2p_enabled",
    "unidirectional_p2p_disabled",
    "bidirectional_p2p_disabled",
)
"""The matrix a pair's bandwidth is taken from, first found first. One copy at a time before
copies under opposite traffic; P2P enabled (what NCCL and torch use where the driver grants peer
access) before staged copies; the copy engine (cudaMemcpy, what frameworks call) before kernels."""


class PairwiseCopy(Struct, frozen=True):
    """One-way GB/s per ordered GPU pair (diagonal 0), and the matrix it came from."""

    matrix: list[list[float]]
    used: str
    """``testcase`` and title of the recording's matrix, for the user to check."""


def read_recording(text: str, *, source: str) -> Recording | None:
    """The recording in ``text``, or None when no known benchmark wrote it."""
    if looks_like_p2p_test(text):
        return read_p2p_test(text, source=source)
    if looks_like_nccl_tests(text):
        return read_nccl_tests(text, source=source)
    if looks_like_nvbandwidth(text):
        return read_nvbandwidth(text, source=source)
    return None


def pairwise_copy(recording: Recording) -> PairwiseCopy:
    """The one-way copy bandwidth of every GPU pair, from the most telling matrix there is."""
    candidates = {m.testcase: m for m in recording.matrices if m.endpoints == "gpu-to-gpu"}
    for name in PAIRWISE_PREFERENCE:
        matrix = candidates.get(name)
        if matrix is not None:
            return PairwiseCopy(_one_way(matrix, recording.source), f"{name} ({matrix.title})")
    if recording.tool == "nccl-tests":
        reason = "nccl-tests measures collectives, not GPU pairs"
        hint = (
            "a topology takes pairwise copies: run nvbandwidth or p2pBandwidthLatencyTest and "
            "import that; these figures are stored by 'gpualloc calibrate --from FILE' run on "
            "the host that measured them"
        )
    else:
        kinds = ", ".join(dict.fromkeys(m.endpoints for m in recording.matrices))
        reason = (
            f"no GPU-to-GPU copy matrix in this {recording.tool} output (it has "
            f"{len(recording.matrices)} {kinds} matrices"
        )
        if any("device_to_device" in note and "waived" in note for note in recording.notes):
            reason += "; its device-to-device testcases were waived: one GPU, or no peer access"
        reason += ")"
        hint = "run nvbandwidth -t device_to_device_memcpy_write_ce, or p2pBandwidthLatencyTest"
    raise TopologyParseError(reason, source=recording.source, hint=hint)


def _one_way(matrix: PairMatrix, source: str) -> list[list[float]]:
    count = matrix.gpu_count
    result = [[0.0] * count for _ in range(count)]
    for a in range(count):
        for b in range(count):
            if a == b:
                continue
            value = matrix.one_way(a, b)
            if value is None:
                raise TopologyParseError(
                    f"{matrix.testcase}: GPU {a} to GPU {b} was not measured (N/A)",
                    source=source,
                    hint="every pair needs a figure; run the test on all GPUs",
                )
            result[a][b] = value
    return result
