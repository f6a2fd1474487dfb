#!/usr/bin/env python3
"""The broker's protocol fuzzer at length: ``tests/test_fuzz_broker.py``
with more requests than CI sends.

Run as root from the repository root: ``python benchmarks/fuzz_broker.py [--requests 200000]``.
Two real Unix users send Hypothesis-generated requests to a real broker (mutated requests of
every operation, requests near every bound the broker enforces, garbage) while a third user's
``alloc`` and ``release`` must each be answered within 1 s; it prints how many requests were
sent, in how long, and the third user's slowest answer. The test file's walk of every bound
runs too. Exits as the tests do.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200_000)
    options = parser.parse_args()
    env = {**os.environ, "GPUALLOC_FUZZ_REQUESTS": str(options.requests)}
    test = "tests/test_fuzz_broker.py"
    argv = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", test]
    return subprocess.run(argv, cwd=ROOT, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
