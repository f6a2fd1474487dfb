"""What the start-up benchmarks share: timing whole processes, and finding gpualloc."""

from __future__ import annotations

import os
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


def cpu_ms(commands: list[list[str]], runs: int, env: dict[str, str]) -> list[float]:
    """Mean CPU time (user + system) of each command, run in turn ``runs`` times: what each
    takes from the others when several processes share the cores."""
    spent = [0.0] * len(commands)
    for _ in range(runs):
        for position, argv in enumerate(commands):
            before = os.times()
            subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
            after = os.times()
            spent[position] += (after.children_user - before.children_user) + (
                after.children_system - before.children_system
            )
    return [total * 1000 / runs for total in spent]


def gpualloc_argv() -> list[str]:
    """The console script beside this interpreter (as users run it), else ``python -m``."""
    script = Path(sys.executable).with_name("gpualloc")
    return [str(script)] if script.exists() else [sys.executable, "-m", "gpualloc"]
