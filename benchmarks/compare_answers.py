#!/usr/bin/env python3
"""Placements of this checkout against another's, decision by decision: a speed change to the
placement search must not change an answer.

Run on its own: ``python benchmarks/compare_answers.py --against DIR [--policy P ...] [--host H
...] [--pattern X ...] [--busy-sets 12] [--seed 1] [--cap-s 3]``, where ``DIR`` is a checkout of
the other version (``git worktree add /tmp/before REV``). For every (policy, host, pattern,
sensitivity, job size) it decides on the empty host and on ``--busy-sets`` random busy sets that
leave enough GPUs free, in a process of each version, and compares the GPUs chosen, in order.
A decision past ``--cap-s`` in either version is skipped and counted. Prints each difference
and a summary; exits 1 on a difference.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def decide_all(args: argparse.Namespace) -> dict[str, list[int] | None]:
    """Every decision of the run, keyed by its description; None where past the cap."""
    from gpualloc.model.request import HostState, JobRequest
    from gpualloc.placement.decide import decision_context
    from gpualloc.topologies import bundled_names, load_bundled

    try:
        from gpualloc.placement.mapa.patterns import BUILTIN_PATTERNS, build_pattern
        from gpualloc.placement.policies.registry import get_policy, policy_names
    except ModuleNotFoundError:  # a version from before placement's subpackages
        from gpualloc.placement.patterns import BUILTIN_PATTERNS, build_pattern
        from gpualloc.placement.registry import get_policy, policy_names

    def stop(signum: int, frame: object) -> None:
        raise TimeoutError

    signal.signal(signal.SIGALRM, stop)
    answers: dict[str, list[int] | None] = {}
    for host in args.host or [h for h in bundled_names() if load_bundled(h).gpu_count <= 16]:
        topology = load_bundled(host)
        n = topology.gpu_count
        for policy_name in args.policy or policy_names():
            policy = get_policy(policy_name)
            for pattern in args.pattern or sorted(BUILTIN_PATTERNS):
                for sensitive in (False, True):
                    for k in range(1, n + 1):
                        request = JobRequest(
                            gpus=k, pattern=build_pattern(pattern, k), sensitive=sensitive
                        )
                        rng = random.Random(f"{args.seed} {host} {pattern} {k}")
                        busy_sets = [frozenset()] + [
                            frozenset(rng.sample(range(n), rng.randint(0, n - k)))
                            for _ in range(args.busy_sets)
                        ]
                        for index, busy in enumerate(busy_sets):
                            ctx = decision_context(topology, request, HostState.with_busy(n, busy))
                            key = f"{policy_name} {host} {pattern} {sensitive} {k} {index}"
                            signal.setitimer(signal.ITIMER_REAL, args.cap_s)
                            try:
                                answers[key] = list(policy.place(ctx).gpus)
                            except TimeoutError:
                                answers[key] = None
                            finally:
                                signal.setitimer(signal.ITIMER_REAL, 0)
    return answers


def answers_of(code: Path, argv: list[str]) -> dict[str, list[int] | None]:
    """The decisions of the gpualloc in ``code``, made in a process of their own."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    done = subprocess.run(
        [sys.executable, __file__, "--emit", *argv],
        env=env, capture_output=True, text=True, check=True, cwd=code,
    )  # fmt: skip
    emitted = json.loads(done.stdout)
    if not Path(emitted["gpualloc"]).is_relative_to(code):
        sys.exit(f"error: the gpualloc imported for {code} was {emitted['gpualloc']}")
    return emitted["answers"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", type=Path, help="a checkout of the other version")
    parser.add_argument("--policy", action="append", help="repeatable; default: every policy")
    parser.add_argument("--host", action="append", help="repeatable; default: up to 16 GPUs")
    parser.add_argument("--pattern", action="append", help="repeatable; default: every pattern")
    parser.add_argument("--busy-sets", type=int, default=12)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cap-s", type=float, default=3.0)
    parser.add_argument("--emit", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.emit:
        import gpualloc

        json.dump({"gpualloc": gpualloc.__file__, "answers": decide_all(args)}, sys.stdout)
        return
    if args.against is None:
        parser.error("--against DIR is required (a checkout of the other version)")
    argv = [f"--busy-sets={args.busy_sets}", f"--seed={args.seed}", f"--cap-s={args.cap_s}"]
    for option, values in (("--policy", args.policy), ("--host", args.host),
                           ("--pattern", args.pattern)):  # fmt: skip
        argv += [f"{option}={value}" for value in values or ()]
    here, there = answers_of(ROOT, argv), answers_of(args.against.resolve(), argv)
    compared = skipped = 0
    differences = []
    for key, answer in here.items():
        other = there.get(key)
        if answer is None or other is None:
            skipped += 1
            continue
        compared += 1
        if answer != other:
            differences.append(f"{key}: {other} -> {answer}")
    for line in differences:
        print(line)
    print(
        f"{compared} decisions compared, {len(differences)} different, "
        f"{skipped} skipped (past {args.cap_s:g} s in either version)"
    )
    sys.exit(1 if differences else 0)


if __name__ == "__main__":
    main()
