"""The examples: listed in their README, current, and working on a bundled topology."""

from __future__ import annotations

import json
import os
import py_compile
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.child_processes import finish

ROOT = Path(__file__).parent.parent
EXAMPLES = ROOT / "examples"


def test_every_example_is_explained_in_the_readme() -> None:
    readme = (EXAMPLES / "README.md").read_text()
    for path in EXAMPLES.iterdir():
        if path.name != "README.md":
            assert f"`{path.name}" in readme, path.name


def test_the_custom_host_json_is_what_topo_import_makes_of_the_matrix(cli, tmp_path: Path) -> None:
    made = tmp_path / "made.json"
    source = EXAMPLES / "custom-host" / "topo.txt"
    name = "bridged-4gpu-workstation"
    assert cli("topo", "import", str(source), "--name", name, "-o", str(made)).exit_code == 0
    committed = json.loads((EXAMPLES / "custom-host" / f"{name}.json").read_text())
    fresh = json.loads(made.read_text())
    committed["provenance"].pop("origin"), fresh["provenance"].pop("origin")
    assert committed == fresh
    plan = cli("--topology", str(EXAMPLES / "custom-host" / f"{name}.json"), "plan", "-n", "2")
    assert "CUDA_VISIBLE_DEVICES=0,2" in plan.stdout  # the NVLink bridge, not the neighbour


def test_the_scripts_parse() -> None:
    for script in ("sweep.sh", "torchrun/run.sh", "slurm/gpualloc-hook.sh"):
        subprocess.run(["bash", "-n", str(EXAMPLES / script)], check=True, timeout=120)
        assert os.access(EXAMPLES / script, os.X_OK), script
    py_compile.compile(str(EXAMPLES / "torchrun" / "allreduce.py"), doraise=True)


def _sweep_environment(job: Path) -> dict[str, str]:
    """examples/sweep.sh on dgx1-v100, with ``job`` as its $TRAIN and this gpualloc first."""
    return {
        **os.environ,
        "GPUALLOC_TOPOLOGY": "dgx1-v100",
        "TRAIN": str(job),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }


@pytest.mark.slow
def test_the_sweep_runs_its_jobs_side_by_side_on_nvlinked_pairs(tmp_path: Path) -> None:
    from gpualloc.topologies import load_bundled

    job = tmp_path / "job.sh"
    job.write_text(
        "#!/bin/sh\n"  # called as: job.sh --lr VALUE
        f'echo "$CUDA_VISIBLE_DEVICES" > "{tmp_path}/lr-$2"\n'
        f'while [ ! -e "{tmp_path}/go" ]; do sleep 0.05; done\n'
    )
    job.chmod(0o755)
    env = _sweep_environment(job)
    sweep = subprocess.Popen(
        [str(EXAMPLES / "sweep.sh")], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        outputs = [tmp_path / f"lr-{lr}" for lr in ("1e-3", "3e-4", "1e-4", "3e-5")]
        deadline = time.monotonic() + 120
        while not all(p.exists() and p.read_text() for p in outputs):
            assert sweep.poll() is None, sweep.stderr.read().decode() if sweep.stderr else ""
            assert time.monotonic() < deadline, "the four jobs did not all start"
            time.sleep(0.05)
        pairs = [tuple(map(int, p.read_text().split(","))) for p in outputs]
    finally:
        (tmp_path / "go").touch()
        _, errors = finish(sweep, timeout_s=120)
    assert sweep.returncode == 0, errors
    assert sorted(g for pair in pairs for g in pair) == list(range(8))  # side by side
    topology = load_bundled("dgx1-v100")
    assert all(topology.link(a, b).nvlinks == 2 for a, b in pairs)  # each on a double NVLink


@pytest.mark.slow
def test_the_sweep_fails_when_one_of_its_jobs_fails(tmp_path: Path) -> None:
    """It exited 0 with every job failed (a bare ``wait`` returns 0)."""
    job = tmp_path / "job.sh"
    job.write_text('#!/bin/sh\ntest "$2" != 1e-4\n')  # called as: job.sh --lr VALUE
    job.chmod(0o755)
    env = _sweep_environment(job)
    sweep = subprocess.run(
        [str(EXAMPLES / "sweep.sh")], env=env, capture_output=True, text=True, timeout=120
    )
    assert sweep.returncode == 1
    assert "--lr 1e-4 failed (exit 1)" in sweep.stderr and "1 of 4 jobs failed" in sweep.stderr
