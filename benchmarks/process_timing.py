"""What the start-up benchmarks share: timing whole processes, and finding gpualloc."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path


def median_ms(argv: list[str], runs: int, env: dict[str, str]) -> float:
    """Median wall time of ``runs`` runs of ``argv``, process start to exit."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def gpualloc_argv() -> list[str]:
    """The console script beside this interpreter (as users run it), else ``python -m``."""
    script = Path(sys.executable).with_name("gpualloc")
    return [str(script)] if script.exists() else [sys.executable, "-m", "gpualloc"]
