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
    "gpualloc.wire.client",
    # what only a help page, a usage error or the shell's scripts need
    "gpualloc.cli.help", "gpualloc.cli.manpage", "gpualloc.cli.completion_scripts", "difflib",
    # the standard library the issue names, and what msgspec pulls in unless told not to
    "shutil", "hashlib", "platform", "typing_extensions", "inspect", "tokenize", "dis",
    "textwrap",  # msgspec's JSON Schema (gpualloc.lean_msgspec: loaded when first used)
    "urllib.parse", "ipaddress",  # pathlib's Path.as_uri (gpualloc.lean_stdlib)
    # what only this host's GPUs, a Slurm job, a verifier or an eviction need
    "threading", "csv", "glob", "gpualloc.discovery.live", "gpualloc.discovery.health",
    "gpualloc.discovery.xid", "gpualloc.slurm.job", "gpualloc.launcher.verify",
    "gpualloc.host.eviction",
)  # fmt: skip

PROBE = """
import sys
at_start = set(sys.modules)  # an editable install's finder loads pathlib and glob, say
import json, os
def no_exec(*args, **kwargs):  # run: stop where the job would replace gpualloc
    raise SystemExit(0)
os.execvpe = no_exec
from gpualloc.cli.main import run
try:
    run(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
sys.stderr.write("\\n" + json.dumps([code, sorted(set(sys.modules) - at_start)]) + "\\n")
"""


def _imported(args: list[str], env: dict[str, str]) -> tuple[int, set[str]]:
    """The exit status of ``gpualloc ARGS`` and every module it imported (beyond those the
    interpreter had loaded at start-up)."""
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
    assert _imported(["alloc", "--hold", "-n", "2"], env)[0] == 0  # a ledger, as bench_startup
    for args in (
        ["run", "-n", "1", "--", "true"],
        ["alloc", "--hold", "-n", "1", "--format", "env"],
        ["release", "--mine"],
    ):
        code, modules = _imported(args, env)
        assert code == 0, args
        assert sorted(modules.intersection(NOT_ON_THE_PATH)) == [], args


@pytest.mark.slow
def test_the_lean_imports_leave_msgspec_and_pathlib_whole() -> None:
    """What gpualloc.lean_msgspec and gpualloc.lean_stdlib leave out loads when first used."""
    import msgspec

    import gpualloc

    # -S: no .pth file runs (an editable install's finder would load pathlib first)
    where = [str(Path(gpualloc.__file__).parent.parent), str(Path(msgspec.__file__).parent.parent)]
    probe = (
        f"import sys; sys.path[:0] = {where!r}\n"
        "assert 'pathlib' not in sys.modules and 'msgspec' not in sys.modules\n"
        "import gpualloc.lean_stdlib, gpualloc.lean_msgspec\n"
        "assert 'urllib.parse' not in sys.modules and 'textwrap' not in sys.modules\n"
        "import msgspec, pathlib\n"
        "class A(msgspec.Struct):\n    x: int\n"
        "assert pathlib.Path('/a b').as_uri() == 'file:///a%20b'\n"
        "import urllib.parse\n"
        "assert urllib.parse.urlparse('http://h/p').path == '/p'\n"
        "assert msgspec.json.schema(A)['$defs']['A']['required'] == ['x']\n"
        "assert msgspec.inspect.type_info(A).fields[0].name == 'x'\n"
        "from msgspec import inspect\n"
        "assert inspect.IntType is sys.modules['msgspec.inspect'].IntType\n"
        "print('whole')\n"
    )
    result = subprocess.run(
        [sys.executable, "-S", "-c", probe],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.stdout.strip() == "whole", result.stderr


def test_a_pathlib_that_takes_more_of_urllib_parse_gets_the_real_module() -> None:
    """The stand-in offers pathlib one function; a Python whose pathlib asks for another name
    got an ImportError from every command. Now it imports the real module, and keeps it."""
    code = """
import sys, types
import gpualloc.lean_stdlib as lean
for name in [m for m in sys.modules if m == "pathlib" or m.startswith("urllib")]:
    del sys.modules[name]
lean._urllib_parse_stand_in = lambda: types.ModuleType("urllib.parse")  # offers nothing
lean.import_pathlib_lean()
import pathlib, urllib.parse
assert sys.modules["urllib.parse"] is urllib.parse and hasattr(urllib.parse, "urlsplit")
print(pathlib.Path("/x").as_uri())
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120
    )
    assert done.returncode == 0 and done.stdout == "file:///x\n", done.stderr


def test_a_uuid_that_asks_platform_more_gets_msgspec_whole() -> None:
    """The platform stand-in answers ``system()`` alone; a Python whose uuid asks it more made
    every command fail as msgspec loaded. Now msgspec loads whole then."""
    code = """
import sys, types
for name in [m for m in sys.modules if m.split(".")[0] in ("msgspec", "uuid", "platform")]:
    del sys.modules[name]
import gpualloc.lean_msgspec as lean  # loads msgspec lean; now again with a poorer stand-in
for name in [m for m in sys.modules if m.split(".")[0] in ("msgspec", "uuid", "platform")]:
    del sys.modules[name]
lean._platform_stand_in = lambda: types.ModuleType("platform")  # no system()
lean.import_msgspec_lean()
import msgspec, platform
assert platform.system() and msgspec.json.decode(b"[1]") == [1]
assert "typing_extensions" not in sys.modules or sys.modules["typing_extensions"] is not None
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120
    )
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr
