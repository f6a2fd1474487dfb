"""Hostile input, generated: every file a user names and every option and variable a
user sets, fed random and hostile values, must end in a documented exit code (never 1, an
internal error), at most an ``error:`` line, its details and a ``hint:`` line of bounded length,
no change to the ledger when refused, and no hang.

Each case runs gpualloc in this process through the real entry point (``run`` only with
``--dry-run``: it execs otherwise), in a state directory and configuration of its own, under an
alarm (:mod:`tests.fuzz_harness` holds the rules, shared with the other fuzzing tests). The
fast loop tries a few hundred cases; the slow tests try 600 more (``pytest -m slow -k fuzz``;
``GPUALLOC_FUZZ_EXAMPLES`` sets how many each).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpualloc.config import SETTINGS
from tests import fuzz_harness
from tests.fuzz_harness import FAST, LONG, Hung
from tests.fuzz_values import FILE_KINDS, make


def _check(
    args: list[str], workdir: Path, env: dict[str, str] | None = None, *, typed: list[str] = ()
) -> int:
    """Run ``gpualloc ARGS`` and hold it to the harness's rules (:mod:`tests.fuzz_harness`).
    ``typed``: values an earlier command of the case gave, which this one may say back (a
    lease named ``nan`` is released by that name)."""
    return fuzz_harness.check(args, workdir, env, typed=typed).exit_code


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
            path = make(workdir / f"input{suffix}", kind, data)
            args = [str(path) if arg == "{f}" else arg for arg in command]
        else:  # a configuration file
            config = workdir / ("config/gpualloc" if which == "user" else "etc")
            config.mkdir(parents=True)
            make(config / "config.toml", kind, data)
            args = list(command)
        code = _check(args, workdir)
        if code == 0 and "alloc" in args:
            _check(["-t", args[1], "release", "--mine"], workdir, typed=args)


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
            _check(["-t", "dgx1-v100", "release", "--mine"], workdir, typed=args)


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
            _check([*topology, "release", "--mine"], workdir, env, typed=list(env.values()))


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
    import time

    from gpualloc.cli import main

    def internal(args):
        raise RuntimeError("boom")

    monkeypatch.setattr(main, "_dispatch", internal)
    with pytest.raises(AssertionError):
        _check(["--help"], tmp_path)
    monkeypatch.setattr(main, "_dispatch", lambda args: time.sleep(30))
    monkeypatch.setattr(fuzz_harness, "CASE_TIMEOUT_S", 0.2)
    with pytest.raises(Hung):
        _check(["--help"], tmp_path)


@pytest.mark.parametrize(
    ("printed", "error", "writes", "typed", "rule"),
    [
        ("rate: nan GB/s\n", None, False, "", "non-finite"),
        ('{"rate": NaN}\n', None, False, "", "NaN in JSON output"),
        ("", "bad value " + "a" * 300, False, "a" * 300, "echoes over 150 characters"),
        ("", "refused", True, "", "changed on a refusal"),
        ("", None, False, "error: ", "an error with exit 0"),
    ],
)
def test_the_rules_of_issue_42_fail_what_they_must(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    printed: str,
    error: str | None,
    writes: bool,
    typed: str,
    rule: str,
) -> None:
    """Each of the harness's rules fails a command that breaks it."""
    import sys

    from gpualloc.cli import main
    from gpualloc.errors import RequestError

    def command(args: list[str]) -> int:
        if writes:
            (tmp_path / "state" / "ledger.json").write_text("changed")
        sys.stdout.write(printed)
        if typed == "error: ":
            sys.stderr.write("error: said, but exit 0\n")
        if error:
            raise RequestError(error)
        return 0

    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "ledger.json").write_text("before")
    monkeypatch.setattr(main, "_dispatch", command)
    with pytest.raises(AssertionError, match=rule):
        fuzz_harness.check(["--help", typed] if typed.startswith("a") else ["--help"], tmp_path)
