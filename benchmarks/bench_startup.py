#!/usr/bin/env python3
"""Start-up budget of issue 8: ``gpualloc --help`` and a completion request.

Prints the median wall time of ``python -c pass``, ``gpualloc --help`` and three bash
completion requests (a command name, a bundled topology name, the lease ids of a ledger), and
checks what each adds over ``python -c pass`` against the budget (200 ms). Exit status 1 on a
miss. Nothing is timed in the unit tests: shared machines make timed tests flaky; the tests
check instead that these paths import no networkx, pynvml or psutil.

Byte-code caching is forced on, as in bench_launch.py: an installed gpualloc has its ``.pyc``
files.

Usage: python benchmarks/bench_startup.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

from process_timing import gpualloc_argv, median_ms

BUDGET_MS = 200.0
COMPLETIONS = {
    "complete a command": "gpualloc s",
    "complete --topology": "gpualloc --topology dgx",
    "complete lease ids": "gpualloc release ",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21, help="timed starts per command")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    gpualloc = gpualloc_argv()
    with tempfile.TemporaryDirectory() as state:
        env["GPUALLOC_STATE_DIR"] = state
        subprocess.run(
            [*gpualloc, "-t", "dgx1-v100", "alloc", "--hold", "-n", "2"],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        subprocess.run([*gpualloc, "--help"], env=env, check=True, stdout=subprocess.DEVNULL)
        floor = median_ms([sys.executable, "-c", "pass"], args.runs, env)
        print(f"python -c pass: {floor:.0f} ms (median of {args.runs})")
        figures = {"gpualloc --help": median_ms([*gpualloc, "--help"], args.runs, env)}
        for label, words in COMPLETIONS.items():
            request = {
                **env,
                "_GPUALLOC_COMPLETE": "complete_bash",
                "COMP_WORDS": words,
                "COMP_CWORD": str(len(words.split(" ")) - 1),
            }
            figures[f"{label} ({words!r})"] = median_ms(gpualloc, args.runs, request)
    missed = 0
    for label, median in figures.items():
        added = median - floor
        verdict = "ok" if added <= BUDGET_MS else "OVER BUDGET"
        missed += added > BUDGET_MS
        print(f"{label}: {median:.0f} ms, {added:+.0f} ms over python ({verdict})")
    print(f"budget: {BUDGET_MS:.0f} ms added; {missed} over")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
