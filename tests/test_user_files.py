"""Files a user names are read without hanging or exhausting gpualloc (issue 30, points 1 and 4):
regular files of at most 64 MiB, opened without blocking, one error line naming the file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpualloc.errors import ConfigError, ExitCode, FileAccessError
from gpualloc.user_files import read_user_text


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


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory", "huge"])
@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["--topology", "{path}", "topo", "show"], ExitCode.IO),
        (["--bandwidth-table", "{path}", "--topology", "dgx1-v100", "topo", "show"], ExitCode.IO),
        (["--topology", "dgx1-v100", "plan", "-n", "2", "--pattern", "{path}"], ExitCode.USAGE),
        (["--topology", "dgx1-v100", "simulate", "--trace", "{path}"], ExitCode.TRACE),
        (["topo", "import", "{path}"], ExitCode.IO),
    ],
)
def test_every_file_option_refuses_it_with_one_line(
    cli, tmp_path: Path, kind: str, args: list[str], code: int
) -> None:
    """The issue's reproductions: `-t /dev/zero topo show` grew past 3 GB, `-t FIFO` hung."""
    path = _hostile(tmp_path, kind)
    result = cli(*(arg.replace("{path}", str(path)) for arg in args))
    if "--pattern" in args and kind in ("fifo", "dev-zero", "directory"):
        assert result.exit_code == ExitCode.USAGE  # not a file: an unknown pattern name
    else:
        assert result.exit_code == code, result.stderr
        assert str(path) in result.stderr
    assert result.stderr.startswith("error: ") and "Traceback" not in result.stderr


@pytest.mark.parametrize("which", ["user", "system"])
def test_a_binary_or_special_config_file_is_exit_15_naming_it(
    cli, tmp_path: Path, which: str
) -> None:
    """Issue 30, point 4: 500 random bytes in config.toml gave 'internal error:
    UnicodeDecodeError' (exit 1)."""
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
    assert result.exit_code == ExitCode.CONFIG and "is a FIFO" in result.stderr


def test_names_and_commands_reach_other_terminals_escaped_and_short(cli) -> None:
    """Issue 30, point 5: a lease name with an escape sequence and a newline put colour and a
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
    """Issue 30, point 8: an empty .json got the 'nvidia-smi topo -m' message; JSON errors had
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
    """Issue 30, point 10: the messages that misled or read badly."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    topology = [] if args[0] == "-t" else ["--topology", "dgx1-v100"]
    result = cli(*topology, *args)
    assert result.exit_code != 0 and said in result.stderr
    assert not_said is None or not_said not in result.stderr


def test_a_huge_argv_is_not_echoed_whole_in_the_lease_line(tmp_path: Path) -> None:
    """Issue 30, point 5: the stderr lease line of 'run' echoed a 100 kB argv whole."""
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
