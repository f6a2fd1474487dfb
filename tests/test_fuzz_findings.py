"""What the fuzzing harness (``tests/fuzz_harness.py``) found, and four faults noticed beside it,
each pinned by its exact input: one ``error:`` line, at most one ``hint:``, a documented exit code,
nothing written, no internal error, no value echoed at length."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpualloc.errors import ExitCode
from tests.cli_harness import Result
from tests.house_rules import refused

Cli = Callable[..., Result]
TOPOLOGIES = Path(__file__).resolve().parent.parent / "gpualloc" / "topologies"
PROFILE = TOPOLOGIES.parent / "simulate" / "drb_profile.json"
DEEP = "[" * 100_000 + "]" * 100_000


def _refused(result: Result, code: int, *said: str) -> None:
    """The house rule's refusal (:func:`tests.house_rules.refused`) with exit ``code``, saying
    each of ``said``, and no more than 120 characters of one run of digits, letters or
    brackets (the long values of these tests) said back."""
    refused(result, code)
    for run in ("0" * 121, "a" * 121, "[" * 121, "9" * 121):
        assert run not in result.stderr, result.stderr
    for words in said:
        assert words in result.stderr, result.stderr


@pytest.fixture
def system_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "etc" / "config.toml"
    path.parent.mkdir()
    monkeypatch.setenv("GPUALLOC_SYSTEM_CONFIG", str(path))
    return path


# ---- durations past any timer -----------------------------------------------------------------


def test_a_broker_timeout_past_any_timer_is_a_config_error(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GPUALLOC_BROKER_TIMEOUT=3000000h reached socket.settimeout: exit 1, OverflowError."""
    with socket.socket(socket.AF_UNIX) as silent:  # a broker that never answers
        silent.bind(str(tmp_path / "b.sock"))
        silent.listen()
        monkeypatch.setenv("GPUALLOC_BROKER", str(tmp_path / "b.sock"))
        monkeypatch.setenv("GPUALLOC_BROKER_TIMEOUT", "3000000h")
        _refused(cli("status"), ExitCode.CONFIG, "'3000000h' is longer than a year (366d)")


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("lock_timeout = nan", "lock_timeout = nan: 'nan' is not a finite duration"),
        ("lock_timeout = inf", "'inf' is not a finite duration"),
        ("lock_timeout = 1e308", "is longer than a year"),
        ("lock_timeout = 1" + "0" * 400, "is longer than a year"),
        ("[queue]\nbackfill_window = -inf", "'-inf' is not a finite duration"),
        ("[queue]\nmax_bypass = inf", "queue.max_bypass = inf: must be a whole number >= 0"),
        ("[share]\nmax_jobs = 1" + "0" * 30, "must be at most 1000000000"),
        ("k = " + "[" * 5000 + "]" * 5000, "is not valid TOML: nested too deep"),
    ],
)
def test_config_numbers_no_timer_takes_are_refused(
    cli: Cli, system_config: Path, line: str, said: str
) -> None:
    """``lock_timeout = nan`` printed nan in config show, then was an internal error; ``inf``
    counts and 5,000 nested arrays were internal errors (exit 1)."""
    system_config.write_text(line + "\n")
    for args in (["config", "show"], ["--topology", "dgx1-v100", "status"]):
        _refused(cli(*args), ExitCode.CONFIG, said)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["status", "--idle", "9" * 30], "--idle"),
        (["alloc", "--wait", "--timeout", "99999999h"], "--timeout '99999999h' is longer than"),
        (["run", "--wait", "--timeout", "9" * 400, "--", "true"], "is longer than a year"),
    ],
)
def test_option_durations_past_a_year_are_usage_errors(
    cli: Cli, args: list[str], said: str
) -> None:
    """``status --idle 999...`` was an internal error (OverflowError in timedelta)."""
    _refused(cli("--topology", "dgx1-v100", *args), ExitCode.USAGE, said)


# ---- JSON nested past Python's recursion -------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["--bandwidth-table", "{f}", "--topology", "dgx1-v100", "topo", "show"], 5),
        (["-t", "dgx1-v100", "simulate", "--generate", "drb:jobs=5", "--profile", "{f}"], 14),
        (["topo", "import", "--bandwidth-matrix", "{f}"], 4),
        (["--topology", "dgx1-v100", "doctor", "--measured", "{f}"], 4),
    ],
)  # fmt: skip
def test_json_nested_too_deep_is_said_so(
    cli: Cli, tmp_path: Path, args: list[str], code: int
) -> None:
    """A RecursionError escaped every JSON reader but the topology's and the ledger's."""
    deep = tmp_path / "deep.json"
    deep.write_text(DEEP)
    _refused(cli(*[str(deep) if a == "{f}" else a for a in args]), code)


def test_a_pattern_nested_too_deep_is_said_so(cli: Cli, tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text(DEEP)
    _refused(cli("--topology", "dgx1-v100", "plan", "-n", "2", "--pattern", str(deep)), 2)


# ---- job profiles -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("column", "value", "said"),
    [
        (2, float("inf"), "'inf' is not a whole number >= 0"),
        (3, float("nan"), "'nan' is not a time from 0 to 1e+12 seconds"),
        (3, -5.0, "'-5.0' is not a time"),
        (1, "x", "invalid literal"),
    ],
)
def test_a_profile_of_numbers_no_job_runs_for_is_refused(
    cli: Cli, tmp_path: Path, column: int, value: object, said: str
) -> None:
    """An infinite GPU count was an internal error; NaN run times simulated for ever."""
    data = json.loads(PROFILE.read_text())
    for row in data["solo"]:
        row[column] = value
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(data))
    args = ["simulate", "--generate", "drb:jobs=5", "--runtime", "profile", "--profile"]
    result = cli("--topology", "dgx1-v100", *args, str(profile))
    _refused(result, ExitCode.TRACE, "is not a job profile", said)


# ---- MIG devices without a usable UUID ---------------------------------------------------------


@pytest.mark.parametrize("uuid", ["", "MIG-a,b", "MIG-\x1b[31m", " MIG-x"])
@pytest.mark.parametrize(
    "command", [["alloc", "--mig", "1g.5gb"], ["run", "--mig", "1g.5gb", "--", "true"]]
)
def test_a_mig_device_cuda_cannot_name_is_refused_before_any_lease(
    tmp_path: Path, uuid: str, command: list[str]
) -> None:
    """An empty UUID was refused only after the lease was written (exit 2, the ledger
    changed); one with a comma was exported as two devices."""
    data = json.loads((TOPOLOGIES / "dgx-a100-mig.json").read_text())
    for instance in data["mig_instances"]:
        instance["uuid"] = None
    data["mig_instances"][0]["uuid"] = uuid
    topology = tmp_path / "mig.json"
    topology.write_text(json.dumps(data))
    done = subprocess.run(
        [sys.executable, "-m", "gpualloc", "--topology", str(topology), *command],
        capture_output=True, text=True, timeout=60, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    result = Result(done.returncode, done.stdout, done.stderr)
    _refused(result, ExitCode.TOPOLOGY_INVALID, "GPU0/MIG0's UUID", "CUDA_VISIBLE_DEVICES")
    assert not list(Path(os.environ["GPUALLOC_STATE_DIR"]).glob("ledger*.json"))


# ---- --topology: a long path, a directory that cannot be entered -------------------------------


@pytest.mark.parametrize("spec", ["/tmp/" + "a" * 5000, "a" * 5000, "a" * 5000 + ".json"])
def test_a_long_topology_is_echoed_cut(cli: Cli, spec: str) -> None:
    """A 5,000-character --topology was echoed to 500 characters."""
    result = cli("--topology", spec, "topo", "show")
    assert result.exit_code in (ExitCode.TOPOLOGY_NOT_FOUND, ExitCode.IO), result.stderr
    error = refused(result)
    assert "..." in error and error.count("a") <= 120, error


def test_a_topology_in_a_directory_that_cannot_be_entered_says_so(closed_directory: Path) -> None:
    """It said "topology file ... does not exist" (exit 3): the file is there."""
    from tests.unix_users import UserCommandLine, ensure_user

    user = ensure_user("nobody")  # skips unless root
    shutil.copy(TOPOLOGIES / "dgx1-v100.json", closed_directory / "t.json")
    cli = UserCommandLine(user)
    result = cli(user, "--topology", str(closed_directory / "t.json"), "topo", "show")
    assert result.returncode == ExitCode.IO, result.stderr
    assert result.stderr == (
        f"error: cannot read topology file {closed_directory}/t.json: the directory "
        f"{closed_directory} cannot be entered (no search permission)\n"
        "hint: give a path in a directory you may enter, or ask its owner for access\n"
    )
    assert result.stdout == ""


# ---- the lease lock of a finished job ----------------------------------------------------------


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpualloc", "--topology", "dgx1-v100", "run", *args],
        capture_output=True, text=True, timeout=60, check=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def _lease_locks() -> list[Path]:
    return sorted(Path(os.environ["GPUALLOC_STATE_DIR"]).glob("lease-*.lock"))


def _gone_soon(predicate: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_a_finished_job_leaves_no_lease_lock() -> None:
    """The lock file stayed until a later command reaped the lease (gc)."""
    _run("-n", "2", "--", "true")
    assert _gone_soon(lambda: not _lease_locks()), _lease_locks()


def test_the_lease_lock_stays_while_a_child_of_the_job_holds_it(tmp_path: Path) -> None:
    """Removed only once every process holding it is gone: a child the job left behind keeps
    the lock, the file and so the GPUs."""
    release = tmp_path / "release"
    os.mkfifo(release)
    _run("-n", "1", "--", "sh", "-c", f"cat {release} >/dev/null 2>&1 &")
    (lock,) = _lease_locks()
    time.sleep(0.3)  # the remover would have acted by now
    assert lock.exists()
    from gpualloc.ledger.liveness import lock_held

    assert lock_held(lock)
    with release.open("w"):  # the child reads to the end and exits
        pass
    assert _gone_soon(lambda: not lock.exists())


# ---- nvidia-smi -L with a GPU twice ------------------------------------------------------------


@pytest.mark.parametrize("first", ["0", "1", "99"])
def test_a_gpu_list_out_of_order_is_a_parse_error(cli: Cli, tmp_path: Path, first: str) -> None:
    """Two 'GPU 0' lines (or a list starting at 1) were an internal error with --mig alone
    (exit 1), and with a topo -m file gave every name and UUID to GPU 0."""
    listed = tmp_path / "L.txt"
    listed.write_text(
        f"GPU {first}: NVIDIA A100-SXM4-40GB (UUID: GPU-1)\n"
        "  MIG 1g.5gb      Device  0: (UUID: MIG-a)\n"
        "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-2)\n"
    )
    line = 1 if first != "0" else 3
    result = cli("topo", "import", "--mig", str(listed))
    _refused(result, ExitCode.TOPOLOGY_PARSE, f"L.txt, line {line}: GPU", "comes next")


def test_a_mig_device_listed_twice_is_a_parse_error(cli: Cli, tmp_path: Path) -> None:
    """A MIG line twice was an internal error (ValueError: listed twice)."""
    line = "  MIG 1g.5gb      Device  0: (UUID: MIG-a)\n"
    listed = tmp_path / "L.txt"
    listed.write_text("GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-1)\n" + line + line)
    result = cli("topo", "import", "--mig", str(listed))
    _refused(result, ExitCode.TOPOLOGY_PARSE, "GPU0/MIG0 is listed twice")


# ---- long and huge option values ---------------------------------------------------------------


def test_a_memory_size_of_400_digits_is_refused(cli: Cli) -> None:
    """``--mem 999...9G`` was infinity, and int() of it an internal error (exit 1)."""
    result = cli("--topology", "dgx1-v100", "alloc", "--shareable", "--mem", "9" * 400 + "G")
    _refused(result, ExitCode.USAGE, "is more memory than any GPU has")


@pytest.mark.parametrize(
    "args",
    [
        ["alloc", "--shareable", "--mem", "a" * 3000],
        ["alloc", "--shareable", "--mem", "9" * 3000],
        ["plan", "--mig", "a" * 3000],
    ],
)
def test_a_long_option_value_is_echoed_cut(cli: Cli, args: list[str]) -> None:
    """--mem and --mig said a 3,000-character value back whole (to 500 characters)."""
    _refused(cli("--topology", "dgx1-v100", *args), ExitCode.USAGE)
    result = cli("--topology", "dgx-a100-mig", "plan", "--mig", "9" * 3000 + "g.5gb")
    _refused(result, ExitCode.USAGE, "is neither a MIG profile nor a MIG device")
    result = cli("--topology", "dgx-a100-mig", "plan", "--mig", "MIG-" + "a" * 3000)
    _refused(result, ExitCode.NO_PLACEMENT, "no MIG device here is MIG-aaa")


def test_a_long_variable_value_is_echoed_cut(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUALLOC_NO_SLURM", "a" * 3000)
    _refused(cli("--topology", "dgx1-v100", "status"), ExitCode.CONFIG, "GPUALLOC_NO_SLURM = 'a")


def test_a_long_value_click_refuses_is_echoed_cut(cli: Cli) -> None:
    _refused(cli("--install-completion", "a" * 5000), ExitCode.USAGE)


def test_a_long_state_directory_is_echoed_cut(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """'cannot inspect state directory' said a 336-character name whole."""
    monkeypatch.setenv("GPUALLOC_STATE_DIR", "/tmp/" + "n" * 300 + "/x")
    result = cli("--topology", "dgx1-v100", "alloc", "--hold")
    _refused(result, ExitCode.IO, "state directory /tmp/nnn")
    assert "n" * 121 not in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["alloc", "--hold", "--format", "a" * 3000],
        ["alloc", "--wait", "--priority", "a" * 3000],
        ["run", "--numa", "a" * 3000, "--", "true"],
        ["topo", "export", "--format", "a" * 3000],
        ["plan", "--exclude", "a" * 3000],
        ["slurm", "gres-conf", "--gpu-type", "a" * 3000 + "\n"],
    ],
)
def test_a_long_choice_is_echoed_cut(cli: Cli, args: list[str]) -> None:
    """--format, --priority, --numa, --exclude and --gpu-type said a long value back whole."""
    _refused(cli("--topology", "dgx-a100-mig", *args), ExitCode.USAGE)


def test_a_long_idle_is_echoed_cut(cli: Cli) -> None:
    _refused(cli("--topology", "dgx1-v100", "status", "--idle", "a" * 3000), ExitCode.USAGE)


def test_a_long_pattern_is_echoed_cut(cli: Cli) -> None:
    result = cli("--topology", "dgx1-v100", "plan", "-n", "2", "--pattern", "a" * 3000)
    _refused(result, ExitCode.USAGE, "unknown pattern")


# ---- an error quoting megabytes ----------------------------------------------------------------


def test_an_error_quoting_megabytes_is_written_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pattern file whose second edge is a list of a million numbers: its error quoted the
    list whole, and escaping all of it before cutting it to 500 characters could take longer
    than the harness's 5 s bound."""
    from tests import fuzz_harness
    from tests.fuzz_harness import check

    monkeypatch.setattr(fuzz_harness, "CASE_TIMEOUT_S", 2.0)
    pattern = tmp_path / "pattern.json"
    pattern.write_text(json.dumps([[0, 1], [1, 2] * 500_000]))
    args = ["--topology", "dgx1-v100", "plan", "-n", "3", "--pattern", str(pattern)]
    assert check(args, tmp_path).exit_code == ExitCode.USAGE


def test_printable_escapes_only_what_it_shows() -> None:
    from gpualloc.model.printable import printable

    class Counted(str):
        def __iter__(self):  # type: ignore[override]
            for read, char in enumerate(str.__iter__(self)):
                assert read <= 1000, "read past what is shown"
                yield char

    assert printable(Counted("\x1b" + "x" * 10**6), 500) == "\\x1b" + "x" * 493 + "..."


# ---- --bandwidth-table naming a pipe (a shell's <(...)) or a directory --------------------------


@pytest.mark.parametrize("kind", ["fifo", "directory", "missing"])
def test_a_bandwidth_table_that_is_no_file_says_what_it_is(
    cli: Cli, tmp_path: Path, kind: str
) -> None:
    """``--bandwidth-table <(...)`` said "/dev/fd/63 does not exist or is not a file"."""
    path = tmp_path / "table"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    result = cli("--bandwidth-table", str(path), "plan", "-n", "2")
    assert result.exit_code == ExitCode.IO, result.stderr
    said = {"fifo": "is a FIFO, not a regular file", "directory": "is a directory, not a regular"}
    assert f"error: bandwidth table {path} {said.get(kind, 'does not exist')}" in result.stderr


def test_an_unknown_policy_of_alloc_is_said_back_cut(cli: Cli) -> None:
    """``alloc --hold --policy`` of 3,000 characters was echoed to 500 (the long fuzz, CI)."""
    result = cli("--topology", "dgx1-v100", "alloc", "--hold", "--policy", "a" * 3000)
    assert result.exit_code == ExitCode.USAGE, result.stderr
    error = refused(result)
    assert "..." in error and error.count("a") <= 130, error


def test_an_unknown_score_model_is_said_back_cut(cli: Cli) -> None:
    """A 3,000-character --score was said back whole (found by test_fuzz_inputs' option cases
    on a developer's run: CI replays the same examples, a developer's run tries new ones)."""
    result = cli("-t", "dgx1-v100", "alloc", "--hold", "--score", "a" * 3000)
    _refused(result, ExitCode.USAGE, "unknown --score")


def test_a_pattern_naming_a_pair_twice_is_refused_at_the_door(cli: Cli, tmp_path: Path) -> None:
    """``[[0, 1], [1, 0], [0, 2]]`` over three ranks was an internal error once the tie rule
    searched a narrowed pool (the order search assumes one edge a pair beyond the 2-GPU ring,
    which counts its pair twice by MAPA's convention and stays allowed)."""
    twice = tmp_path / "twice.json"
    twice.write_text('{"edges": [[0, 1], [1, 0], [0, 2]]}')
    result = cli("-t", "dgx1-v100", "plan", "-n", "3", "--pattern", str(twice))
    _refused(result, ExitCode.USAGE, "edge #1 (1, 0) names ranks 0 and 1 again")
    pair = tmp_path / "pair.json"
    pair.write_text("[[0, 1], [1, 0]]")
    assert cli("-t", "dgx1-v100", "plan", "-n", "2", "--pattern", str(pair)).exit_code == 0
