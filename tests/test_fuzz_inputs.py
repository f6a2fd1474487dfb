"""Hostile input, generated (issue 30): every file a user names and every option and variable a
user sets, fed random and hostile values, must end in a documented exit code (never 1, an
internal error), at most an ``error:`` line, its details and a ``hint:`` line of bounded length,
no change to the ledger when refused, and no hang.

Each case runs gpualloc in this process through the real entry point (``run`` only with
``--dry-run``: it execs otherwise), in a state directory and configuration of its own, under an
alarm that fails the case after :data:`CASE_TIMEOUT_S`. The fast loop tries a few hundred
cases; the slow tests try 600 more (``pytest -m slow -k fuzz``; ``GPUALLOC_FUZZ_EXAMPLES``
sets how many each).
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpualloc.config import SETTINGS
from gpualloc.errors import ExitCode
from gpualloc.topologies import load_bundled
from tests.conftest import run_in_process

CASE_TIMEOUT_S = 20
MAX_LINE = 2000
DOCUMENTED = {int(code) for code in ExitCode} - {ExitCode.INTERNAL}
IN_CI = os.environ.get("CI") == "true"
"""CI tries the same cases every time (a landing gate must not depend on luck); a developer's
run explores new ones, and what it finds becomes a fix and a fixed test."""
FAST = settings(
    max_examples=60,
    deadline=None,
    derandomize=IN_CI,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
LONG_EXAMPLES = int(os.environ.get("GPUALLOC_FUZZ_EXAMPLES", "200"))
"""Cases of each slow test (CI: 200; ``GPUALLOC_FUZZ_EXAMPLES`` for a longer hunt)."""
LONG = settings(
    max_examples=LONG_EXAMPLES,
    deadline=None,
    derandomize=IN_CI,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

TOPOLOGY_JSON = load_bundled("dgx1-v100").to_json()
FILE_KINDS = (
    "empty", "binary", "huge", "truncated-json", "wrong-json", "text", "fifo", "dev-zero",
    "directory", "symlink-to-directory", "dangling-symlink", "missing", "topology", "bytes",
)  # fmt: skip
WRONG_JSON = ("[]", '"x"', "1", "null", '{"gpus": "x"}', '{"schema_version": 99}', "{}")


class Hung(BaseException):
    """The case ran past its alarm (a BaseException: gpualloc's error boundary lets it by)."""


@contextlib.contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    def ring(signum, frame):
        raise Hung(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _make(path: Path, kind: str, data: bytes) -> Path:
    """A file (or something else) of ``kind`` at ``path``."""
    if kind == "empty":
        path.write_bytes(b"")
    elif kind in ("binary", "bytes"):
        path.write_bytes(data)
    elif kind == "huge":
        with path.open("wb") as file:
            file.truncate(65 * 2**20)
    elif kind == "truncated-json":
        path.write_text(TOPOLOGY_JSON[: len(data) * 37 % len(TOPOLOGY_JSON)])
    elif kind == "wrong-json":
        path.write_text(WRONG_JSON[len(data) % len(WRONG_JSON)])
    elif kind == "text":
        path.write_text(data.decode("latin-1"))
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    elif kind == "symlink-to-directory":
        path.symlink_to(path.parent)
    elif kind == "dangling-symlink":
        path.symlink_to(path.parent / "nowhere")
    elif kind == "topology":
        path.write_text(TOPOLOGY_JSON)
    return path  # "missing": nothing there


def _state(directory: Path) -> dict[str, bytes]:
    """Every file of the state directory, and its bytes."""
    if not directory.exists():
        return {}
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and not p.name.endswith(".lock")
    }


def _check(args: list[str], workdir: Path, env: dict[str, str] | None = None) -> int:
    """Run ``gpualloc ARGS`` and hold it to the rules of the module docstring."""
    state_dir = workdir / "state"
    before = _state(state_dir)
    settings_env = {
        "GPUALLOC_STATE_DIR": str(state_dir),
        "GPUALLOC_CACHE_DIR": str(workdir / "cache"),
        "XDG_CONFIG_HOME": str(workdir / "config"),
        "GPUALLOC_SYSTEM_CONFIG": str(workdir / "etc" / "config.toml"),
        **(env or {}),
    }
    with _environment(settings_env), _alarm(CASE_TIMEOUT_S):
        result = run_in_process(args)
    from gpualloc.cli.state import STATE

    code = result.exit_code
    stderr = result.stderr
    assert code in DOCUMENTED | {0}, (args, env, code, stderr)
    if STATE.debug:
        return code  # --debug / GPUALLOC_DEBUG=1 asks for the traceback
    lines = stderr.splitlines()
    assert all(len(line) <= MAX_LINE for line in lines), (args, env, "long line")
    if code != 0:
        errors = [i for i, line in enumerate(lines) if line.startswith("error: ")]
        assert errors, (args, env, code, stderr)
        said = lines[errors[0] :]
        assert len(errors) == 1 and all(line.startswith(("  ", "hint: ")) for line in said[1:]), (
            args,
            env,
            stderr,
        )
        assert sum(line.startswith("hint: ") for line in said) <= 1, (args, env, stderr)
        assert "Traceback" not in stderr
        assert _state(state_dir) == before, (args, env, "the ledger changed on a refusal")
    return code


# ---- files a user names ------------------------------------------------------------------------

FILE_COMMANDS = (
    ["-t", "{f}", "topo", "show"],
    ["-t", "{f}", "alloc", "--hold", "-n", "2"],
    ["-t", "{f}", "plan", "-n", "2"],
    ["-t", "{f}", "metrics"],
    ["-t", "{f}", "doctor"],
    ["-t", "{f}", "run", "--dry-run", "--", "true"],
    ["--bandwidth-table", "{f}", "-t", "dgx1-v100", "plan", "-n", "2"],
    ["-t", "dgx1-v100", "plan", "-n", "2", "--pattern", "{f}"],
    ["-t", "dgx1-v100", "alloc", "--hold", "-n", "2", "--pattern", "{f}"],
    ["-t", "dgx1-v100", "simulate", "--trace", "{f}"],
    ["topo", "import", "{f}"],
    ["topo", "import", "--mig", "{f}"],
    ["-t", "dgx1-v100", "topo", "import", "--bandwidth-matrix", "{f}"],
    ["config", "show"],  # with {f} as the user's and the system's config file
    ["-t", "dgx1-v100", "alloc", "--hold"],  # the same
)

file_cases = st.tuples(
    st.sampled_from(FILE_COMMANDS),
    st.sampled_from(FILE_KINDS),
    st.binary(max_size=400),
    st.sampled_from(["user", "system"]),
)


def _file_case(case: tuple) -> None:
    command, kind, data, which = case
    with tempfile.TemporaryDirectory() as temporary:
        workdir = Path(temporary)
        if "{f}" in command:
            suffix = ".json" if len(data) % 2 else ".txt"
            path = _make(workdir / f"input{suffix}", kind, data)
            args = [str(path) if arg == "{f}" else arg for arg in command]
        else:  # a configuration file
            config = workdir / ("config/gpualloc" if which == "user" else "etc")
            config.mkdir(parents=True)
            _make(config / "config.toml", kind, data)
            args = list(command)
        code = _check(args, workdir)
        if code == 0 and "alloc" in args:
            _check(["-t", args[1], "release", "--mine"], workdir)


@FAST
@given(case=file_cases)
def test_files_a_user_names(case: tuple) -> None:
    _file_case(case)


@pytest.mark.slow
@LONG
@given(case=file_cases)
def test_files_a_user_names_at_length(case: tuple) -> None:
    _file_case(case)


# ---- option values -----------------------------------------------------------------------------

VALUE_OPTIONS = (
    "-n", "--exclude", "--require", "--gpus", "--mem", "--mig", "--min-utility",
    "--min-bandwidth", "--policy", "--score", "--drb-weights", "--name", "--pattern",
)  # fmt: skip
COMMANDS = (
    ["alloc", "--hold"],
    ["plan"],
    ["run", "--dry-run"],
    ["run", "--dry-run", "--share"],
    ["alloc", "--hold", "--shareable"],
    ["simulate"],
    ["status"],
    ["release", "--evict-shared", "--mine"],
)
OWN_OPTIONS = {
    "simulate": (
        "--generate", "--policy", "--queue", "--runtime", "--sharing", "--gpu-busy", "--seed",
    ),
    "status": ("--idle",),
    "release": ("--grace",),
    "run": ("--numa", "--sm-share", "--priority", "--max-bypass", "--timeout"),
    "alloc": ("--format", "--pid", "--priority", "--max-bypass", "--timeout"),
}  # fmt: skip
"""Each command's own options that take a value, besides the job's (VALUE_OPTIONS)."""
SPECIAL_VALUES = (
    "", " ", "-1", "0", "1", "2", "8", "9", "100", "1e309", "nan", "inf", "0x10", "3-1",
    "0,0", "0-7", "1,,2", "1g.5gb", "3g.20gb", "GPU0/MIG3", "MIG-x", "10G", "-5G", "0.5",
    "\x1b[31m", "a" * 3000, "日本", "ring", "mapa", "a,b,c", "1,1,1", "-0",
)  # fmt: skip
values = st.one_of(
    st.sampled_from(SPECIAL_VALUES),
    st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=40),
)


def _options_of(command: list[str]) -> tuple[str, ...]:
    own = OWN_OPTIONS.get(command[0], ())
    return own if command[0] in ("simulate", "status", "release") else (*VALUE_OPTIONS, *own)


option_cases = st.sampled_from(COMMANDS).flatmap(
    lambda command: st.tuples(
        st.just(command),
        st.lists(st.tuples(st.sampled_from(_options_of(command)), values), min_size=1, max_size=4),
    )
)


def _option_case(case: tuple) -> None:
    command, options = case
    args = ["-t", "dgx1-v100", *command]
    for option, value in options:
        args += [option, value] if not value.startswith("-") else [f"{option}={value}"]
    if command[0] == "run":
        args += ["--", "true"]
    with tempfile.TemporaryDirectory() as temporary:
        workdir = Path(temporary)
        code = _check(args, workdir)
        if code == 0 and command[0] == "alloc":
            _check(["-t", "dgx1-v100", "release", "--mine"], workdir)


@FAST
@given(case=option_cases)
def test_option_values(case: tuple) -> None:
    _option_case(case)


@pytest.mark.slow
@LONG
@given(case=option_cases)
def test_option_values_at_length(case: tuple) -> None:
    _option_case(case)


# ---- environment variables ---------------------------------------------------------------------

VARIABLES = (
    *(s.variable for s in SETTINGS if s.variable and s.variable != "GPUALLOC_STATE_DIR"),
    "GPUALLOC_TOPOLOGY",
    "GPUALLOC_DEBUG",
    "GPUALLOC_NO_SLURM",
)
"""Every variable gpualloc reads, but the state directory (a path: the harness's own)."""
variable_cases = st.tuples(
    st.sampled_from(
        (
            ["alloc", "--hold"],
            ["plan", "-n", "2"],
            ["run", "--dry-run", "--", "true"],
            ["status"],
            ["config", "show"],
            ["metrics"],
        )
    ),
    st.dictionaries(st.sampled_from(VARIABLES), values, min_size=1, max_size=3),
)


def _variable_case(case: tuple) -> None:
    command, env = case
    env = {name: value.replace("\x00", "") for name, value in env.items()}
    topology = [] if "GPUALLOC_TOPOLOGY" in env else ["-t", "dgx1-v100"]
    with tempfile.TemporaryDirectory() as temporary:
        workdir = Path(temporary)
        code = _check([*topology, *command], workdir, env)
        if code == 0 and command[0] == "alloc":
            _check([*topology, "release", "--mine"], workdir, env)


@FAST
@given(case=variable_cases)
def test_environment_variables(case: tuple) -> None:
    _variable_case(case)


@pytest.mark.slow
@LONG
@given(case=variable_cases)
def test_environment_variables_at_length(case: tuple) -> None:
    _variable_case(case)


def test_the_harness_catches_what_it_must(tmp_path: Path, monkeypatch) -> None:
    """The rules fail on the faults they are for: an internal error (exit 1) and a hang."""
    import sys
    import time

    from gpualloc.cli import main

    def internal(args):
        raise RuntimeError("boom")

    monkeypatch.setattr(main, "_static_help", internal)
    with pytest.raises(AssertionError):
        _check(["--help"], tmp_path)
    monkeypatch.setattr(main, "_static_help", lambda args: time.sleep(30))
    monkeypatch.setattr(sys.modules[__name__], "CASE_TIMEOUT_S", 0.2)
    with pytest.raises(Hung):
        _check(["--help"], tmp_path)
