#!/usr/bin/env python3
"""What ``gpualloc submit`` costs the user who types it: the median wall time of
``gpualloc submit -- true`` on a bundled topology, beside ``python -c pass``; the target is
150 ms over ``python -c pass`` (the command returns once the job's supervisor is detached,
before it has imported anything). Then how long the submitted jobs took to end, which is
the supervisor's cost, not the user's. Exit status 1 when the target is missed.

Runs against a temporary state directory and ``XDG_STATE_HOME``; byte-code caching is forced
on, as in ``bench_launch.py``.

Usage: python benchmarks/bench_submit.py [--runs N] [--topology NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from process_timing import gpualloc_argv, median_ms

TARGET_MS = 150.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--topology", default="dgx1-v100")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="gpualloc-bench-submit-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUALLOC_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env |= {
        "GPUALLOC_STATE_DIR": str(scratch / "state"),
        "GPUALLOC_CACHE_DIR": str(scratch / "cache"),
        "XDG_STATE_HOME": str(scratch / "xdg"),
        "XDG_CONFIG_HOME": str(scratch / "config"),
        "GPUALLOC_TOPOLOGY": args.topology,
    }
    try:
        base = gpualloc_argv()
        subprocess.run([*base, "submit", "--", "true"], env=env, check=True, capture_output=True)
        python = median_ms([sys.executable, "-c", "pass"], args.runs, env)
        submit = median_ms([*base, "submit", "--", "true"], args.runs, env)
        started = time.monotonic()
        while True:
            listed = subprocess.run(
                [*base, "jobs", "--json"], env=env, check=True, capture_output=True, text=True
            ).stdout
            states = [job["state"] for job in json.loads(listed)]
            if all(
                state in ("completed", "failed", "cancelled", "timeout", "lost") for state in states
            ):
                break
            time.sleep(0.2)
        drained = time.monotonic() - started
        over = submit - python
        print(f"python -c pass        {python:7.1f} ms")
        print(f"gpualloc submit       {submit:7.1f} ms  ({over:+.1f} ms; target +{TARGET_MS:g} ms)")
        print(f"{len(states)} jobs ended within {drained:.1f} s of the last submit")
        failed = [s for s in states if s != "completed"]
        if failed:
            print(f"not completed: {failed}")
            return 1
        return 0 if over <= TARGET_MS else 1
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
