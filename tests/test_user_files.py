"""Files a user names are read without hanging or exhausting gpualloc:
regular files of at most 64 MiB, opened without blocking, one error line naming the file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpualloc.errors import ConfigError, ExitCode, FileAccessError
from gpualloc.user_files import read_user_text
from tests.house_rules import refused
from tests.path_options import WRITTEN_OR_DIRECTORIES


def _hostile(tmp_path: Path, kind: str) -> Path:
    """A path that names something other than a readable text file of sane size."""
    if kind == "fifo":
        path = tmp_path / "fifo"
        os.mkfifo(path)
        return path
    if kind == "dev-zero":
        return Path("/dev/zero")
    if kind == "directory":
        path = tmp_path / "dir.json"
        path.mkdir()
        return path
    if kind == "huge":
        path = tmp_path / "huge.json"
        with path.open("wb") as file:
            file.truncate(65 * 2**20)  # sparse: 65 MiB of size, no disk
        return path
    raise AssertionError(kind)


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        ("fifo", "is a FIFO, not a regular file"),
        ("dev-zero", "is a character device, not a regular file"),
        ("directory", "is a directory, not a regular file"),
        ("huge", "is 65 MiB, more than the 64 MiB gpualloc reads"),
    ],
)
def test_what_is_not_a_sane_file_is_refused_at_once(tmp_path: Path, kind: str, said: str) -> None:
    path = _hostile(tmp_path, kind)
    with pytest.raises(FileAccessError, match=said) as refused:
        read_user_text(path, "topology file")
    assert str(path) in refused.value.message


def test_bytes_that_are_not_utf8_are_an_error_or_replaced(tmp_path: Path) -> None:
    path = tmp_path / "binary"
    path.write_bytes(b"GPU0\xff\xfe")
    with pytest.raises(ConfigError, match=r"is not UTF-8 text \(byte 4 is 0xff\)"):
        read_user_text(path, "configuration file", error=ConfigError)
    assert read_user_text(path, "topo -m file", replace_bad_bytes=True) == "GPU0\ufffd\ufffd"


TOPO_M = str(
    Path(__file__).parent / "fixtures" / "topologies" / "4x-a100-sxm4_nv12_rocenic_topo.txt"
)
READERS: dict[str, tuple[list[str], dict[str, str]]] = {
    "--topology": (["--topology", "{f}", "topo", "show"], {}),
    "GPUALLOC_TOPOLOGY": (["topo", "show"], {"GPUALLOC_TOPOLOGY": "{f}"}),
    "--bandwidth-table": (["--bandwidth-table", "{f}", "-t", "dgx1-v100", "topo", "show"], {}),
    "GPUALLOC_BANDWIDTH_TABLE": (
        ["-t", "dgx1-v100", "topo", "show"], {"GPUALLOC_BANDWIDTH_TABLE": "{f}"},
    ),
    "plan --pattern": (["-t", "dgx1-v100", "plan", "-n", "2", "--pattern", "{f}"], {}),
    "alloc --pattern": (["-t", "dgx1-v100", "alloc", "--hold", "-n", "2", "--pattern", "{f}"], {}),
    "simulate --trace": (["-t", "dgx1-v100", "simulate", "--trace", "{f}"], {}),
    "simulate --profile": (
        ["-t", "dgx1-v100", "simulate", "--generate", "drb", "--profile", "{f}"], {},
    ),
    "doctor --measured": (["-t", "dgx1-v100", "doctor", "--measured", "{f}"], {}),
    "calibrate --from": (["calibrate", "--from", "{f}"], {}),
    "topo import topo_file": (["topo", "import", "{f}"], {}),
    "topo import --nvlink": (["topo", "import", TOPO_M, "--nvlink", "{f}"], {}),
    "topo import --numa": (["topo", "import", TOPO_M, "--numa", "{f}"], {}),
    "topo import --p2p": (["topo", "import", TOPO_M, "--p2p", "{f}"], {}),
    "topo import --bandwidth-matrix": (
        ["-t", "dgx1-v100", "topo", "import", "--bandwidth-matrix", "{f}"], {},
    ),
    "topo import --mig": (["topo", "import", "--mig", "{f}"], {}),
    "slurm gres-conf --mig-minors": (
        ["-t", "dgx1-v100", "slurm", "gres-conf", "--mig-minors", "{f}"], {},
    ),
    "GPUALLOC_SYSTEM_CONFIG": (["config", "show"], {"GPUALLOC_SYSTEM_CONFIG": "{f}"}),
    "the user's config.toml": (["config", "show"], {"XDG_CONFIG_HOME": "{config home}"}),
}  # fmt: skip
"""Every option, argument and setting that names a file gpualloc reads (keyed as
:func:`_path_parameters` names the command line's)."""


def _path_parameters() -> set[str]:
    """``COMMAND --option`` of every option and argument declared to take a path."""
    from gpualloc.cli.commands import GLOBAL_OPTIONS, every_command

    found: set[str] = set()
    for path, command in [("", None), *every_command()]:
        for opt in command.options if command else GLOBAL_OPTIONS:
            if opt.kind == "path":
                found.add(f"{path} {opt.names[0]}".strip())
        argument = command.argument if command else None
        if argument is not None and argument.kind == "path":
            found.add(f"{path} {argument.dest}")
    return found


def test_the_table_of_file_readers_names_every_path_option() -> None:
    """A new option that reads a file joins :data:`READERS`, and so the tests below."""
    assert _path_parameters() - WRITTEN_OR_DIRECTORIES == {
        name for name in READERS if not name.isupper() and not name.startswith("the ")
    } - {"alloc --pattern", "plan --pattern", "--topology"}  # text: a name or a path


def _reader_case(name: str, path: Path, config_home: Path) -> tuple[list[str], dict[str, str]]:
    """The command line and variables of :data:`READERS`' ``name``, naming ``path``."""
    args, env = READERS[name]
    if name == "the user's config.toml":
        (config_home / "gpualloc").mkdir(parents=True, exist_ok=True)
        target = config_home / "gpualloc" / "config.toml"
        if path.is_dir():
            target.mkdir(exist_ok=True)
        else:
            target.symlink_to(path)
        path = target
    fill = {"{f}": str(path), "{config home}": str(config_home)}
    return [fill.get(arg, arg) for arg in args], {k: fill.get(v, v) for k, v in env.items()}


def _cannot_be_read(result, path: Path, why: str) -> None:
    """Exit 8, gpualloc's own one error line naming the file and why, at most one hint."""
    error = refused(result, ExitCode.IO, alone=True)
    assert str(path) in error and why in error, error
    assert "invalid value for" not in result.stderr  # click's words, exit 2


@pytest.mark.parametrize("name", READERS)
@pytest.mark.parametrize(
    ("kind", "why"),
    [
        ("directory", "is a directory, not a regular file"),
        ("proc-mem", "cannot read"),  # /proc/self/mem: EIO at offset 0, even for root
        ("fifo", "is a FIFO, not a regular file"),
        ("huge", "more than the 64 MiB gpualloc reads"),
    ],
)
def test_every_file_reader_refuses_an_unreadable_file_with_exit_8(
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, kind: str, why: str
) -> None:
    """One code, 8, whichever option named the file: it was 2 for --pattern, 14 for a trace or
    profile, 15 for a configuration file (and `-t /dev/zero topo show` grew past 3 GB, `-t
    FIFO` hung)."""
    path = Path("/proc/self/mem") if kind == "proc-mem" else _hostile(tmp_path, kind)
    args, env = _reader_case(name, path, tmp_path / "home-config")
    for variable, value in env.items():
        monkeypatch.setenv(variable, value)
    _cannot_be_read(cli(*args), path if name != "the user's config.toml" else Path(), why)


@pytest.mark.parametrize("name", [n for n in READERS if n != "the user's config.toml"])
def test_a_missing_file_is_exit_8_but_a_missing_topology_is_3(
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    path = tmp_path / "missing.txt"
    args, env = _reader_case(name, path, tmp_path / "home-config")
    for variable, value in env.items():
        monkeypatch.setenv(variable, value)
    result = cli(*args)
    topology = name in ("--topology", "GPUALLOC_TOPOLOGY")
    config = name == "GPUALLOC_SYSTEM_CONFIG"  # the variable is wrong: a setting's error
    code = ExitCode.TOPOLOGY_NOT_FOUND if topology else ExitCode.CONFIG if config else ExitCode.IO
    assert result.exit_code == code, result.stderr
    assert str(path) in result.stderr and "does not exist" in result.stderr


def test_a_file_another_user_may_not_read_is_exit_8_for_every_reader(
    world_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As ``nobody``, a file of root's mode 0600: click's own check made it exit 2, "invalid
    value for '--trace': path '...' is not readable", with the usage line as the hint."""
    from tests.unix_users import in_process_as_nobody

    secret = world_dir / "secret.txt"
    secret.write_text("GPU0\n")
    secret.chmod(0o600)
    for directory in ("state", "cache"):
        (world_dir / directory).mkdir(mode=0o777)
        (world_dir / directory).chmod(0o1777)
    monkeypatch.setenv("GPUALLOC_STATE_DIR", str(world_dir / "state"))
    monkeypatch.setenv("GPUALLOC_CACHE_DIR", str(world_dir / "cache"))
    names = [n for n in READERS if n != "the user's config.toml"]
    cases = [_reader_case(name, secret, world_dir / "config") for name in names]
    results = in_process_as_nobody(
        [args for args, _ in cases], monkeypatch, [env for _, env in cases]
    )
    for name, result in zip(names, results, strict=True):
        assert result.exit_code == ExitCode.IO, (name, result.stderr)
        assert result.stderr.startswith("error: cannot read ") and result.stderr.endswith(
            f" {secret}: Permission denied\n"
        ), (name, result.stderr)


@pytest.mark.parametrize("which", ["user", "system"])
def test_a_binary_config_file_is_exit_15_and_a_fifo_exit_8_naming_it(
    cli, tmp_path: Path, which: str
) -> None:
    """500 random bytes in config.toml gave 'internal error:
    UnicodeDecodeError' (exit 1). Bytes read that are no TOML are the file's fault (15); a FIFO
    is no file to read (8, as for every file option)."""
    user = tmp_path / "config" / "gpualloc" / "config.toml"
    system = tmp_path / "etc" / "config.toml"
    path = user if which == "user" else system
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(range(256)) * 2)
    result = cli("--topology", "dgx1-v100", "plan", "-n", "2")
    assert result.exit_code == ExitCode.CONFIG
    assert f"error: configuration file {path} is not UTF-8 text" in result.stderr
    path.unlink()
    os.mkfifo(path)
    result = cli("--topology", "dgx1-v100", "plan", "-n", "2")
    assert result.exit_code == ExitCode.IO and "is a FIFO" in result.stderr


def test_names_and_commands_reach_other_terminals_escaped_and_short(cli) -> None:
    """A lease name with an escape sequence and a newline put colour and a
    fake row into everyone's ``status``; names had no length limit."""
    topology = ("--topology", "dgx1-v100")
    hostile = "x\x1b[31mRED\nline2"
    assert cli(*topology, "alloc", "--hold", "-n", "8", "--name", hostile).exit_code == 0
    shown = cli(*topology, "status").stdout
    assert "\x1b" not in shown and "x\\x1b[31mRED\\nline2" in shown
    assert not any(line.startswith("line2") for line in shown.splitlines())
    exact = json.loads(cli(*topology, "status", "--json").stdout)["leases"][0]["name"]
    assert exact == hostile  # programs get it as it is
    busy = cli(*topology, "alloc", "-n", "1")
    assert busy.exit_code == ExitCode.BUSY
    assert "\x1b" not in busy.stderr and "\\x1b[31mRED" in busy.stderr
    too_long = cli(*topology, "alloc", "--hold", "--name", "n" * 129)
    assert too_long.exit_code == ExitCode.USAGE
    assert "--name is 129 characters long; a lease name has at most 128" in too_long.stderr


def test_printable_escapes_controls_and_bidi_and_cuts() -> None:
    from gpualloc.model.printable import printable

    assert printable("a\tb\x07c\u202ed") == "a\\tb\\x07c\\u202ed"
    assert printable("ü 日本") == "ü 日本"  # letters of any script stay
    assert printable("x" * 50, 10) == "xxxxxxx..."


def test_topology_file_messages_say_what_is_wrong(cli, tmp_path: Path) -> None:
    """An empty .json got the 'nvidia-smi topo -m' message; JSON errors had
    no hint; a 16,000-GPU file printed every index (50 kB) in one line."""
    empty = tmp_path / "empty.json"
    empty.write_text("")
    result = cli("--topology", str(empty), "topo", "show")
    assert result.exit_code == ExitCode.TOPOLOGY_INVALID
    assert result.stderr.startswith(f"error: topology file {empty} is empty\nhint: ")
    torn = tmp_path / "torn.json"
    torn.write_text('{"schema_version": 1, "gpus": [')
    result = cli("--topology", str(torn), "topo", "show")
    assert "not valid JSON" in result.stderr and "\nhint: " in result.stderr
    text = tmp_path / "matrix.json"
    text.write_text("\tGPU0\nGPU0\t X \n")
    result = cli("--topology", str(text), "topo", "show")
    assert "is not a JSON object" in result.stderr
    bundled = json.loads((Path(gpualloc_topologies()) / "dgx1-v100.json").read_text())
    gpu = bundled["gpus"][0]
    bundled["gpus"] = [{**gpu, "index": i + 1, "uuid": f"GPU-{i}"} for i in range(16000)]
    bundled["links"] = []
    big = tmp_path / "big.json"
    big.write_text(json.dumps(bundled))
    result = cli("--topology", str(big), "topo", "show")
    assert result.exit_code == ExitCode.TOPOLOGY_INVALID
    assert (
        len(result.stderr) < 400 and "GPU number 1 in the list has index 1, not 0" in result.stderr
    )


def gpualloc_topologies() -> str:
    import gpualloc.topologies

    return str(Path(gpualloc.topologies.__file__).parent)


@pytest.mark.parametrize(
    ("args", "env", "said", "not_said"),
    [
        (["run", "--mem", "8G", "--", "true"], {}, "--share --mem SIZE", None),
        (["run", "--gpus", "3-1", "--", "true"], {}, "runs backwards (write 1-3)", "CPU list"),
        (["-t", "single-gpu", "run", "--gpus", "3", "--", "true"], {}, "(1 GPU: 0..0)", "1 GPUs"),
        (["status"], {"GPUALLOC_STATE_DIR": ""}, "to use the configured value (", "configured the"),
    ],
)
def test_wording_of_the_newcomers_trial(
    cli, monkeypatch: pytest.MonkeyPatch, args, env, said: str, not_said: str | None
) -> None:
    """The messages that misled or read badly."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    topology = [] if args[0] == "-t" else ["--topology", "dgx1-v100"]
    result = cli(*topology, *args)
    assert result.exit_code != 0 and said in result.stderr
    assert not_said is None or not_said not in result.stderr


def test_a_huge_argv_is_not_echoed_whole_in_the_lease_line(tmp_path: Path) -> None:
    """The stderr lease line of 'run' cuts a 100 kB argv instead of echoing it whole."""
    import subprocess
    import sys

    huge = "a" * 100_000
    result = subprocess.run(
        [sys.executable, "-m", "gpualloc", "-t", "dgx1-v100", "run", "--", "true", huge],
        capture_output=True, text=True, check=False, timeout=60,
        env={**os.environ, "GPUALLOC_STATE_DIR": str(tmp_path / "state")},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[:500]
    (line,) = result.stderr.splitlines()
    assert line.startswith("gpualloc: lease ") and line.endswith("...") and len(line) < 300


@pytest.mark.parametrize(
    ("args", "env", "code"),
    [
        (["alloc", "--hold"], {"GPUALLOC_BANDWIDTH_TABLE": "~0"}, ExitCode.CONFIG),
        (["status"], {"GPUALLOC_STATE_DIR": "~nosuchuser/state"}, ExitCode.CONFIG),
        (["-t", "~nosuchuser/x.json", "topo", "show"], {}, ExitCode.TOPOLOGY_NOT_FOUND),
    ],
)
def test_a_tilde_of_no_user_is_an_error_not_a_crash(
    cli, monkeypatch: pytest.MonkeyPatch, args: list[str], env: dict, code: int
) -> None:
    """Found by the fuzzing harness in CI: pathlib raises RuntimeError for '~0' (no user '0'),
    which was 'internal error' (exit 1)."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    topology = [] if args[0] == "-t" else ["--topology", "dgx1-v100"]
    result = cli(*topology, *args)
    assert result.exit_code == code
    assert "there is no user" in result.stderr and "internal error" not in result.stderr


LONG_NAME = "a" * 3000


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["-t", "dgx1-v100", "alloc", "--hold", "--pattern", LONG_NAME], ExitCode.USAGE),
        (["-t", LONG_NAME, "topo", "show"], ExitCode.TOPOLOGY_NOT_FOUND),
        (["--bandwidth-table", LONG_NAME, "-t", "dgx1-v100", "topo", "show"], ExitCode.IO),
        (["-t", "dgx1-v100", "run", "--dry-run", "--", LONG_NAME], ExitCode.COMMAND_NOT_FOUND),
    ],
)
def test_a_name_too_long_for_the_file_system_is_not_found(cli, args: list[str], code: int) -> None:
    """Found by the fuzzing harness: pathlib's is_file() and exists() raise ENAMETOOLONG for a
    3,000-character name, which was 'internal error' (exit 1)."""
    result = cli(*args)
    assert result.exit_code == code, result.stderr
    assert "internal error" not in result.stderr


@pytest.mark.parametrize(
    "text",
    [
        "id,arrival_s,gpus,duration_s,sensitive\r1,0\r,2,3,true\n",
        "id,arrival_s,gpus,duration_s,sensitive\n1," + "x" * 140_000 + ",2,3,true\n",
    ],
    ids=["carriage returns", "a field over csv's limit"],
)
def test_a_trace_that_is_no_csv_is_a_trace_error(cli, tmp_path: Path, text: str) -> None:
    """Found by the fuzzing harness: csv.Error escaped as 'internal error' (exit 1)."""
    trace = tmp_path / "trace.txt"
    trace.write_text(text)
    result = cli("--topology", "dgx1-v100", "simulate", "--trace", str(trace))
    assert result.exit_code == ExitCode.TRACE, result.stderr
    assert result.stderr.startswith(f"error: {trace}")
