"""The help pages and the entry points: ``--help`` and ``-h`` of every command and group,
rendered from the declarations (importing nothing heavy), ``--version``, ``python -m gpualloc``
and the console script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable

import pytest

from gpualloc import __version__
from gpualloc.errors import ExitCode
from tests.cli_harness import Result

Cli = Callable[..., Result]


def test_version(cli: Cli) -> None:
    result = cli("--version")
    assert (result.exit_code, result.stdout) == (0, f"gpualloc {__version__}\n")


def _run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env={**os.environ, **env},
        check=False, timeout=60,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("args", [["--help"], ["run", "--help"], ["topo", "show", "-h"]])
def test_help_imports_nothing_heavy(args: list[str]) -> None:
    """A help page is rendered from the declarations: no msgspec, no discovery, no rich."""
    probe = (
        "import sys, json\n"
        "from gpualloc.cli.main import run\n"
        f"try:\n    run({args!r})\nexcept SystemExit:\n    pass\n"
        "heavy = ['networkx', 'pynvml', 'psutil', 'pydantic', 'typer', 'msgspec', 'rich']\n"
        "sys.stderr.write(json.dumps([m for m in heavy if m in sys.modules]))\n"
    )
    result = _run("-c", probe, COLUMNS="100")
    assert "Usage: gpualloc" in result.stdout
    assert json.loads(result.stderr) == []


def _paths() -> list[tuple[str, object]]:
    """Every page: gpualloc's, each group's and each command's, with its declaration."""
    from gpualloc.cli.commands import COMMANDS, every_command, load
    from gpualloc.cli.declare import Group

    groups = [(e.name, load(e)) for e in COMMANDS if isinstance(load(e), Group)]
    return [("", None), *groups, *every_command()]


def test_every_help_page_shows_its_declarations(cli: Cli) -> None:
    """``--help`` and ``-h`` of every command and group: the usage line, the help text, each
    option's spellings with what it takes and its help, each command's summary; on stdout."""
    from gpualloc.cli.commands import COMMANDS, GLOBAL_OPTIONS
    from gpualloc.cli.declare import Command, Group
    from gpualloc.cli.help import clean

    for path, node in _paths():
        words = path.split()
        shown = cli(*words, "--help")
        assert (shown.exit_code, shown.stderr) == (0, ""), path
        assert cli(*words, "-h").stdout == shown.stdout, path
        text = " ".join(shown.stdout.split())
        assert shown.stdout.startswith(f"Usage: gpualloc {path} [OPTIONS]".replace("  ", " "))
        if isinstance(node, Command):
            options, below = node.options, []
            assert " ".join(clean(node.help).split()[:12]) in text, path
        elif isinstance(node, Group):
            options, below = (), [(c.name, c.summary) for c in node.commands]
        else:
            options, below = GLOBAL_OPTIONS, [(e.name, e.summary) for e in COMMANDS]
        for opt in options:
            spelled = ", ".join(sorted(opt.names, key=lambda name: name.startswith("--")))
            assert spelled in text, (path, opt.names)
            if opt.metavar:
                assert f"{spelled} {opt.metavar}" in text, (path, opt.names)
            assert " ".join(opt.help.split()[:6]) in text, (path, opt.names)
        for name, summary in below:
            assert f"{name} {summary}" in text, (path, name)


def test_gpualloc_and_a_group_given_nothing_show_their_help_on_stderr(cli: Cli) -> None:
    """As click did: the page, on stderr, exit 2 (nothing was run)."""
    for words in ([], ["topo"], ["slurm"], ["config"]):
        shown = cli(*words)
        assert shown.exit_code == ExitCode.USAGE and shown.stdout == "", words
        assert shown.stderr == cli(*words, "--help").stdout, words


def test_the_help_lists_every_variable_and_exit_code(cli: Cli) -> None:
    from gpualloc.config import SETTINGS

    text = cli("--help").stdout
    for setting in SETTINGS:
        if setting.variable:
            assert setting.variable in text, setting.variable
    for code in ExitCode:
        assert f"{int(code)} {code.name.lower().replace('_', '-')}" in text, code
    flat = " ".join(text.split())
    assert "[env var: GPUALLOC_TOPOLOGY]" in flat and "[env var: GPUALLOC_DEBUG]" in flat


@pytest.mark.slow
def test_module_entry_point_and_console_script() -> None:
    assert _run("-m", "gpualloc", "--version").stdout == f"gpualloc {__version__}\n"
    result = _run("-m", "gpualloc", "--topology", "dgx1-v100", "topo", "show")
    assert result.returncode == 0 and "NV2" in result.stdout


def test_help_names_values_not_python_types() -> None:
    """Every option that takes a value names it (N, LIST, POLICY, ...): no '<str>', '<int
    range>' or '<list[str]>' placeholders, nor argparse's upper-case parameter names."""
    import re

    from gpualloc.cli.declare import Command
    from gpualloc.cli.help import page

    for path, node in _paths():
        text = page(path, node)  # type: ignore[arg-type]
        assert not re.findall(r"<(?:str|int|float|bool|path|list)[^>]*>", text), path
        for opt in node.options if isinstance(node, Command) else ():
            assert opt.kind == "flag" or opt.metavar, (path, opt.names)
