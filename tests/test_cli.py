"""The command line's grammar, through the real entry point (in-process): what a command line
means (``-nVALUE``, ``--opt=value``, short flags together, ``--``), a usage error as one error
and a hint line (exit 2), and each command function taking exactly its declared parameters.

The help pages are ``test_cli_help.py``'s; topologies through the command line,
``test_cli_topo.py``'s."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpualloc.errors import ExitCode
from tests.cli_harness import Result
from tests.house_rules import refused

Cli = Callable[..., Result]


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
