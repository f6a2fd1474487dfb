"""The command line, through the real entry point (in-process) and as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpualloc import __version__
from gpualloc.errors import ExitCode
from tests.cli_harness import Result
from tests.house_rules import refused
from tests.recordings import RECORDED, recorded

Cli = Callable[..., Result]


def test_version(cli: Cli) -> None:
    result = cli("--version")
    assert (result.exit_code, result.stdout) == (0, f"gpualloc {__version__}\n")


def test_a_mixed_hosts_headers_name_its_models(cli: Cli, tmp_path: Path) -> None:
    """b2653dd named the model only where every GPU was of one: '8 GPUs, PCIe only'."""
    from msgspec.structs import replace

    from gpualloc.topologies import load_bundled

    base = load_bundled("pcie-8gpu-2socket")
    names = ["NVIDIA A100-SXM4-40GB"] * 4 + ["NVIDIA L40S"] * 3 + [None]
    gpus = [replace(g, name=name) for g, name in zip(base.gpus, names, strict=True)]
    path = tmp_path / "mixed.json"
    path.write_text(replace(base, gpus=gpus).to_json())
    models = "4x NVIDIA A100-SXM4-40GB + 3x NVIDIA L40S + 1 unknown"
    shown = cli("--topology", str(path), "topo", "show")
    assert shown.stdout.splitlines()[0].startswith(f"pcie-8gpu-2socket: 8 GPUs ({models}), ")
    assert cli("--topology", str(path), "status").stdout.splitlines()[0].endswith(f"({models})")
    doctor = cli("--topology", str(path), "doctor")
    assert doctor.stdout.splitlines()[0] == f"gpualloc doctor: {models}"
    assert cli("--topology", "dgx1-v100", "doctor").stdout.splitlines()[0] == "gpualloc doctor"


def test_topo_show_renders_the_dgx1_v100_cube_mesh(cli: Cli) -> None:
    result = cli("--topology", "dgx1-v100", "topo", "show")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "dgx1-v100: 8 GPUs x Tesla V100-SXM2-32GB, NVLink (NV1/NV2), 2 NUMA nodes"
    links = lines.index("Links")
    assert lines[links + 2].split() == [
        "GPU0",
        "X",
        "NV1",
        "NV1",
        "NV2",
        "NV2",
        "SYS",
        "SYS",
        "SYS",
    ]
    assert lines[links + 9].split() == [
        "GPU7",
        "SYS",
        "SYS",
        "SYS",
        "NV1",
        "NV2",
        "NV1",
        "NV2",
        "X",
    ]
    pcie = lines.index("PCIe paths (also under NVLinked pairs)")
    assert lines[pcie + 2].split()[1:4] == ["X", "PIX", "PHB"]
    bandwidth = next(i for i, line in enumerate(lines) if line.startswith("Bandwidth"))
    assert lines[bandwidth + 2].split()[1:6] == ["X", "25.0", "25.0", "50.0", "50.0"]
    assert "NUMA nodes" in lines
    assert any(line.split()[:3] == ["1", "20-39,60-79", "256"] for line in lines)
    assert "\x1b[" not in result.stdout  # plain when not a terminal
    assert result.stderr == ""


@pytest.mark.parametrize("name", ["dgx2", "summit-node", "single-gpu", "nvlink-pairs-4gpu"])
def test_topo_show_every_shape(cli: Cli, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert cli("--topology", name, "topo", "show").exit_code == 0
    monkeypatch.setattr("gpualloc.cli.output.stdout_is_terminal", lambda: True)
    rich = cli("--topology", name, "topo", "show")
    assert rich.exit_code == 0 and "GPUs" in rich.stdout and "NUMA nodes" in rich.stdout


def test_topo_show_json_is_the_model(cli: Cli) -> None:
    result = cli("--topology", "hgx-h100", "topo", "show", "--json")
    data = json.loads(result.stdout)
    assert len(data["gpus"]) == 8
    assert data["links"][0] == data["links"][0] | {
        "a": 0, "b": 1, "kind": "NV18", "nvlinks": 18, "nvswitch": True, "bandwidth_gbps": 450.0
    }  # fmt: skip


def test_topology_from_the_environment(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUALLOC_TOPOLOGY", "minsky-p100")
    assert json.loads(cli("topo", "show", "--json").stdout)["name"] == "minsky-p100"


def test_topology_from_a_raw_text_file(cli: Cli) -> None:
    path = RECORDED / "ibm-ac922_4gpu_power9_topo.txt"
    result = cli("--topology", str(path), "topo", "show", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["links"][0]["kind"] == "NV3"


def test_topo_list(cli: Cli) -> None:
    text = cli("topo", "list").stdout
    assert "dgx1-v100" in text and "torus-2d-16" in text
    data = json.loads(cli("topo", "list", "--json").stdout)
    by_name = {entry["name"]: entry for entry in data}
    assert by_name["dgx2"]["gpus"] == 16
    assert [entry["name"] for entry in data] == sorted(by_name)


def test_topo_import_with_companions_to_a_file(cli: Cli, tmp_path: Path) -> None:
    out = tmp_path / "v100.json"
    result = cli(
        "topo", "import", str(RECORDED / "dgx1-v100_vast_topo.txt"),
        "--nvlink", str(RECORDED / "nvlink_status_v100-sxm2-8gpu_vast.txt"),
        "--numa", str(RECORDED / "numactl_2socket_x86_delos.txt"),
        "-o", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "" and f"wrote {out} (8 GPUs)" in result.stderr
    shown = cli("--topology", str(out), "topo", "show", "--json")
    data = json.loads(shown.stdout)
    assert data["gpus"][0]["name"] == "Tesla V100-SXM2-32GB"
    assert data["numa_nodes"][0]["memory_total_bytes"] == 772696 * 1024**2


def test_topo_import_from_stdin(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO(recorded("2x-rtx5090_threadripper_phb_topo.txt")))
    data = json.loads(cli("topo", "import", "-", "--json", "--name", "tr").stdout)
    assert data["name"] == "tr" and data["links"][0]["kind"] == "PHB"


def test_topo_record_of_a_named_topology(cli: Cli, tmp_path: Path) -> None:
    out = tmp_path / "host.json"
    assert cli("--topology", "dgx-a100", "topo", "record", "-o", str(out)).exit_code == 0
    assert json.loads(out.read_text())["gpus"][0]["numa_node"] == 3


def test_bandwidth_table_option(cli: Cli, tmp_path: Path) -> None:
    table = tmp_path / "table.json"
    table.write_text('{"nvlink_link_gbps": {"2": 30}}')
    data = json.loads(
        cli(
            "--bandwidth-table", str(table), "--topology", "dgx1-v100", "topo", "show", "--json"
        ).stdout
    )
    assert data["links"][2]["bandwidth_gbps"] == 60.0


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--topology", "dgx1v100", "topo", "show"], ExitCode.TOPOLOGY_NOT_FOUND, "dgx1-v100"),
        (
            ["--topology", "/nope.json", "topo", "show"],
            ExitCode.TOPOLOGY_NOT_FOUND,
            "does not exist",
        ),
        (
            ["topo", "import", str(RECORDED / "hgx-h100_12nic_numa-off_MALFORMED-paste_topo.txt")],
            ExitCode.TOPOLOGY_PARSE,
            "PIXNODE",
        ),
        (["topo", "import", "/nope.txt"], ExitCode.IO, "does not exist"),
        (["--bandwidth-table", "/nope", "topo", "list"], ExitCode.IO, "does not exist"),
        (["topo", "frobnicate"], ExitCode.USAGE, "error: no such command 'frobnicate'"),
    ],
)
def test_errors_are_one_line_with_an_exit_code(
    cli: Cli, args: list[str], code: int, message: str
) -> None:
    result = cli(*args)
    assert result.exit_code == code
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_no_gpu_and_no_topology(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    import pynvml

    from gpualloc.discovery import nvml
    from tests.fake_nvml import FakeNvml

    fake = FakeNvml([], {})
    fake.init_error = pynvml.NVMLError_LibraryNotFound()
    monkeypatch.setattr(nvml, "load_pynvml", lambda: fake)
    monkeypatch.setenv("PATH", "/nonexistent")
    result = cli("topo", "show")
    assert result.exit_code == ExitCode.NO_GPU
    lines = result.stderr.splitlines()
    assert lines[0].startswith("error: no NVIDIA GPU found")
    assert (
        lines[1]
        == "hint: try a bundled topology: --topology dgx1-v100 (gpualloc topo list shows them all)"
    )


def test_debug_shows_the_traceback(cli: Cli) -> None:
    result = cli("--debug", "--topology", "/etc/hostname", "topo", "show")
    assert result.exit_code == ExitCode.TOPOLOGY_PARSE
    assert "Traceback" in result.stderr


def test_unwritable_output_is_an_io_error(cli: Cli, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = cli("--topology", "single-gpu", "topo", "record", "-o", str(blocker / "x.json"))
    assert result.exit_code == ExitCode.IO and "cannot write" in result.stderr


WRITERS = {
    "topo record --output": ["topo", "record", "-o", "{out}"],
    "topo export --output": ["topo", "export", "-o", "{out}"],
    "topo import --output": [
        "topo",
        "import",
        str(RECORDED / "dgx1-v100_vast_topo.txt"),
        "-o",
        "{out}",
    ],
    "simulate --save-trace": ["simulate", "--generate", "mapa:jobs=3", "--save-trace", "{out}"],
    "simulate --report": ["simulate", "--generate", "mapa:jobs=3", "--report", "{out}"],
    "simulate --plot": ["simulate", "--generate", "mapa:jobs=3", "--plot", "{out}"],
}
"""Every option that writes a file (or, --plot, a directory) a user named."""


def test_the_writers_are_every_output_option() -> None:
    from tests.path_options import WRITTEN_OR_DIRECTORIES

    assert set(WRITERS) == WRITTEN_OR_DIRECTORIES - {"serve --state-dir"}


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.extra("plot")) if "--plot" in n else n for n in WRITERS],
)
def test_output_into_a_missing_directory_is_refused_and_makes_none(
    cli: Cli, tmp_path: Path, name: str
) -> None:
    """Some writers made the missing directories (``-o /resluts/x.json`` made ``/resluts`` at
    the root of the file system), others refused: now every one refuses, naming the first
    missing directory, before any work."""
    out = tmp_path / "no" / "such" / "out.json"
    args = [str(out) if arg == "{out}" else arg for arg in WRITERS[name]]
    result = cli("--topology", "dgx1-v100", *args)
    assert result.exit_code == ExitCode.IO, result.stderr
    option = "-o" if "--output" in name else name.split()[-1]
    assert result.stderr == (
        f"error: cannot write {option} {out}: the directory {tmp_path / 'no'} does not exist\n"
        f"hint: create it first (mkdir -p {out.parent}), or give another path\n"
    )
    assert result.stdout == "" and not (tmp_path / "no").exists()


def test_a_count_of_one_is_singular(cli: Cli, tmp_path: Path) -> None:
    """Counts were written by hand: "wrote host.json (1 GPUs)", "1 lease(s)", "-n 2 but --gpus
    names 1 GPU(s)", "passed over 1 times"."""
    out = tmp_path / "one.json"
    one = ("--topology", "single-gpu")
    assert cli(*one, "topo", "record", "-o", str(out)).stderr == f"wrote {out} (1 GPU)\n"
    assert cli(*one, "alloc", "--hold").exit_code == 0
    assert "0 of 1 GPU free; 1 lease, 0 waiting" in cli(*one, "status").stdout
    refused = cli("--topology", "dgx1-v100", "alloc", "-n", "2", "--gpus", "0")
    assert "-n 2 but --gpus names 1 GPU" in refused.stderr and "GPU(s)" not in refused.stderr
    busy = cli(*one, "alloc", "-n", "2")
    assert "the job asks for 2 GPUs but 1 of 1 GPU is usable" in busy.stderr, busy.stderr


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


@pytest.mark.slow
def test_quiet_on_closed_pipe() -> None:
    # `true` exits at once, long before Python has started, so every write meets a closed pipe.
    script = (
        f"{sys.executable} -m gpualloc --topology dgx2 topo show --json | true; "
        "echo ${PIPESTATUS[0]}"
    )
    result = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, check=False, timeout=120
    )
    assert result.stderr == ""
    assert result.stdout.strip() == str(int(ExitCode.BROKEN_PIPE))


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


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["run", "-n", "0", "--", "true"],
            "invalid value for '-n' / '--num-gpus': must be at least 1",
        ),
        (
            ["run", "--min-utility", "5", "--", "true"],
            "invalid value for '--min-utility': must be at most 1",
        ),
        (
            ["run", "--share", "--sm-share", "200", "--", "true"],
            "invalid value for '--sm-share': must be at most 100",
        ),
        (["alloc", "--pid", "abc"], "invalid value for '--pid': must be a whole number"),
        (["run"], "missing argument '-- COMMAND [ARGS]...'"),
        (["status", "--bogus"], "no such option: --bogus"),
    ],
)
def test_usage_errors_are_an_error_and_a_hint_line(cli: Cli, args: list[str], message: str) -> None:
    """A usage error is gpualloc's two lines (exit 2): the error in gpualloc's words (not
    argparse's, nor pydantic's as typer gave them), and the usage with where the help is."""
    result = cli("--topology", "dgx1-v100", *args)
    assert result.exit_code == ExitCode.USAGE
    error, hint = result.stderr.splitlines()
    assert error == f"error: {message}"
    command = args[0]
    assert hint.startswith(f"hint: gpualloc {command} [OPTIONS]")
    assert hint.endswith(f"('gpualloc {command} --help' explains)")
    assert "Input should" not in result.stderr


@pytest.mark.parametrize(
    ("args", "hint"),
    [
        (("run", "--topology", "dgx1-v100", "-n", "2", "--", "true"), "'gpualloc --topology ..."),
        (("topo", "show", "-t", "dgx2"), "'gpualloc -t ... topo show ...'"),
        (("status", "--debug"), "'gpualloc --debug status ...'"),
    ],
)
def test_a_global_option_after_the_command_says_where_it_goes(cli, args, hint) -> None:
    """It said 'no such option: --topology (Possible options: --policy)' and a usage line."""
    result = cli(*args)
    assert result.exit_code == 2
    assert "Possible options" not in result.stderr
    assert f"hint: {args[args.index(hint.split()[1])]} is a global option" in result.stderr
    assert hint in result.stderr


# ---- the grammar: what a command line means --------------------------------------------------


def _read(*args: str) -> tuple[dict, str, dict]:
    """The global options, the command's path and its parameters for ``gpualloc ARGS``."""
    from gpualloc.cli import parser

    options, words = parser.parse_globals(list(args))
    invocation = parser.parse_command(words)
    return options, invocation.path, invocation.values


@pytest.mark.parametrize(
    ("args", "path", "expected"),
    [
        (["run", "--", "true"], "run", {"command": ["true"], "count": None, "pattern": "ring"}),
        (["run", "true"], "run", {"command": ["true"]}),
        (
            ["run", "-n", "2", "--sensitive", "--", "python", "train.py", "-n", "3"],
            "run",
            {"count": 2, "sensitive": True, "command": ["python", "train.py", "-n", "3"]},
        ),
        (
            ["run", "-n2", "python", "-u", "x.py"],
            "run",
            {"count": 2, "command": ["python", "-u", "x.py"]},
        ),
        (
            ["run", "--num-gpus=3", "--policy", "drb", "--min-utility", "0.5", "--", "a"],
            "run",
            {"count": 3, "policy": "drb", "min_utility": 0.5},
        ),
        (
            ["run", "-q", "--numa", "none", "--insensitive", "--sensitive", "--", "a", "--", "b"],
            "run",
            {"quiet": True, "numa": "none", "sensitive": True, "command": ["a", "--", "b"]},
        ),
        (["run", "-qn", "2", "--", "x"], "run", {"quiet": True, "count": 2}),
        (["run", "--name", "", "--", "x"], "run", {"name": ""}),
        (["run", "--", "-x"], "run", {"command": ["-x"]}),
        (["run", "--name=--", "--", "x"], "run", {"name": "--", "command": ["x"]}),
        (["run", "x", "--sensitive"], "run", {"command": ["x", "--sensitive"], "sensitive": None}),
        (
            ["alloc", "--pid", "1234", "--heed-foreign", "--ignore-foreign", "--score", "mapa"],
            "alloc",
            {"pid": 1234, "ignore_foreign": True, "score": "mapa", "output_format": "ids"},
        ),
        (["alloc", "--"], "alloc", {"hold": False}),
        (
            ["release", "abcd", "--json", "ef01"],
            "release",
            {"leases": ["abcd", "ef01"], "as_json": True},
        ),
        (["release"], "release", {"leases": None, "mine": False}),
        (["release", "--", "--mine"], "release", {"leases": ["--mine"], "mine": False}),
        (["status", "--interval=3", "--interval", "0.2"], "status", {"interval": 0.2}),
        (["status"], "status", {"interval": 2.0, "idle": None, "watch": False}),
        (
            ["doctor", "--measured", "a.txt", "--json", "--measured", "b.txt"],
            "doctor",
            {"measured": [Path("a.txt"), Path("b.txt")], "as_json": True},
        ),
        (["doctor"], "doctor", {"measured": None}),
        (
            ["doctor", "--measured=--", "--measured", "b.txt"],
            "doctor",
            {"measured": [Path("--"), Path("b.txt")]},
        ),
        (
            ["topo", "import", "--json", "--", "-odd-name.txt"],
            "topo import",
            {"topo_file": Path("-odd-name.txt")},
        ),
        (["topo", "import", "-"], "topo import", {"topo_file": Path("-")}),
        (
            ["topo", "record", "--output=", "--output", "x.json"],
            "topo record",
            {"output": Path("x.json")},
        ),
        (
            ["serve", "--socket", "/tmp/x", "--background", "--heed-foreign"],
            "serve",
            {"socket": "/tmp/x", "foreground": False, "ignore_foreign": False},
        ),
        (["serve"], "serve", {"foreground": True, "ignore_foreign": None}),
        (
            ["calibrate", "--from", "x", "--no-collectives", "--repeats", "2", "--from", "y"],
            "calibrate",
            {"from_files": [Path("x"), Path("y")], "collectives": False, "repeats": 2},
        ),
        (["slurm", "gres-conf", "--device-dir", ""], "slurm gres-conf", {"device_dir": ""}),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else None,
)
def test_a_command_line_means_what_the_grammar_says(
    args: list[str], path: str, expected: dict
) -> None:
    """``--opt value``, ``--opt=value``, ``-nVALUE``, short flags together, the last of a
    repeated option wins unless it repeats, ``--`` ends the options; for run the first word
    that is not an option starts the job's argv, which keeps its own options and ``--``."""
    _, read_path, values = _read(*args)
    assert read_path == path
    assert {key: values[key] for key in expected} == expected


def test_global_options_come_before_the_command_and_from_their_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    options, _, _ = _read("-t", "dgx1-v100", "--refresh", "--debug", "run", "--", "x")
    assert (options["topology"], options["refresh"], options["debug"]) == ("dgx1-v100", True, True)
    assert _read("--topology=dgx2", "alloc")[0]["topology"] == "dgx2"
    monkeypatch.setenv("GPUALLOC_TOPOLOGY", "hgx-h100")
    assert _read("alloc")[0]["topology"] == "hgx-h100"
    assert _read("-t", "dgx2", "alloc")[0]["topology"] == "dgx2"
    monkeypatch.setenv("GPUALLOC_TOPOLOGY", "")  # empty: not set at all
    assert _read("alloc")[0]["topology"] is None


@pytest.mark.parametrize(
    "args",
    [
        ["run", "-n", "x", "--", "x"],
        ["run", "--wait=1", "--", "x"],
        ["run", "--name"],
        ["alloc", "extra"],
        ["alloc", "--", "extra"],
        ["alloc", "-n"],
        ["-t"],
        ["--bogus", "run", "--", "x"],
        ["status", "--interval", "0.1"],
        ["status", "--interval", "nan"],
        ["status", "-wq"],
        ["topo", "--json", "show"],
        ["topo", "bogus"],
        ["topo", "import", "a", "b"],
        ["plan", "-n", "\u0663"],
        ["slurm", "gres-conf", "--threads-per-core", "0"],
        ["-t", "dgx1-v100"],
        ["topo", "--"],
        ["plan", "--mem=--"],
        ["run", "-n=--", "--", "x"],
    ],
    ids=" ".join,
)
def test_a_usage_error_is_exit_2_with_one_error_line(cli: Cli, args: list[str]) -> None:
    result = cli(*args)
    refused(result, ExitCode.USAGE, alone=True)
    assert "usage:" not in result.stderr and result.stdout == ""


@pytest.mark.parametrize("number", ["1e309", "-1e309"])
def test_a_number_past_a_double_is_not_called_infinite(cli: Cli, number: str) -> None:
    """float() reads 1e309 as inf: the error must not name a value the user never wrote
    (the option fuzzer's rule, tests/fuzz_harness.py)."""
    result = cli("--topology", "dgx1-v100", "simulate", f"--load={number}", "--generate", "mapa")
    assert result.exit_code == ExitCode.USAGE
    error = result.stderr.splitlines()[0]
    assert error == "error: invalid value for '--load': must be a number a double holds " + (
        "(at most 1.8e+308)"
    )


@pytest.mark.parametrize(
    ("args", "error", "hint"),
    [
        (["run", "--dry", "--", "x"], "no such option: --dry", "did you mean --dry-run?"),
        (["status", "--jsn"], "no such option: --jsn", "did you mean --json?"),
        (["stauts"], "no such command 'stauts'", "did you mean status?"),
        (["topo", "shwo"], "no such command 'shwo'", "did you mean show?"),
        (
            ["--json", "status"],
            "no such option: --json",
            "--json is an option of 'status': it goes after the command "
            "('gpualloc status --json ...')",
        ),
        (
            ["--output", "x", "topo", "record"],
            "no such option: --output",
            "--output is an option of 'topo record': it goes after the command "
            "('gpualloc topo record --output ...')",
        ),
        (
            ["status", "--version"],
            "no such option: --version",
            "--version is a global option: it goes before the command ('gpualloc --version')",
        ),
        (
            ["run", "-n"],
            "option '-n' requires an argument",
            "gpualloc run [OPTIONS] -- COMMAND [ARGS]... ('gpualloc run --help' explains)",
        ),
        (
            ["run", "--name", "-x", "--", "true"],
            "option '--name' requires an argument",
            "a value that starts with '-' follows '=': --name=-x",
        ),
    ],
)
def test_a_usage_error_hints_at_what_was_meant(
    cli: Cli, args: list[str], error: str, hint: str
) -> None:
    """Click said 'no such option: --dry (Possible options: ...)' in the error itself, nothing
    for an option of the command given before it, and 'gpualloc --help lists the commands' for
    a missing value: the hint now says what was meant."""
    result = cli(*args)
    assert result.exit_code == ExitCode.USAGE
    assert result.stderr == f"error: {error}\nhint: {hint}\n"


@pytest.mark.parametrize("value", ["maybe", "2"])
def test_a_debug_variable_that_is_neither_true_nor_false_is_a_usage_error(
    cli: Cli, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("GPUALLOC_DEBUG", value)
    result = cli("--topology", "dgx1-v100", "status")
    assert result.exit_code == ExitCode.USAGE
    assert result.stderr.startswith(
        f"error: invalid value for '--debug' (from GPUALLOC_DEBUG): '{value}'"
    )
    monkeypatch.setenv("GPUALLOC_DEBUG", "yes")
    assert cli("--topology", "dgx1-v100", "status").exit_code == 0


def test_each_command_function_takes_exactly_its_declared_parameters() -> None:
    """One declaration: a parameter the function takes but no option declares (or the other
    way round) fails here; run, alloc and release hand theirs to :mod:`gpualloc.cli.jobs`, whose
    work functions take exactly the command's own (the job's go in one JobOptions)."""
    import inspect

    from msgspec import structs

    from gpualloc.cli import jobs
    from gpualloc.cli.commands import every_command
    from gpualloc.model.job import JobOptions

    job_fields = {field.name for field in structs.fields(JobOptions)}
    work = {"run": jobs.run_job, "alloc": jobs.alloc_gpus, "release": jobs.release_gpus}
    for path, command in every_command():
        declared = {opt.dest for opt in command.options}
        declared |= {command.argument.dest} if command.argument else set()
        parameters = inspect.signature(work.get(path, command.run)).parameters
        named = {name for name, p in parameters.items() if p.kind is not p.VAR_KEYWORD}
        if path in work:
            assert named - {"job"} == declared - job_fields, path
            assert all(p.default is p.empty for p in parameters.values()), path
        elif any(p.kind is p.VAR_KEYWORD for p in parameters.values()):  # plan's **job
            assert named < declared, path
        else:
            assert named == declared, path


@pytest.mark.parametrize("option", ["-n", "--pid"])
def test_a_number_longer_than_python_reads_is_a_usage_error(cli: Cli, option: str) -> None:
    """int() refuses more than 4,300 digits: the parser said 'invalid <gpualloc.cli.parser.Reader
    object at 0x...> value', and the digits back."""
    digits = "9" * 5000
    command = ["run", "--dry-run", "-n", digits, "--", "true"] if option == "-n" else []
    result = cli("--topology", "dgx1-v100", *(command or ["alloc", "--pid", digits]))
    assert result.exit_code == ExitCode.USAGE
    error = result.stderr.splitlines()[0]
    assert error.endswith(
        f"': must be a whole number of at most {sys.get_int_max_str_digits()} digits"
    )
    assert "9" * 200 not in result.stderr and "object at" not in result.stderr


def _tokens() -> list[str]:
    from gpualloc.cli.commands import COMMANDS, GLOBAL_OPTIONS, every_command

    names = {n for _, c in every_command() for o in c.options for n in (*o.names, *o.negative)}
    names |= {n for o in GLOBAL_OPTIONS for n in o.names}
    words = [e.name for e in COMMANDS] + ["show", "import", "gres-conf", "prolog", "show"]
    return sorted(names) + words + [
        "--", "-", "-h", "--help", "0", "2", "-1", "1.5", "nan", "x", "", "ring", "3,1", "-n2",
        "--num-gpus=2", "--wait=1", "-qn", "--name=", "--name=--", "-wq", "--json=1", "-tdgx2",
        "--topology=dgx2", "--bogus", "-z", "9" * 5000, "\u0663",
    ]  # fmt: skip


TOKENS = _tokens()


def _read_or_refused(args: list[str]) -> None:
    """Every line is read, shown help for, or refused with one RequestError (exit 2): never
    another exception."""
    from gpualloc.cli import parser
    from gpualloc.errors import RequestError

    try:
        _, path, values = _read(*args)
    except parser.ShowHelp:
        pass
    except RequestError as refused:
        assert refused.exit_code == ExitCode.USAGE and "\n" not in refused.message, args
        assert len(refused.message) < 400 and "object at 0x" not in refused.message, args
    else:
        kinds = {"flag": (bool, type(None)), "int": int, "float": float, "str": str, "path": Path}
        for opt in _declaration(path).options:
            value = values[opt.dest]
            for each in value if opt.repeat and value is not None else [value]:
                assert each is None or isinstance(each, kinds[opt.kind]), (args, opt.dest, each)


def _declaration(path: str) -> Any:
    from gpualloc.cli.commands import every_command

    return next(command for where, command in every_command() if where == path)


@settings(max_examples=80, deadline=None)
@given(args=st.lists(st.sampled_from(TOKENS), min_size=1, max_size=8))
def test_generated_command_lines_are_read_or_refused_in_one_line(args: list[str]) -> None:
    _read_or_refused(args)


@pytest.mark.slow
@settings(max_examples=1500, deadline=None)
@given(args=st.lists(st.sampled_from(TOKENS), min_size=1, max_size=10))
def test_many_generated_command_lines_are_read_or_refused_in_one_line(args: list[str]) -> None:
    _read_or_refused(args)


def test_an_exit_status_a_command_returns_is_its_exit_status(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """doctor returns 17 when a check failed, with its findings on stdout."""
    from gpualloc.checkup import Finding

    problem = Finding("ledger", "-", "problem", "a planted problem")
    monkeypatch.setattr("gpualloc.cli.doctor._ledger_findings", lambda host: [problem])
    result = cli("-t", "dgx1-v100", "doctor", "--json")
    assert result.exit_code == ExitCode.CHECK_FAILED
    assert json.loads(result.stdout)["ok"] is False
