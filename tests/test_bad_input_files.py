"""Bad files answered well: topology files that contradict themselves or hold control
characters, tables and imports that are not what they say, and output that cannot be written
(a full device, a closed stdout, an input named as the output), each one ``error:`` line, at
most one ``hint:``, a documented exit code, no traceback and no input lost
(:func:`tests.house_rules.refused`)."""

from __future__ import annotations

import errno
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from gpualloc.atomic import write_user_output
from gpualloc.errors import ExitCode
from tests.cli_harness import Result
from tests.house_rules import no_control_characters, refused
from tests.recordings import RECORDED

Cli = Callable[..., Result]
ESC = "\x1b[31m"
TOPOLOGIES = Path(__file__).resolve().parent.parent / "gpualloc" / "topologies"


# ---- topology files --------------------------------------------------------------------------


def _topology_file(tmp_path: Path, cli: Cli, change: Callable[[dict], None]) -> Path:
    document = json.loads(cli("--topology", "dgx1-v100", "topo", "show", "--json").stdout)
    change(document)
    path = tmp_path / "topology.json"
    path.write_text(json.dumps(document))
    return path


def _no_gpus(document: dict) -> None:
    document.update(gpus=[], links=[], mig_instances=[], processes=[], faults=[], utilization=[])


def _gpu_on_numa_node_7(document: dict) -> None:
    document["gpus"][0]["numa_node"] = 7


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (_no_gpus, "a topology has at least one GPU"),
        (_gpu_on_numa_node_7, "GPU 0 is on NUMA node 7, which numa_nodes does not declare"),
    ],
)
def test_an_inconsistent_topology_file_is_exit_5(
    cli: Cli, tmp_path: Path, change: Callable[[dict], None], message: str
) -> None:
    path = _topology_file(tmp_path, cli, change)
    for args in (["topo", "show"], ["plan", "-n", "1"]):
        result = cli("--topology", str(path), *args)
        refused(result, 5)
        assert message in result.stderr


def test_topo_import_refuses_a_p2p_file_without_a_matrix(cli: Cli, tmp_path: Path) -> None:
    from tests.recordings import RECORDED

    p2p = tmp_path / "p2p.bin"
    p2p.write_bytes(bytes(range(256)) * 4)
    topo = RECORDED / "dgx1-v100_vast_topo.txt"
    result = cli("topo", "import", str(topo), "--p2p", str(p2p), "--json")
    refused(result, 4)
    assert "no 'nvidia-smi topo -p2p r' matrix" in result.stderr and result.stdout == ""


# ---- a file's texts reach no terminal raw, and no export -------------------------------------


@pytest.fixture
def hostile_topology(tmp_path: Path) -> Path:
    """dgx1-v100 with escape sequences in every text a file may give."""
    data = json.loads((TOPOLOGIES / "dgx1-v100.json").read_text())
    data["name"] = "evil" + ESC
    data["gpus"][0]["name"] = "V100" + ESC + "\x07"
    data["provenance"].update(
        hostname="h" + ESC, description="d" + ESC, notes=["n" + ESC], origin="o" + ESC
    )
    data["processes"] = [{"gpu": 1, "pid": 4242, "name": "proc" + ESC, "user": "u" + ESC}]
    data["faults"] = [{"gpu": 2, "kind": "xid", "detail": "xid 79" + ESC}]
    path = tmp_path / "evil.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("command", [["topo", "show"], ["status"], ["doctor"], ["plan", "-n", "2"]])
def test_a_topology_files_texts_reach_no_terminal_raw(
    cli: Cli, hostile_topology: Path, command: list[str]
) -> None:
    result = cli("--topology", str(hostile_topology), *command)
    assert "Traceback" not in result.stderr
    no_control_characters(result.stdout, result.stderr)
    assert "\\x1b[31m" in result.stdout + result.stderr


@pytest.mark.parametrize("fmt", ["graphml", "gexf"])
def test_an_exported_graph_with_control_characters_in_names_parses(
    cli: Callable[..., Result], tmp_path: Path, fmt: str
) -> None:
    import xml.etree.ElementTree as ElementTree

    data = json.loads((TOPOLOGIES / "dgx1-v100.json").read_text())
    data["name"] = "host\x01"
    data["gpus"][0]["name"] = "Tesla\x1b[31mV100\x07"
    topology = tmp_path / "hostile.json"
    topology.write_text(json.dumps(data))
    result = cli("--topology", str(topology), "topo", "export", "--format", fmt)
    assert result.exit_code == 0, result.stderr
    root = ElementTree.fromstring(result.stdout)
    texts = [element.text or "" for element in root.iter()]
    texts += [value for element in root.iter() for value in element.attrib.values()]
    assert "Tesla\\x1b[31mV100\\x07" in texts
    assert not any("\x1b" in text or "\x01" in text for text in texts)


# ---- a bandwidth table -----------------------------------------------------------------------


def test_a_bandwidth_table_error_names_the_fields(cli: Cli, tmp_path: Path) -> None:
    for text in ("{bad", "[1]"):
        table = tmp_path / "table.json"
        table.write_text(text)
        result = cli("--bandwidth-table", str(table), "--topology", "dgx1-v100", "topo", "show")
        refused(result, 5)
        hint = next(line for line in result.stderr.splitlines() if line.startswith("hint: "))
        assert "pcie_path_factor" in hint and "nvlink_link_gbps" in hint
        assert "BandwidthTable" not in hint


# ---- output that could not be written --------------------------------------------------------


def _gpualloc_sh(redirect: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``gpualloc ARGS`` with stdout as the shell's ``redirect`` makes it (``> /dev/full``)."""
    command = " ".join([shlex.quote(sys.executable), "-m", "gpualloc", *map(shlex.quote, args)])
    return subprocess.run(
        ["sh", "-c", f"exec {command} {redirect}"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize(
    "args",
    [
        ["topo", "show", "--json"],
        ["topo", "show"],
        ["plan", "-n", "2"],
        ["topo", "--help"],
        ["--help"],
    ],
)
def test_output_to_a_full_device_is_exit_8(args: list[str], full_device: Path) -> None:
    done = _gpualloc_sh(f"> {shlex.quote(str(full_device))}", "--topology", "dgx1-v100", *args)
    refused(done, 8)
    assert "error: cannot write the output to stdout: No space left on device" in done.stderr


@pytest.mark.parametrize("args", [["topo", "show", "--json"], ["plan", "-n", "2"]])
def test_output_to_a_closed_stdout_is_exit_8(args: list[str]) -> None:
    done = _gpualloc_sh(">&-", "--topology", "dgx1-v100", *args)
    refused(done, 8)
    assert "error: stdout is closed" in done.stderr


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


def test_alloc_that_cannot_print_its_lease_holds_nothing(cli: Cli) -> None:
    done = _gpualloc_sh(">&-", "--topology", "dgx1-v100", "alloc", "-n", "2")
    refused(done, 8)
    status = cli("--topology", "dgx1-v100", "status", "--json")
    assert json.loads(status.stdout)["free"] == list(range(8))


def test_topo_export_to_a_device_writes_in_place_and_fails_when_it_is_full(
    cli: Cli, full_device: Path
) -> None:
    """``-o /dev/full`` said "wrote /dev/full" (as root it replaced the device by a file)."""
    result = cli("--topology", "dgx1-v100", "topo", "export", "-o", str(full_device))
    refused(result, 8)
    assert "No space left on device" in result.stderr and "wrote" not in result.stderr
    assert full_device.is_char_device()


def test_a_users_output_path_never_replaces_a_device_a_fifo_or_a_directory(
    tmp_path: Path,
) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    write_user_output(Path("/dev/null"), "text\n")  # a device: written in place
    with pytest.raises(OSError) as unread:
        write_user_output(fifo, "text\n")  # nobody reads it: at once, not a wait
    assert unread.value.errno == errno.ENXIO
    with pytest.raises(IsADirectoryError):
        write_user_output(tmp_path, "text\n")
    assert Path("/dev/null").is_char_device() and fifo.is_fifo()
    assert [p.name for p in tmp_path.iterdir()] == ["pipe"]  # no temporary left either


def test_a_users_output_path_through_a_link_replaces_the_file_it_names(tmp_path: Path) -> None:
    real = tmp_path / "real.json"
    real.write_text("old\n")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    write_user_output(link, "new\n")
    assert link.is_symlink() and real.read_text() == "new\n"


@pytest.fixture
def inputs(tmp_path: Path, cli: Cli) -> dict[str, Path]:
    """Copies of the files the commands with an output file read, by what they are."""
    from tests.recordings import FIXTURES, RECORDED

    made = {
        "topo.txt": RECORDED / "dgx1-v100_vast_topo.txt",
        "nvlink.txt": RECORDED / "nvlink_status_v100-sxm2-8gpu_vast.txt",
        "mig.txt": RECORDED / "mig_nvidia-smi-L_a100-40gb_7x1g.5gb.txt",
        "matrix.txt": FIXTURES / "bandwidth" / "k8s-proposal-matrix.txt",
    }
    found = {name: tmp_path / name for name in made}
    for name, source in made.items():
        found[name].write_bytes(source.read_bytes())
    found["topology.json"] = tmp_path / "topology.json"
    found["topology.json"].write_text(cli("-t", "dgx1-v100", "topo", "show", "--json").stdout)
    found["table.json"] = tmp_path / "table.json"
    found["table.json"].write_text('{"nvlink_link_gbps": {"2": 30}}')
    found["trace.jsonl"] = tmp_path / "trace.jsonl"
    found["trace.jsonl"].write_text(
        '{"id": 1, "arrival_s": 0, "gpus": 2, "duration_s": 60, "sensitive": true}\n'
    )
    (tmp_path / "link.txt").symlink_to(found["topo.txt"])
    os.link(found["nvlink.txt"], tmp_path / "hard-link.txt")
    return found


@pytest.mark.parametrize(
    ("args", "output", "overwritten"),
    [
        (["topo", "import", "@topo.txt"], "@topo.txt", "topo.txt"),
        (["topo", "import", "@topo.txt"], "link.txt", "topo.txt"),
        (["topo", "import", "@topo.txt", "--nvlink", "@nvlink.txt"], "hard-link.txt",
         "nvlink.txt"),
        (["topo", "import", "--mig", "@mig.txt"], "@mig.txt", "mig.txt"),
        (["topo", "import", "--bandwidth-matrix", "@matrix.txt"], "@matrix.txt", "matrix.txt"),
        (["--bandwidth-table", "@table.json", "topo", "import", "@topo.txt"], "@table.json",
         "table.json"),
        (["-t", "@topology.json", "topo", "export"], "@topology.json", "topology.json"),
        (["-t", "@topology.json", "topo", "record"], "@topology.json", "topology.json"),
        (["-t", "dgx1-v100", "simulate", "--trace", "@trace.jsonl", "--save-trace"],
         "@trace.jsonl", "trace.jsonl"),
        (["-t", "dgx1-v100", "simulate", "--trace", "@trace.jsonl", "--report"],
         "@trace.jsonl", "trace.jsonl"),
    ],
    ids=["import", "symlink", "hard-link", "mig", "matrix", "table", "export", "record",
         "save-trace", "report"],
)  # fmt: skip
def test_an_output_file_that_is_an_input_is_refused_and_the_input_kept(
    cli: Cli,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    inputs: dict[str, Path],
    args: list[str],
    output: str,
    overwritten: str,
) -> None:
    """``topo import same.txt -o same.txt`` replaced the recording with JSON: an output that is
    the same file as an input (by device and inode: a link counts) is refused, untouched."""
    monkeypatch.chdir(tmp_path)  # "link.txt": another name of an input, relative
    argv = [str(inputs[word[1:]]) if word.startswith("@") else word for word in args]
    target = str(inputs[output[1:]]) if output.startswith("@") else output
    option = [] if "--save-trace" in argv or "--report" in argv else ["-o"]
    victim = inputs[overwritten]
    before = victim.stat()
    content = victim.read_bytes()
    result = cli(*argv, *option, target)
    refused(result, 2)
    assert "is an input of this command" in result.stderr and result.stdout == ""
    after = victim.stat()
    assert victim.read_bytes() == content
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


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
