"""Peer-to-peer access between two GPUs as the driver reports it: NVML's status codes and
``nvidia-smi topo -p2p`` matrices, and what they mean for copies between the pair.

Without peer access (GeForce boards have it off in the driver: ``GNS``; some chipsets and
topologies: ``CNS``, ``TNS``, ``NS``) CUDA stages a copy between two GPUs through host memory,
which placement prices by :attr:`gpualloc.model.bandwidth.BandwidthTable.staged_copy_factor`.
"""

from __future__ import annotations

import re

P2P_MEANING = {
    "OK": "enabled",
    "CNS": "chipset not supported",
    "GNS": "GPU not supported (GeForce boards have it off in the driver)",
    "TNS": "topology not supported",
    "NS": "not supported",
    "DR": "disabled by registry key",
    "U": "unknown",
}
"""``nvidia-smi topo -p2p`` codes, and what they mean (its own legend)."""
NVML_P2P_CODE = {0: "OK", 1: "CNS", 2: "GNS", 3: "TNS", 4: "DR", 5: "NS", 6: "U"}
"""``nvmlGpuP2PStatus_t`` -> the nvidia-smi code."""
P2P_READ = 0
"""``NVML_P2P_CAPS_INDEX_READ`` (nvidia-ml-py defines it as the tuple ``(0,)``, by a stray
comma)."""
P2P_NVLINK = 2
"""``NVML_P2P_CAPS_INDEX_NVLINK``."""


def peer_access_of(code: str) -> bool | None:
    """``OK`` -> True; ``U`` (unknown) -> None; every other code -> False."""
    if code == "OK":
        return True
    return None if code == "U" else False


_MATRIX_ROW = re.compile(r"^\s*GPU(\d+)\s+(.*)$")


def parse_p2p_matrix(text: str) -> dict[tuple[int, int], str]:
    """``nvidia-smi topo -p2p r`` (or ``w``, ``n``, ...): (GPU a, GPU b), a < b -> its code
    (``OK``, ``CNS``, ``GNS``, ``TNS``, ``NS``, ``DR``, ``U``). Rows start with a space and end
    with a tab; the legend below the matrix is skipped."""
    found: dict[tuple[int, int], str] = {}
    for line in text.splitlines():
        row = _MATRIX_ROW.match(line)
        if row is None:
            continue
        a = int(row.group(1))
        for b, code in enumerate(row.group(2).split()):
            if b != a and code in P2P_MEANING:
                found.setdefault((min(a, b), max(a, b)), code)
    return found
