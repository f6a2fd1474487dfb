"""Shell completion and the manual page: generated from the app, current, fast, and working."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
BUILDER = ROOT / "scripts" / "build_docs.py"
HEAVY = ("networkx", "pynvml", "psutil")


def _builder():
    spec = importlib.util.spec_from_file_location("build_docs", BUILDER)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_completions_and_man_page_are_current() -> None:
    for relative, text in _builder().build_all().items():
        assert (ROOT / relative).read_text() == text, (
            f"{relative} is stale: run python scripts/build_docs.py"
        )


def test_the_man_page_documents_every_command_and_option() -> None:
    import typer

    from gpualloc.cli.app import app

    page = (ROOT / "man" / "gpualloc.1").read_text()
    for section in ("NAME", "SYNOPSIS", "DESCRIPTION", "COMMANDS", "OPTIONS", "ENVIRONMENT",
                    "EXIT STATUS", "FILES", "EXAMPLES", "SEE ALSO"):  # fmt: skip
        assert f".SH {section}\n" in page, section
    root = typer.main.get_command(app)
    for group_name, group in root.commands.items():
        commands = getattr(group, "commands", {group_name: group})
        for name, command in commands.items():
            path = group_name if name == group_name else f"{group_name} {name}"
            assert f'.SS "gpualloc {path} [OPTIONS]'.replace("-", "\\-") in page, path
            for param in command.params:
                for option in param.opts if param.param_type_name == "option" else ():
                    assert option.replace("-", "\\-") in page, (path, option)
    assert "nvidia\\-smi(1), numactl(8)" in page


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("man") is None, reason="man is not installed")
def test_man_renders_the_page_without_warnings() -> None:
    result = subprocess.run(
        ["man", "--warnings", "-l", str(ROOT / "man" / "gpualloc.1")],
        capture_output=True,
        text=True,
        env={**os.environ, "MANWIDTH": "100", "MANPAGER": "cat", "PAGER": "cat"},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "EXIT STATUS" in result.stdout and "gpualloc run [OPTIONS]" in result.stdout
    assert result.stderr == ""


def _complete(words: str, state_dir: Path) -> tuple[list[str], list[str]]:
    """What bash completion offers after ``words``, and which heavy modules that imported."""
    probe = (
        "import sys, json\n"
        "from gpualloc.cli.main import run\n"
        "try:\n    run()\nexcept SystemExit:\n    pass\n"
        f"sys.stderr.write(json.dumps([m for m in {list(HEAVY)!r} if m in sys.modules]))\n"
    )
    env = {
        **os.environ,
        "_GPUALLOC_COMPLETE": "complete_bash",
        "COMP_WORDS": words,
        "COMP_CWORD": str(len(words.split(" ")) - 1),
        "GPUALLOC_STATE_DIR": str(state_dir),
    }
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=False,
        timeout=60,
    )  # fmt: skip
    return result.stdout.split(), json.loads(result.stderr)


@pytest.mark.slow
def test_completion_offers_names_and_imports_nothing_heavy(cli, tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert cli("--topology", "dgx1-v100", "alloc", "--hold", "-n", "2").exit_code == 0
    lease = json.loads(cli("--topology", "dgx1-v100", "status", "--json").stdout)["leases"][0]

    offered, heavy = _complete("gpualloc --topology dgx", state)
    assert offered == ["dgx-a100", "dgx-a100-mig", "dgx1-p100", "dgx1-v100", "dgx2"] and heavy == []
    offered, heavy = _complete("gpualloc plan --policy mapa", state)
    assert offered == ["mapa", "mapa-greedy"] and heavy == []
    offered, heavy = _complete("gpualloc release ", state)
    assert offered == [lease["id"]] and heavy == []
    os.mkfifo(state / "ledger@planted.json")  # another user's FIFO must not hang the shell
    offered, heavy = _complete("gpualloc release ", state)
    assert offered == [lease["id"]] and heavy == []
    offered, heavy = _complete("gpualloc s", state)
    assert offered == ["status", "simulate", "slurm"] and heavy == []
    offered, _ = _complete("gpualloc run --numa ", state)
    assert offered == ["auto", "bind", "none"]


@pytest.mark.slow
def test_install_completion_writes_the_shells_file(tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path), "SHELL": "/bin/bash"}
    result = subprocess.run(
        [sys.executable, "-m", "gpualloc", "--install-completion", "bash"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    installed = list(tmp_path.rglob("gpualloc*"))
    assert installed and "_GPUALLOC_COMPLETE=complete_bash" in installed[0].read_text()
    assert str(installed[0].name) in (tmp_path / ".bashrc").read_text()
