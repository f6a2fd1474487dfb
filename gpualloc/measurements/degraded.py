"""Hardware that measures far below what it should.

Two findings, each from a recording of the host:

- **P2P slower than staged copies**: p2pBandwidthLatencyTest's unidirectional P2P=Enabled copy
  of a pair below :data:`P2P_SLOWER_MARGIN` of its P2P=Disabled copy (through host memory). A
  peer path should never lose to a detour through the CPU; when it does, something on the path
  (PCIe ACS redirecting peer traffic to the root complex, an IOMMU, a BIOS setting, a riser)
  is broken, and NCCL, which prefers P2P, runs at the broken rate (NVIDIA/nccl#814, the
  6-GPU recording: 9.9 GB/s with P2P, 22 GB/s without).
- **Below its link class**: a pair's measured one-way copy below :data:`SLOW_PAIR_FRACTION` of
  the estimate for its link class on the same host (NV#, PIX, NODE, SYS...).
"""

from __future__ import annotations

from gpualloc.measurements.recognise import pairwise_copy
from gpualloc.measurements.records import Finding, Recording
from gpualloc.model.topology import Topology

P2P_SLOWER_MARGIN = 0.9
"""P2P under 90 % of the staged rate is flagged: a healthy path is several times faster (the
DGX Station's NVLink pairs: 96.9 against 15.7 GB/s both ways), and on a PCIe-only pair the two
are within a few percent (the 2080 Ti box: 5.72 and 5.71), so 10 % is above noise and far
below any healthy gap."""

SLOW_PAIR_FRACTION = 0.5
"""A pair measured under half its link class's estimate is flagged. The healthy recordings of
docs/evaluation.md section 5 measure 0.97 of the estimate on NVLink copies (DGX Station),
1.19 to 1.43 on PCIe copies (6x RTX A6000) and 0.78 to 0.84 in NCCL's all-reduce; one half
leaves a margin under the lowest of them. The 2080 Ti pair without peer access measures 0.36."""


def p2p_slower_than_staged(recording: Recording) -> list[Finding]:
    """Pairs whose P2P copy loses to the staged one (p2pBandwidthLatencyTest recordings)."""
    enabled = recording.matrix("unidirectional_p2p_enabled_writes") or recording.matrix(
        "unidirectional_p2p_enabled_reads"
    )
    disabled = recording.matrix("unidirectional_p2p_disabled")
    if enabled is None or disabled is None:
        return []
    findings = []
    for a in range(enabled.gpu_count):
        for b in range(a + 1, enabled.gpu_count):
            p2p = min(enabled.one_way(a, b) or 0.0, enabled.one_way(b, a) or 0.0)
            staged = min(disabled.one_way(a, b) or 0.0, disabled.one_way(b, a) or 0.0)
            if staged and p2p < P2P_SLOWER_MARGIN * staged:
                findings.append(
                    Finding(
                        "p2p-slower-than-staged",
                        (a, b),
                        f"P2P {p2p:.1f} GB/s against {staged:.1f} GB/s through host memory: the "
                        "peer path is broken (check ACS/IOMMU settings), and NCCL uses it",
                    )
                )
    return findings


def below_link_class(recording: Recording, topology: Topology) -> list[Finding]:
    """Pairs measured under :data:`SLOW_PAIR_FRACTION` of their link class's estimate."""
    matrix = pairwise_copy(recording).matrix
    findings = []
    for a in range(len(matrix)):
        for b in range(a + 1, len(matrix)):
            link = topology.link(a, b)
            measured = min(matrix[a][b], matrix[b][a])
            if link.bandwidth_gbps and measured < SLOW_PAIR_FRACTION * link.bandwidth_gbps:
                findings.append(
                    Finding(
                        "below-link-class",
                        (a, b),
                        f"{measured:.1f} GB/s over {link.kind}, whose estimate is "
                        f"{link.bandwidth_gbps:.1f}: a degraded link, or no peer access",
                    )
                )
    return findings
