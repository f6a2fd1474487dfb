"""What each command imports (the start-up budgets are ``benchmarks/bench_startup.py``'s).

``run``, ``alloc`` and ``release`` on the embedded ledger have the tightest budget: 40 ms over
``python -c pass``, timed from a wheel by ``benchmarks/bench_startup.py`` (nothing is timed
here: shared machines make timed tests flaky). These tests pin instead what each command
imports, in the benchmark's setting (a bundled topology, a broker named but not running) and
without a broker named, and through a running broker (``run`` and ``alloc`` load no msgspec,
``release`` no placement engine): nothing is kept out by standing in for a module (no
``sys.modules`` patching), only by not importing it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker_harness import RunningBroker, clean_env, running_broker

NOT_ON_ANY_PATH = (
    # a second parser, and what only a terminal or discovery needs
    "typer", "click", "pydantic", "rich", "networkx", "psutil", "pynvml",
    # what only a help page, a usage error or a shell's script needs: the parser is argparse,
    # built for the one command run
    "gpualloc.cli.help", "gpualloc.cli.manpage", "gpualloc.cli.completion_scripts",
    "gpualloc.cli.shell", "difflib", "shutil",
    # the standard library modules no command's path needs
    "hashlib", "inspect", "tokenize", "dis",
)  # fmt: skip
NOT_ON_THE_PATH = (
    *NOT_ON_ANY_PATH,
    # the broker's client (no broker answers here), the other commands' declarations
    "socket", "gpualloc.wire.client", "gpualloc.cli.plan", "gpualloc.cli.status",
    "gpualloc.cli.simulate", "gpualloc.cli.topo", "gpualloc.cli.doctor", "gpualloc.cli.slurm",
    # what only this host's GPUs, a Slurm job, a verifier or an eviction need
    "threading", "csv", "glob", "gpualloc.discovery.live", "gpualloc.discovery.health",
    "gpualloc.discovery.xid", "gpualloc.slurm.job", "gpualloc.launcher.verify",
    "gpualloc.host.eviction",
    # msgspec prefers it where it is installed (typer brought it): gpualloc never asks for it
    *(("typing_extensions",) if importlib.util.find_spec("typing_extensions") is None else ()),
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


def _environment(tmp_path: Path) -> dict[str, str]:
    """bench_startup.py's setting: a bundled topology, this test's own state and caches."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUALLOC_")}
    env.update(
        GPUALLOC_STATE_DIR=str(tmp_path / "state"),
        GPUALLOC_TOPOLOGY="dgx1-v100",
        GPUALLOC_CACHE_DIR=str(tmp_path / "cache"),
        XDG_CONFIG_HOME=str(tmp_path / "config"),
    )
    return env


@pytest.mark.slow
@pytest.mark.parametrize("broker", ["named", "none"])
def test_run_alloc_and_release_import_only_what_they_need(tmp_path: Path, broker: str) -> None:
    env = _environment(tmp_path)
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
@pytest.mark.parametrize(
    ("args", "also_not"),
    [
        (["status"], ()),
        (["plan", "-n", "2"], ()),
        (["topo", "show"], ()),
        (["gc"], ()),
        (["config", "show"], ()),
        (["doctor"], ()),
        (["metrics"], ()),
        (["slurm", "gres-conf"], ()),
        (["--version"], ("msgspec", "gpualloc.cli.run", "gpualloc.cli.status")),
        (["--help"], ("msgspec", "gpualloc.cli.run")),
        (["run", "--help"], ("msgspec", "gpualloc.cli.jobs", "gpualloc.cli.status")),
    ],
    ids=" ".join,
)
def test_every_other_command_imports_no_second_parser_nor_rich_in_a_pipe(
    tmp_path: Path, args: list[str], also_not: tuple[str, ...]
) -> None:
    """rich draws tables on a terminal only; a help page is the declarations' alone; no
    command imports the modules of the others it does not run."""
    env = _environment(tmp_path)
    code, modules = _imported(args, env)
    assert code == 0, args
    heavy = [
        m
        for m in NOT_ON_ANY_PATH
        if not ("--help" in args and m in ("gpualloc.cli.help", "shutil"))
    ]
    assert sorted(modules.intersection([*heavy, *also_not])) == [], args


def test_no_module_stands_in_for_another() -> None:
    """Stand-ins for typing_extensions, platform and urllib.parse were put into sys.modules
    while msgspec and pathlib imported, in any program that imported gpualloc.model first (a
    library user's too): what must not load on a path is now simply not imported there."""
    import re

    import gpualloc

    root = Path(gpualloc.__file__).parent
    writes = re.compile(
        r"sys\.modules\[[^]]+\]\s*=|sys\.modules\.(setdefault|update|pop)\(|del sys\.modules"
    )
    found = [
        f"{path.relative_to(root)}:{number}"
        for path in sorted(root.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if writes.search(line)
    ]
    assert found == []


# ---- through a running broker ------------------------------------------------------------------


@pytest.fixture
def broker() -> Iterator[RunningBroker]:
    yield from running_broker("nvlink-pairs-4gpu")


IMPORTS = """
import os, sys
import gpualloc.launcher.exec as launch
def exec_job(argv, environment, binding):  # stands in for the exec, which would end the process
    raise SystemExit(0)
launch.exec_job = exec_job
sys.argv = ["gpualloc", *sys.argv[1:]]
try:
    from gpualloc.cli.main import run
    run()
except SystemExit:
    pass
finally:
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("typer", "rich", "networkx"))
    models = ("gpualloc.placement", "gpualloc.discovery")
    if sys.argv[1] != "release":  # release reads the leases it gave back, in the ledger's types
        models += ("gpualloc.model.topology", "gpualloc.ledger")
        heavy += sorted(m for m in sys.modules if m.split(".")[0] == "msgspec")
        heavy += ["gpualloc.model.job"] if "gpualloc.model.job" in sys.modules else []
    light = ("gpualloc.ledger", "gpualloc.ledger.liveness")  # an alloc's owner: its /proc facts
    heavy += sorted(m for m in sys.modules if m.startswith(models) and m not in light)
    os.write(2, ("IMPORTED " + " ".join(heavy) + "\\n").encode())
"""


@pytest.mark.parametrize(
    "args",
    [["alloc", "--hold", "-n", "2"], ["release", "--mine"], ["run", "-n", "1", "--", "true"]],
    ids=["alloc", "release", "run"],
)
def test_through_the_broker_run_and_alloc_load_no_msgspec_and_release_no_engine(
    broker: RunningBroker, args: list[str]
) -> None:
    env = {**clean_env(), "GPUALLOC_BROKER": str(broker.socket)}
    result = subprocess.run(
        [sys.executable, "-c", IMPORTS, *args], env=env, capture_output=True, text=True, timeout=60
    )
    assert "IMPORTED" in result.stderr, result.stderr
    imported = result.stderr.rsplit("IMPORTED", 1)[1].split()
    assert imported == [], imported
    assert result.returncode == 0, result.stderr
