"""What ``run``, ``alloc`` and ``release`` import on the embedded ledger (issue 43, point 3).

Their start-up budget is 40 ms over ``python -c pass`` (``benchmarks/bench_startup.py`` times
it from a wheel; nothing is timed here: shared machines make timed tests flaky). These tests pin
instead what the three commands import, in the benchmark's setting (a bundled topology, a
broker named but not running) and without a broker named: none of the modules below, whichever
module of gpualloc happens to import msgspec first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

NOT_ON_THE_PATH = (
    # typer's world, the broker's client, discovery's libraries
    "typer", "click", "pydantic", "rich", "networkx", "psutil", "pynvml", "socket",
    "gpualloc.wire.client", "gpualloc.cli.static_help",
    # the standard library the issue names, and what msgspec pulls in unless told not to
    "shutil", "hashlib", "platform", "typing_extensions", "inspect", "tokenize", "dis",
)  # fmt: skip

PROBE = """
import json, os, sys
def no_exec(*args, **kwargs):  # run: stop where the job would replace gpualloc
    raise SystemExit(0)
os.execvpe = no_exec
from gpualloc.cli.main import run
try:
    run(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
sys.stderr.write("\\n" + json.dumps([code, sorted(sys.modules)]) + "\\n")
"""


def _imported(args: list[str], env: dict[str, str]) -> tuple[int, set[str]]:
    """The exit status of ``gpualloc ARGS`` and every module it imported."""
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        capture_output=True, text=True, env=env, check=False, timeout=60,
    )  # fmt: skip
    code, modules = json.loads(result.stderr.splitlines()[-1])
    return code, set(modules)


@pytest.mark.slow
@pytest.mark.parametrize("broker", ["named", "none"])
def test_run_alloc_and_release_import_only_what_they_need(tmp_path: Path, broker: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUALLOC_")}
    env.update(
        GPUALLOC_STATE_DIR=str(tmp_path / "state"),
        GPUALLOC_TOPOLOGY="dgx1-v100",
        GPUALLOC_CACHE_DIR=str(tmp_path / "cache"),
        XDG_CONFIG_HOME=str(tmp_path / "config"),
    )
    if broker == "named":  # as bench_startup.py: a named socket nobody listens on
        env["GPUALLOC_BROKER"] = str(tmp_path / "no-broker.sock")
    for args in (
        ["run", "-n", "1", "--", "true"],
        ["alloc", "--hold", "-n", "1", "--format", "env"],
        ["release", "--mine"],
    ):
        code, modules = _imported(args, env)
        assert code == 0, args
        assert sorted(modules.intersection(NOT_ON_THE_PATH)) == [], args
