#!/usr/bin/env python3
"""Start-up budget of issue 29, point 5: ``--help`` and Tab completion.

Prints the median wall time of ``python -c pass``, ``gpualloc --help`` and ``gpualloc run
--help`` (each a whole process; budget: 100 ms over ``python -c pass``), and of Tab presses as
bash runs them with the committed static script sourced once, as a shell does at start-up
(budget: 30 ms a Tab): a command name, a bundled topology, a policy; and the lease ids of
``release``, the one answer that asks gpualloc, a whole process (budget: 30 ms over ``python
-c pass``). Exit status 1 on a miss. Nothing is timed in the unit tests (shared machines make
timed tests flaky); they check instead what these paths import.

Byte-code caching is forced on, as in bench_launch.py: an installed gpualloc has its ``.pyc``
files. An editable install (``pip install -e``) adds its import finder, 5 to 15 ms, to every
start; a wheel does not.

Usage: python benchmarks/bench_startup.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from process_timing import gpualloc_argv, median_ms

HELP_BUDGET_MS = 100.0
TAB_BUDGET_MS = 30.0
SCRIPT = Path(__file__).resolve().parent.parent / "completions" / "gpualloc.bash"
TABS = {
    "a command": "gpualloc s",
    "--topology": "gpualloc --topology dgx",
    "--policy": "gpualloc run --policy ma",
}
LEASE_TAB = "gpualloc release "
BASH_TAB = """
source "$1"; shift
runs=$1; shift
COMP_WORDS=("$@"); COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
_gpualloc  # once unmeasured: bash caches what it can
TIMEFORMAT=%R
time (for ((i = 0; i < runs; i++)); do _gpualloc; done) 2>&1
true  # the last completion's status is no failure
"""


def tab_ms(words: str, runs: int, env: dict[str, str]) -> float:
    """Mean wall time of one Tab in a bash that has the script sourced."""
    argv = words.split(" ")
    result = subprocess.run(
        ["bash", "-c", BASH_TAB, "bash", str(SCRIPT), str(runs), *argv],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return float(result.stdout.strip().splitlines()[-1]) * 1000 / runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21, help="timed starts per command")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    gpualloc = gpualloc_argv()
    env["PATH"] = f"{Path(gpualloc[0]).parent}{os.pathsep}{env.get('PATH', '')}"
    missed = 0
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
        for label, extra in (("--help", ["--help"]), ("run --help", ["run", "--help"])):
            median = median_ms([*gpualloc, *extra], args.runs, env)
            added = median - floor
            missed += added > HELP_BUDGET_MS
            verdict = "ok" if added <= HELP_BUDGET_MS else "OVER BUDGET"
            print(f"gpualloc {label}: {median:.0f} ms, {added:+.0f} ms over python ({verdict})")
        if shutil.which("bash") is None:
            print("bash is not installed: no Tab timings")
            return 1 if missed else 0
        for label, words in TABS.items():
            per_tab = tab_ms(words, args.runs, env)
            missed += per_tab > TAB_BUDGET_MS
            verdict = "ok" if per_tab <= TAB_BUDGET_MS else "OVER BUDGET"
            print(f"Tab, {label} ({words!r}): {per_tab:.1f} ms ({verdict})")
        per_tab = tab_ms(LEASE_TAB, max(3, args.runs // 3), env)
        added = per_tab - floor
        missed += added > TAB_BUDGET_MS
        verdict = "ok" if added <= TAB_BUDGET_MS else "OVER BUDGET"
        print(f"Tab, lease ids: {per_tab:.0f} ms, {added:+.0f} ms over python ({verdict})")
    print(
        f"budgets: {HELP_BUDGET_MS:.0f} ms over python for help, {TAB_BUDGET_MS:.0f} ms a Tab "
        f"({TAB_BUDGET_MS:.0f} ms over python for lease ids); {missed} over"
    )
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
