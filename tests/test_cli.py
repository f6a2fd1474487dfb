"""The command line, through the real entry point (in-process) and as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from gpualloc import __version__
from gpualloc.errors import ExitCode
from tests.conftest import RECORDED, Result, recorded

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
    from tests.test_user_files import WRITTEN_OR_DIRECTORIES

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
    """Help pages are fixed texts: not even typer or msgspec for them."""
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


@pytest.mark.parametrize(
    "args", [["--help"], ["-h"], [], ["run", "--help"], ["topo"], ["slurm", "prolog", "-h"]]
)
def test_help_pages_are_typers_own(args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The fixed pages answer without typer, and say exactly what typer says."""
    from gpualloc.cli import main
    from tests.conftest import run_in_process

    typer_path = main._run_typer
    monkeypatch.setenv("COLUMNS", "120")
    monkeypatch.setattr(main, "_run_typer", lambda args: pytest.fail("typer was asked"))
    static = run_in_process(args)
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr(main, "_run_typer", typer_path)
    monkeypatch.setattr(main, "_static_help", lambda args: False)
    assert static == run_in_process(args)


def test_help_is_left_to_typer_where_a_page_would_not_be_exact(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpualloc.cli.static_help import page_for

    assert page_for(["run", "--help"]) is not None
    assert page_for(["-t", "dgx2", "run", "--help"]) is None  # an option typer reads first
    assert page_for(["run", "-n", "2", "--help"]) is None
    assert page_for(["nosuch", "--help"]) is None
    assert page_for(["run"]) is None  # a command given nothing: typer's usage error
    monkeypatch.setenv("COLUMNS", "60")
    assert page_for(["--help"]) is None  # click wraps narrower than the pages


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
    range>' or '<list[str]>' placeholders in any help page."""
    import re

    from gpualloc.cli.static_help import render_pages

    placeholders = {
        path or "gpualloc": re.findall(r"<(?:str|int|float|bool|path|list)[^>]*>", page["text"])
        for path, page in render_pages().items()
    }
    assert {path: found for path, found in placeholders.items() if found} == {}


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
    """Typer's 'Usage: / Try / Error:' block, with pydantic's wording, is
    gpualloc's two lines (exit 2), the hint giving the usage and where the help is."""
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
