#!/usr/bin/env python3
"""Speed of the topology layer: CLI start-up, parsing, model validation, link lookups.

Run on its own: ``python benchmarks/bench_topology.py``. Prints one figure per line; nothing is
asserted (timed unit tests are flaky on shared machines). Targets: ``gpualloc --help`` well
under 0.5 s; importing a 16-GPU ``topo -m`` and loading a bundled topology in milliseconds.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def best_of(function: Callable[[], object], repeat: int = 20) -> float:
    timings = []
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        timings.append(time.perf_counter() - start)
    return min(timings)


def sixteen_gpu_matrix() -> str:
    labels = [f"GPU{i}" for i in range(16)]
    lines = ["\t" + "\t".join([*labels, "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"])]
    for a in range(16):
        cells = ["X" if a == b else "NV6" for b in range(16)]
        cpus = "0-23,48-71" if a < 8 else "24-47,72-95"
        lines.append("\t".join([labels[a], *cells, cpus, str(a // 8), "", "N/A"]))
    return "\n".join(lines) + "\n"


def main() -> None:
    from gpualloc.discovery.smi import topology_from_smi_texts
    from gpualloc.topologies import load_bundled

    subprocess.run([sys.executable, "-m", "gpualloc", "--help"], capture_output=True, check=True)
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "gpualloc", "--help"], capture_output=True, check=True
        )
        runs.append(time.perf_counter() - start)
    median_ms = statistics.median(runs) * 1000
    print(f"gpualloc --help (process start to exit), median of 5: {median_ms:.0f} ms")

    text = sixteen_gpu_matrix()
    import_ms = best_of(lambda: topology_from_smi_texts(text)) * 1000
    print(f"import 16-GPU topo -m text: {import_ms:.2f} ms")
    print(f"load bundled dgx2 (16 GPUs): {best_of(lambda: load_bundled('dgx2')) * 1000:.2f} ms")
    topology = load_bundled("dgx2")

    def all_pairs() -> None:
        for a in range(16):
            for b in range(16):
                if a != b:
                    topology.link(a, b)

    per_lookup = best_of(all_pairs) / 240
    print(f"link lookup: {per_lookup * 1e9:.0f} ns")
    print(f"networkx view of dgx2: {best_of(topology.to_networkx) * 1000:.2f} ms")


if __name__ == "__main__":
    main()
