"""gpualloc's command line as the tests run it: in this process through the real entry point
(:func:`run_in_process`, what the ``cli`` fixture of conftest.py calls), or in a process of its
own (:func:`gpualloc`, :func:`in_subprocess`) on a bundled topology, with its state directory the
test's (conftest.py's autouse fixture sets ``GPUALLOC_STATE_DIR``)."""

from __future__ import annotations

import contextlib
import io
import json
import shlex
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass

TIMEOUT_S = 120
"""The longest a command the tests start in a process of its own may take."""


@dataclass
class Result:
    exit_code: int
    stdout: str
    stderr: str


def run_in_process(args: Iterable[str]) -> Result:
    """Run ``gpualloc ARGS`` in this process through the real entry point: its exit status and
    what it wrote (the ``cli`` fixture, and the fuzzing harness under its own alarm)."""
    from gpualloc.cli.main import run

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            run(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        else:
            raise AssertionError("run() returned instead of exiting")
    return Result(code, out.getvalue(), err.getvalue())


def in_subprocess(*args: str, timeout: float = 60) -> Result:
    """``gpualloc ARGS`` in a process of its own: for a command that may exec a job (in this
    process it would replace pytest) or must be timed."""
    done = subprocess.run(
        [sys.executable, "-m", "gpualloc", *args],
        capture_output=True, text=True, check=False, timeout=timeout, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    return Result(done.returncode, done.stdout, done.stderr)


def gpualloc_argv(*args: str, topology: str = "dgx1-v100") -> list[str]:
    return [sys.executable, "-m", "gpualloc", "--topology", topology, *args]


def gpualloc(*args: str, topology: str = "dgx1-v100", **options) -> subprocess.CompletedProcess:
    return subprocess.run(
        gpualloc_argv(*args, topology=topology),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        **options,
    )


def status(topology: str = "dgx1-v100") -> dict:
    result = gpualloc("status", "--json", topology=topology)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def shlex_join(argv: list[str]) -> str:
    """``argv`` as one shell command line: each word quoted but ``$$``, which must reach the
    shell unquoted (the shell's pid, for ``alloc --pid $$``)."""
    return " ".join(word if word == "$$" else shlex.quote(word) for word in argv)
