"""Bad input answered well: one ``error:`` line, at most one ``hint:``, a documented
exit code, no traceback, nothing written."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cli_harness import Result
from tests.house_rules import refused

Cli = Callable[..., Result]


# ---- point 1: serve --socket -------------------------------------------------------------


@pytest.mark.parametrize("socket", ["", "   "])
def test_serve_refuses_an_empty_socket_path(cli: Cli, tmp_path: Path, socket: str) -> None:
    state = tmp_path / "broker-state"
    result = cli("--topology", "dgx1-v100", "serve", "--socket", socket, "--state-dir", str(state))
    refused(result, 2)
    assert "--socket is empty" in result.stderr
    assert not state.exists()


def test_serve_refuses_a_socket_path_too_long_for_a_unix_socket(cli: Cli, tmp_path: Path) -> None:
    state = tmp_path / "broker-state"
    socket = tmp_path / ("s" * 200)
    result = cli(
        "--topology", "dgx1-v100", "serve", "--socket", str(socket), "--state-dir", str(state)
    )
    refused(result, 2)
    assert "a Unix socket's path may have at most" in result.stderr
    assert not state.exists() and not socket.exists()


# ---- point 2: a relative state directory ---------------------------------------------------


def test_a_relative_state_dir_variable_is_refused(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GPUALLOC_STATE_DIR", "rel")
    result = cli("--topology", "dgx1-v100", "alloc", "-n", "1")
    refused(result, 15)
    assert "GPUALLOC_STATE_DIR = 'rel': must be an absolute path" in result.stderr
    assert "hint: give an absolute path" in result.stderr
    assert not (tmp_path / "rel").exists()


def test_a_relative_state_dir_in_a_config_file_is_refused(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GPUALLOC_STATE_DIR")
    user_file = tmp_path / "config" / "gpualloc" / "config.toml"
    user_file.parent.mkdir(parents=True)
    user_file.write_text('state_dir = "rel"\n')
    result = cli("--topology", "dgx1-v100", "status")
    refused(result, 15)
    assert "state_dir = 'rel': must be an absolute path" in result.stderr
    assert not (tmp_path / "rel").exists()


# ---- point 3: variables set but empty, or not understood ----------------------------------


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("GPUALLOC_TOPOLOGY", "", "GPUALLOC_TOPOLOGY is set but empty"),
        ("GPUALLOC_SYSTEM_CONFIG", "", "GPUALLOC_SYSTEM_CONFIG is set but empty"),
        ("GPUALLOC_SYSTEM_CONFIG", " ", "GPUALLOC_SYSTEM_CONFIG is set but empty"),
        ("GPUALLOC_NO_SLURM", "", "GPUALLOC_NO_SLURM is set but empty"),
        ("GPUALLOC_NO_SLURM", "bogus", "GPUALLOC_NO_SLURM = 'bogus': must be true or false"),
    ],
)
@pytest.mark.parametrize("command", [["status"], ["run", "-n", "1", "--", "true"]])
def test_a_variable_set_but_not_understood_is_exit_15(
    cli: Cli, monkeypatch: pytest.MonkeyPatch, variable: str, value: str, message: str,
    command: list[str],
) -> None:  # fmt: skip
    monkeypatch.setenv(variable, value)
    topology = [] if variable == "GPUALLOC_TOPOLOGY" else ["--topology", "dgx1-v100"]
    result = cli(*topology, *command)
    refused(result, 15)
    assert f"error: {message}" in result.stderr


@pytest.mark.parametrize("given", [["--topology", ""], ["--topology="], ["-t", " "]])
@pytest.mark.parametrize(
    "command", [["topo", "show"], ["status"], ["run", "-n", "1", "--", "true"], ["plan"]]
)
def test_an_empty_topology_option_is_a_usage_error(
    cli: Cli, monkeypatch: pytest.MonkeyPatch, given: list[str], command: list[str]
) -> None:
    """``--topology ''`` fell back to $GPUALLOC_TOPOLOGY (or this host) without a word."""
    monkeypatch.setenv("GPUALLOC_TOPOLOGY", "dgx1-v100")
    result = cli(*given, *command)
    refused(result, 2)
    assert result.stderr.startswith("error: --topology is empty\nhint: ") and result.stdout == ""


def test_a_system_config_that_does_not_exist_is_exit_15(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A typo in GPUALLOC_SYSTEM_CONFIG would silently drop the host's limits."""
    (tmp_path / "etc").mkdir()
    monkeypatch.setenv("GPUALLOC_SYSTEM_CONFIG", str(tmp_path / "etc" / "confg.toml"))
    result = cli("--topology", "dgx1-v100", "status")
    refused(result, 15)
    assert "confg.toml, which does not exist" in result.stderr


@pytest.mark.parametrize(
    ("value", "ignored"), [("1", True), ("yes", True), ("0", False), ("false", False)]
)
def test_no_slurm_takes_the_boolean_spellings(value: str, ignored: bool) -> None:
    from gpualloc.slurm.job import slurm_job
    from gpualloc.topologies import load_bundled

    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "0", "GPUALLOC_NO_SLURM": value}
    assert (slurm_job(load_bundled("dgx1-v100"), env) is None) is ignored


# ---- point 4: output that could not be written ---------------------------------------------


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


# ---- point 5: gres.conf fields -------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--node", "n1\nNodeName=evil Name=gpu File=/dev/sda"),
        ("--node", "n1 File=/dev/sda"),
        ("--node", "n1\r"),
        ("--node", ""),
        ("--gpu-type", "a100\nNodeName=evil"),
        ("--device-dir", "/dev\nNodeName=evil"),
    ],
)
def test_gres_conf_refuses_a_field_that_would_write_another_line(
    cli: Cli, option: str, value: str
) -> None:
    result = cli("--topology", "dgx1-v100", "slurm", "gres-conf", option, value)
    refused(result, 2)
    assert result.stdout == "" and "evil" not in result.stdout


def test_gres_conf_keeps_a_hostlist_node_name(cli: Cli) -> None:
    result = cli("--topology", "dgx1-v100", "slurm", "gres-conf", "--node", "gpu[01-04]")
    assert result.exit_code == 0
    assert "NodeName=gpu[01-04] Name=gpu File=/dev/nvidia0 " in result.stdout


# ---- point 6: topology files ---------------------------------------------------------------


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


# ---- point 7: --mem without a unit ---------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [["plan", "-n", "1", "--mem", "8"], ["alloc", "-n", "1", "--shareable", "--mem", "8"]],
)
def test_mem_without_a_unit_is_refused(cli: Cli, command: list[str]) -> None:
    result = cli("--topology", "dgx1-v100", *command)
    refused(result, 2)
    assert "--mem '8' has no unit" in result.stderr and "8G" in result.stderr


def test_mem_in_bytes_says_so() -> None:
    from gpualloc.model.option_values import parse_size

    assert parse_size("4096B", "--mem") == 4096
    assert parse_size("8G", "--mem") == 8 * 1024**3


@pytest.mark.parametrize(
    ("weights", "said"),
    [
        (
            "0,0,0",
            "--drb-weights '0,0,0': all three weights are zero; at least one must be positive",
        ),
        ("1,-1,0", "--drb-weights '1,-1,0': a weight is negative (-1)"),
        ("1,2", "--drb-weights '1,2' is not three non-negative numbers"),
    ],
)
@pytest.mark.parametrize("command", [["alloc", "--hold"], ["run", "--dry-run", "--", "true"]])
def test_drb_weights_say_which_rule_they_break(
    cli: Cli, weights: str, said: str, command: list[str]
) -> None:
    """``0,0,0`` was "is not three non-negative numbers": it is three, and none is negative."""
    result = cli("--topology", "dgx1-v100", command[0], "--drb-weights", weights, *command[1:])
    refused(result, 2)
    assert result.stderr.startswith(f"error: {said}\n"), result.stderr


# ---- hints that only repeated the option's help --------------------------------------------

BAD_VALUES = [
    (["run", "--dry-run", "--numa", "bnid", "--", "true"], "run --numa", "bind"),
    (["run", "--wait", "--priority", "hgih", "--", "true"], "run --priority", "high"),
    (["alloc", "--format", "yaml"], "alloc --format", None),
    (["topo", "export", "--format", "gexff"], "topo export --format", "gexf"),
    (["run", "--dry-run", "--score", "mapp", "--", "true"], "run --score", "mapa"),
    (["run", "--dry-run", "--policy", "spraed", "--", "true"], "run --policy", "spread"),
    (["run", "--dry-run", "-n", "2", "--pattern", "rign", "--", "true"], "run --pattern", "ring"),
    (["simulate", "--generate", "mixd"], "simulate --generate", "mixed"),
    (["simulate", "--generate", "mapa", "--queue", "lifo"], "simulate --queue", "fifo"),
    (["simulate", "--generate", "mapa", "--runtime", "fast"], "simulate --runtime", None),
    (["simulate", "--generate", "mapa", "--load", "5000"], "simulate --load", None),
    (["run", "--wait", "--timeout", "soon", "--", "true"], "run --timeout", None),
    (["status", "--idle", "soon"], "status --idle", None),
    (["run", "--dry-run", "--share", "--mem", "lots", "--", "true"], "run --mem", None),
    (["run", "--dry-run", "--mig", "big", "--", "true"], "run --mig", None),
    (["run", "--dry-run", "--drb-weights", "1,2", "--", "true"], "run --drb-weights", None),
]  # fmt: skip
_FILLER = {"the", "a", "an", "of", "to", "or", "and", "in", "is", "for", "on", "with", "as", "by",
           "it", "its", "e.g", "choose", "give", "one", "one of"}  # fmt: skip


def _help_of(option: str) -> str:
    from gpualloc.cli.commands import every_command

    *path, name = option.split()
    (command,) = [command for where, command in every_command() if where == " ".join(path)]
    (opt,) = [opt for opt in command.options if name in opt.names]
    return opt.help


def _words(text: str) -> set[str]:
    import re

    return {w.strip(".") for w in re.findall(r"[a-z0-9][a-z0-9_.]*", text.lower())} - _FILLER


@pytest.mark.parametrize(("args", "option", "meant"), BAD_VALUES, ids=lambda v: str(v))
def test_a_bad_value_gets_a_hint_its_help_does_not_already_give(
    cli: Cli, args: list[str], option: str, meant: str | None
) -> None:
    """Hints such as "choose auto, bind or none" or "e.g. --timeout 90, 30s, 5m, 1h30m" said
    again what --help says of the option: a choice error names the choices in the error and
    hints at the one closest to what was typed; any other hint says something the help does
    not."""
    result = cli("--topology", "dgx1-v100", *args)
    assert result.exit_code in (2, 14), result.stderr
    refused(result, result.exit_code)
    hints = [line[6:] for line in result.stderr.splitlines() if line.startswith("hint: ")]
    if meant is not None:
        assert hints == [f"did you mean {meant}?"], result.stderr
    for hint in hints:
        said = _words(hint) - _words(option)
        repeated = said & _words(_help_of(option))
        assert len(repeated) < 0.5 * len(said), (hint, sorted(repeated))
