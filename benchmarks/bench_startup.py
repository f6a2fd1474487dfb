#!/usr/bin/env python3
"""Start-up of every command, from a wheel install, and of Tab completion.

Builds a wheel of this checkout (``pip wheel --no-deps``; pip fetches the setuptools it builds
with, unless ``--wheel`` names one), installs it in a fresh virtual
environment, and times each command there, a whole process each, against ``python -c pass`` of
that environment: in rounds, each round ``python -c pass`` and then every command once, so that
a machine slowing down or speeding up moves both alike. Budgets (ms over ``python -c pass``):
40 for ``run -n 1 -- true`` on the embedded ledger, 60 for every other command, ``--help``
included. Then Tab presses as bash runs them with the committed static script sourced
once, as a shell does at start-up (budget: 30 ms a Tab): a command name, a bundled topology, a
policy; and the lease ids of ``release``, the one answer that asks gpualloc, a whole process
(budget: 30 ms over ``python -c pass``). Exit status 1 on a miss. Nothing is timed in the unit
tests (shared machines make timed tests flaky); they check instead what these paths import.

The fresh environment takes gpualloc's dependencies from the environment running this script
(a ``.pth`` line naming its site-packages, which runs none of that directory's own ``.pth``
files): no network, the versions the tests ran, and none of an editable install's import
finder, which adds its own cost to every start. ``--wheel FILE`` times a wheel built elsewhere,
and given twice or more times the wheels side by side, a round of each in turn (a before and an
after in the same minutes: the only fair comparison on a shared machine); ``--here`` times the
``gpualloc`` beside this interpreter instead (an editable install, say).
Byte-code caching is forced on, as in bench_launch.py: an installed gpualloc has its ``.pyc``
files. Every command works on a bundled topology (``GPUALLOC_TOPOLOGY``) and a temporary state
directory, with no broker.

``--broker`` times ``run``, ``alloc``, ``release`` and ``status`` through a broker instead
(``gpualloc serve`` of the same install on the bundled topology, in the scratch directory,
started by this script and stopped at the end): budget 25 ms over ``python -c pass`` for
``run``, 60 for the rest.

Usage: python benchmarks/bench_startup.py [--runs N] [--wheel FILE ... | --here] [--only WORD ...]
       python benchmarks/bench_startup.py --broker [--runs N] [--wheel FILE ...]
       python benchmarks/bench_startup.py --wheel before/gpualloc-*.whl --wheel after/gpualloc-*.whl
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from process_timing import gpualloc_argv

ROOT = Path(__file__).resolve().parent.parent
RUN_BUDGET_MS = 40.0
COMMAND_BUDGET_MS = 60.0
TAB_BUDGET_MS = 30.0
TOPOLOGY = "dgx1-v100"
COMMANDS: tuple[tuple[str, float], ...] = (
    ("run -n 1 -- true", RUN_BUDGET_MS),
    ("alloc --hold -n 1 --format env", COMMAND_BUDGET_MS),
    ("release {lease}", COMMAND_BUDGET_MS),  # the lease the line above made, each round
    ("status", COMMAND_BUDGET_MS),
    ("status --json", COMMAND_BUDGET_MS),
    ("gc", COMMAND_BUDGET_MS),
    ("plan -n 2", COMMAND_BUDGET_MS),
    ("topo show", COMMAND_BUDGET_MS),
    ("topo list", COMMAND_BUDGET_MS),
    ("config show", COMMAND_BUDGET_MS),
    ("doctor", COMMAND_BUDGET_MS),
    ("metrics", COMMAND_BUDGET_MS),
    ("slurm gres-conf", COMMAND_BUDGET_MS),
    ("--version", COMMAND_BUDGET_MS),
    ("--help", COMMAND_BUDGET_MS),
    ("run --help", COMMAND_BUDGET_MS),
)
"""Command lines (after ``gpualloc``) and their budgets over ``python -c pass``."""
BROKER_RUN_BUDGET_MS = 25.0
BROKER_COMMANDS: tuple[tuple[str, float], ...] = (
    ("run -n 1 -- true", BROKER_RUN_BUDGET_MS),
    ("alloc --hold -n 1 --format env", COMMAND_BUDGET_MS),
    ("release {lease}", COMMAND_BUDGET_MS),
    ("status", COMMAND_BUDGET_MS),
)
"""With ``--broker``: the commands a user runs through the host's broker, and their budgets."""
SCRIPT = ROOT / "completions" / "gpualloc.bash"
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


def build_environment(place: Path, wheel: Path | None) -> Path:
    """A fresh virtual environment under ``place`` with gpualloc's wheel installed; its
    ``bin`` directory."""
    if wheel is None:
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", place, ROOT],
            check=True,
        )
        wheel = next(place.glob("gpualloc-*.whl"))
    venv = place / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps",
         "--no-index", wheel],
        check=True,
    )  # fmt: skip
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    ours = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    (Path(site) / "_gpualloc_dependencies.pth").write_text("\n".join(sorted(ours)) + "\n")
    return venv / "bin"


class Setup(NamedTuple):
    """One gpualloc to time: its label, how to start it, its python and its environment."""

    label: str
    gpualloc: list[str]
    python: str
    env: dict[str, str]


def time_rounds(
    setups: list[Setup], lines: list[list[str]], runs: int
) -> dict[str, tuple[list[list[float]], list[list[float]]]]:
    """Per setup and line (``python -c pass`` first), its wall times and its CPU times (user +
    system, resource.getrusage: what it takes from other processes), in ms, over ``runs``
    rounds of every line of every setup once, in turn; a ``{lease}`` word is the lease id the
    last line printed as ``GPUALLOC_LEASE_ID=...``."""
    timed = {s.label: ([[] for _ in range(len(lines) + 1)], [[] for _ in range(len(lines) + 1)])
             for s in setups}  # fmt: skip
    leases = {s.label: "" for s in setups}
    for _ in range(runs):
        for setup in setups:
            wall, cpu = timed[setup.label]
            argvs = [[setup.python, "-c", "pass"]] + [[*setup.gpualloc, *line] for line in lines]
            for position, line in enumerate(argvs):
                argv = [leases[setup.label] if word == "{lease}" else word for word in line]
                before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
                done = subprocess.run(
                    argv, env=setup.env, check=True, capture_output=True, text=True
                )
                wall[position].append((time.perf_counter() - start) * 1000)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu[position].append(
                    (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000
                )
                leases[setup.label] = next(
                    (word.split("=", 1)[1].strip("'\"") for word in done.stdout.split()
                     if word.startswith("GPUALLOC_LEASE_ID=")),
                    leases[setup.label],
                )  # fmt: skip
    return timed


def report(
    label: str, commands: list[tuple[str, float]], wall: list[list[float]], cpu: list[list[float]]
) -> dict[str, float]:
    """Print one setup's table; each command's median wall time over ``python -c pass``."""
    floor, cpu_floor = statistics.median(wall[0]), statistics.median(cpu[0])
    print(f"{label}: medians of {len(wall[0])} rounds, ms")
    print(f"{'':<32} {'wall':>6} {'over':>6} {'p25 to p75':>12} {'budget':>7}  {'cpu':>5}")
    print(f"{'python -c pass':<32} {floor:6.1f} {'':>35}  {cpu_floor:5.1f}")
    added: dict[str, float] = {}
    for (line, budget), own, own_cpu in zip(commands, wall[1:], cpu[1:], strict=True):
        added[line] = statistics.median(own) - floor
        deltas = sorted(t - p for t, p in zip(own, wall[0], strict=True))
        low, high = deltas[len(deltas) // 4], deltas[(3 * len(deltas)) // 4]
        verdict = "ok" if added[line] <= budget else "OVER"
        print(
            f"{line:<32} {statistics.median(own):6.1f} {added[line]:+6.1f} {low:+5.0f} to "
            f"{high:+4.0f} {budget:+6.0f} {verdict:>4}  {statistics.median(own_cpu):5.1f}"
        )
    return added


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


def broker_client_env(env: dict[str, str], place: Path) -> dict[str, str]:
    """``env`` for a client of the broker at ``place``: no topology named (a named topology
    has a ledger of its own), the broker's socket."""
    client = {k: v for k, v in env.items() if k != "GPUALLOC_TOPOLOGY"}
    client["GPUALLOC_BROKER"] = str(place / "broker.sock")
    return client


def start_broker(gpualloc: list[str], env: dict[str, str], place: Path) -> subprocess.Popen[bytes]:
    """``gpualloc serve`` of this install on the bundled topology, answering at ``place``."""
    socket = place / "broker.sock"
    serve_env = {k: v for k, v in env.items() if not k.startswith("GPUALLOC_")}
    broker = subprocess.Popen(
        [*gpualloc, "--topology", TOPOLOGY, "serve", "--socket", str(socket),
         "--state-dir", str(place / "broker-state")],
        env=serve_env, stderr=(place / "broker.log").open("wb"), cwd="/",
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not socket.exists():
        if broker.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the broker did not start: {(place / 'broker.log').read_text()}")
        time.sleep(0.05)
    return broker


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="rounds (a start of each a round)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--wheel",
        type=Path,
        action="append",
        help="time this wheel instead of building one; given twice or more, time them side by "
        "side, in turn (labelled by their directories' names: before/ and after/, say)",
    )
    where.add_argument("--here", action="store_true", help="time the gpualloc beside python")
    parser.add_argument(
        "--only",
        action="append",
        help="time only the command lines containing this word (given again: any of them)",
    )
    parser.add_argument("--no-tabs", action="store_true", help="skip the Tab timings")
    parser.add_argument(
        "--broker", action="store_true", help="time the commands through a broker of each install"
    )
    args = parser.parse_args()
    commands = [
        (line, budget)
        for line, budget in (BROKER_COMMANDS if args.broker else COMMANDS)
        if not args.only or any(word in line for word in args.only)
    ]
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUALLOC_")}
    base.pop("PYTHONDONTWRITEBYTECODE", None)
    brokers: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory() as scratch:
        place = Path(scratch)
        setups = []
        wheels: list[Path | None] = list(args.wheel or [None])
        for number, wheel in enumerate(wheels):
            own = place / str(number)
            own.mkdir()
            if args.here:
                label, gpualloc, python = "this environment", gpualloc_argv(), sys.executable
            else:
                bin_dir = build_environment(own, wheel)
                label = "a wheel of this checkout" if wheel is None else wheel.parent.name
                gpualloc, python = [str(bin_dir / "gpualloc")], str(bin_dir / "python")
            env = {
                **base,
                "PATH": f"{Path(gpualloc[0]).parent}{os.pathsep}{base.get('PATH', '')}",
                "GPUALLOC_STATE_DIR": str(own / "state"),
                "GPUALLOC_TOPOLOGY": TOPOLOGY,
                "GPUALLOC_BROKER": str(own / "no-broker.sock"),
                "GPUALLOC_CACHE_DIR": str(own / "cache"),
                "XDG_CONFIG_HOME": str(own / "config"),
            }
            if args.broker:
                env = broker_client_env(env, own)
                brokers.append(start_broker(gpualloc, env, own))
            subprocess.run([*gpualloc, "alloc", "--hold", "-n", "2"], env=env, check=True,
                           stdout=subprocess.DEVNULL)  # fmt: skip
            setups.append(Setup(label, gpualloc, python, env))
        lines = [line.split() for line, _ in commands]
        try:
            time_rounds(setups, lines, 1)  # warm: byte-code, caches
            timed = time_rounds(setups, lines, args.runs)
        finally:
            for broker in brokers:
                broker.terminate()
                broker.wait(timeout=30)
        if args.broker:
            print(f"through a broker (gpualloc serve on {TOPOLOGY})")
            args.no_tabs = True
        else:
            print(f"GPUALLOC_TOPOLOGY={TOPOLOGY}, the embedded ledger (no broker)")
        added = {
            setup.label: report(setup.label, commands, *timed[setup.label]) for setup in setups
        }
        missed = sum(added[setups[-1].label][line] > budget for line, budget in commands)
        if len(setups) > 1:
            first, last = setups[0].label, setups[-1].label
            print(f"{last} against {first}, ms over python -c pass:")
            for line, _ in commands:
                print(f"  {line:<32} {added[first][line]:+6.1f} -> {added[last][line]:+6.1f}")
        if args.no_tabs or args.only:
            return 1 if missed else 0
        if shutil.which("bash") is None:
            print("bash is not installed: no Tab timings")
            return 1 if missed else 0
        env = setups[-1].env
        floor = statistics.median(timed[setups[-1].label][0][0])
        for label, words in TABS.items():
            per_tab = tab_ms(words, args.runs, env)
            missed += per_tab > TAB_BUDGET_MS
            verdict = "ok" if per_tab <= TAB_BUDGET_MS else "OVER"
            print(f"Tab, {label} ({words!r}): {per_tab:.1f} ms ({verdict})")
        per_tab = tab_ms(LEASE_TAB, max(3, args.runs // 3), env)
        added_tab = per_tab - floor
        missed += added_tab > TAB_BUDGET_MS
        verdict = "ok" if added_tab <= TAB_BUDGET_MS else "OVER"
        print(f"Tab, lease ids: {per_tab:.0f} ms, {added_tab:+.0f} ms over python ({verdict})")
    run_budget = BROKER_RUN_BUDGET_MS if args.broker else RUN_BUDGET_MS
    print(
        f"budgets over python -c pass: {run_budget:.0f} ms for run, "
        f"{COMMAND_BUDGET_MS:.0f} ms for the rest, {TAB_BUDGET_MS:.0f} ms a Tab; {missed} over"
    )
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
