"""The command-line fast path reads exactly what typer reads, or leaves the line to typer.

Three nets: the option table against typer's declarations (names, flags, types, ranges,
environment variables); the work functions' signatures against the typer commands'; and the
same command lines through both paths (a fixed corpus and generated ones), where every line the
fast path takes must reach the work function with the values typer would have passed.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st

from gpualloc.cli import fastpath, jobs, leases, run
from gpualloc.cli.app import app
from gpualloc.cli.main import run as main
from gpualloc.cli.state import STATE

WORK = {"run": jobs.run_job, "alloc": jobs.alloc_gpus, "release": jobs.release_gpus}
TYPER_COMMANDS = {
    "run": run.run_command,
    "alloc": leases.alloc_command,
    "release": leases.release_command,
}
LEFT_TO_TYPER = {"--version", "--manual", "--install-completion", "--show-completion"}
"""Typer's own global options (--help is not a parameter at all)."""


def _click_group() -> Any:
    return typer.main.get_command(app)


def _is_option(param: Any) -> bool:
    return hasattr(param, "is_flag")  # click's Option and typer's own (typer 0.20 and later)


def _kind(param: Any) -> tuple[str, float | None, float | None]:
    """A typer option's type as the fast path names it, with its range (typer >= 0.20 keeps the
    annotation; older typer, a click type)."""
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is not None:
        annotation = descriptor.annotation
        low, high = param.min, param.max
    else:
        names = {"IntRange": int, "INT": int, "FloatRange": float, "FLOAT": float}
        annotation = names.get(type(param.type).__name__) or {
            "integer": int, "float": float, "path": Path, "text": str
        }[param.type.name]  # fmt: skip
        low, high = getattr(param.type, "min", None), getattr(param.type, "max", None)
    kinds = {int: "int", float: "float", Path: "path", str: "str"}
    return kinds[annotation], low, high


def _check_options(params: list[Any], table: tuple[fastpath.Option, ...]) -> set[str]:
    """Each option the table has is typer's, read the same way; returns typer's names the
    table leaves out."""
    by_name = {name: option for option in table for name in option.names}
    left_out = set()
    covered = set()
    for param in params:
        if not _is_option(param):
            continue
        names = [*param.opts, *param.secondary_opts]
        if not any(name in by_name for name in names):
            left_out.update(names)
            continue
        assert not param.multiple and param.nargs == 1, param.name
        for name in param.opts:
            option = by_name[name]
            covered.add(name)
            assert option.dest == param.name, name
            assert option.envvar == param.envvar, name
            if param.is_flag:
                assert (option.kind, option.flag_value) == ("flag", True), name
            else:
                assert (option.kind, option.minimum, option.maximum) == _kind(param), name
        for name in param.secondary_opts:
            covered.add(name)
            assert by_name[name].dest == param.name and by_name[name].kind == "flag", name
            assert by_name[name].flag_value is False, name
    assert covered == set(by_name), set(by_name) - covered
    return left_out


def test_the_global_options_are_typers() -> None:
    left_out = _check_options(_click_group().params, fastpath.GLOBAL_OPTIONS)
    assert left_out == LEFT_TO_TYPER


@pytest.mark.parametrize("name", sorted(fastpath.COMMANDS))
def test_each_command_option_is_typers(name: str) -> None:
    command = _click_group().commands[name]
    spec = fastpath.COMMANDS[name]
    assert _check_options(command.params, spec.options) == set()
    arguments = [p for p in command.params if not _is_option(p)]
    if spec.arguments == "none":
        assert arguments == []
    else:
        (argument,) = arguments
        assert argument.name == spec.argument_dest and argument.nargs == -1
        assert argument.required == (spec.arguments == "command")
    interspersed = command.context_settings.get(
        "allow_interspersed_args", command.allow_interspersed_args
    )
    assert interspersed == (spec.arguments != "command")


def _parameters(function: Any) -> dict[str, inspect.Parameter]:
    """A work function's options: its keyword parameters (``job`` is the bundle)."""
    return {name: p for name, p in inspect.signature(function).parameters.items() if name != "job"}


@pytest.mark.parametrize("name", sorted(WORK))
def test_the_work_takes_exactly_the_typer_commands_parameters(name: str) -> None:
    """A typer command's parameters are the job's options it takes (JobOptions: one
    definition) and its work function's own, with the same defaults."""
    from msgspec import structs

    from gpualloc.placement.options import JobOptions

    declared = inspect.signature(TYPER_COMMANDS[name]).parameters
    work = _parameters(WORK[name])
    job_fields = {f.name: f.default for f in structs.fields(JobOptions)}
    takes_job = "job" in inspect.signature(WORK[name]).parameters
    expected = set(work) | (set(declared) & set(job_fields) if takes_job else set())
    assert set(declared) == expected
    assert not set(work) & set(job_fields)  # each option belongs to one of them
    for parameter, value in declared.items():
        default = work[parameter].default if parameter in work else job_fields[parameter]
        assert value.default == default, parameter
        if parameter in work:
            assert work[parameter].kind is inspect.Parameter.KEYWORD_ONLY


# ---- the same command lines through both paths -------------------------------------------------


class Called(BaseException):
    """Raised by the stand-in work function, carrying what it was given (a BaseException,
    so that the error boundary lets it through)."""

    def __init__(self, name: str, values: dict[str, Any]) -> None:
        super().__init__(name)
        self.name = name
        self.values = values


def _outcome(args: list[str], *, fast: bool) -> tuple[str, Any]:
    """What ``gpualloc ARGS`` does up to the work: ("work", (name, values, global options))
    or ("exit", code)."""
    from msgspec import structs

    with pytest.MonkeyPatch.context() as patch:
        for name, function in WORK.items():
            defaults = {key: p.default for key, p in _parameters(function).items()}

            def stand_in(
                job: Any = None, *, _name: str = name, _defaults: dict = defaults, **values: Any
            ) -> None:
                bundled = structs.asdict(job) if job is not None else {}
                raise Called(_name, {**bundled, **_defaults, **values})

            patch.setattr(jobs, function.__name__, stand_in)
        if not fast:
            patch.setattr(fastpath, "parse", lambda args, environ: None)
        try:
            main(list(args))
        except Called as call:
            state = (STATE.topology, STATE.bandwidth_table, STATE.refresh, STATE.debug)
            return "work", (call.name, call.values, state)
        except SystemExit as exc:
            return "exit", exc.code
    raise AssertionError("neither the work nor an exit")


def _same_through_both(args: list[str]) -> bool:
    """Both paths agree; True when the fast path took the line."""
    command = fastpath.parse(list(args), os.environ)
    through_typer = _outcome(args, fast=False)
    if command is not None:
        if command.name in WORK:  # the others (status, from '-t run status') really run
            assert through_typer[0] == "work", (args, through_typer)
        assert _outcome(args, fast=True) == through_typer, args
    return command is not None


TAKEN = [
    ["run", "--", "true"],
    ["run", "true"],
    ["run", "-n", "2", "--sensitive", "--", "python", "train.py", "-n", "3"],
    ["run", "-n2", "python", "-u", "x.py"],
    ["run", "--num-gpus=3", "--policy", "drb", "--min-utility", "0.5", "--", "a"],
    ["run", "-q", "--numa", "none", "--insensitive", "--sensitive", "--", "a", "--", "b"],
    ["run", "--wait", "--timeout", "5m", "--priority", "low", "--max-bypass", "0", "--", "x"],
    ["run", "--dry-run", "--json", "--gpus", "3,1", "--uuid", "--", "x"],
    ["run", "--name", "", "--", "x"],
    ["run", "--", "-x"],
    ["-t", "dgx1-v100", "--refresh", "--debug", "run", "--", "x"],
    ["--topology=dgx2", "alloc"],
    ["alloc", "--hold", "--format", "json", "-n", "2", "--exclude", "0-3", "--require", "7"],
    ["alloc", "--pid", "1234", "--heed-foreign", "--ignore-foreign", "--score", "mapa"],
    ["alloc", "--drb-weights", "1,0,0", "--min-bandwidth", "0", "--pattern", "all", "--"],
    ["release", "abcd", "--json", "ef01"],
    ["release", "--mine"],
    ["release"],
    ["release", "--", "--mine"],
]
LEFT = [
    ["--help"],
    ["run", "--help"],
    ["alloc", "-h"],
    ["--version"],
    ["run"],
    ["run", "--"],
    ["run", "-n", "0", "--", "x"],
    ["run", "-n", "x", "--", "x"],
    ["run", "-n", "-2", "--", "x"],
    ["run", "--min-utility", "1.5", "--", "x"],
    ["run", "--wait=1", "--", "x"],
    ["run", "-qn", "2", "--", "x"],
    ["run", "--name", "--", "x"],
    ["run", "-t", "dgx2", "--", "x"],
    ["run", "--nonsense", "--", "x"],
    ["alloc", "extra"],
    ["alloc", "--", "extra"],
    ["alloc", "-n"],
    ["simulate"],
    ["-t"],
    ["--bogus", "run", "--", "x"],
    [],
]


@pytest.mark.parametrize("args", TAKEN, ids=" ".join)
def test_lines_the_fast_path_takes_reach_the_work_as_through_typer(args: list[str]) -> None:
    assert _same_through_both(args)


@pytest.mark.parametrize("args", LEFT, ids=" ".join)
def test_help_errors_and_other_commands_are_left_to_typer(args: list[str]) -> None:
    assert fastpath.parse(list(args), {}) is None


TOKENS = [
    *{name for spec in fastpath.COMMANDS.values() for o in spec.options for name in o.names},
    *{name for o in fastpath.GLOBAL_OPTIONS for name in o.names},
    "run", "alloc", "release", "status", "--", "-", "-h", "--help",
    "0", "1", "2", "-1", "1.5", "x", "", "ring", "none", "json", "3,1", "abcd",
    "-n2", "-n0", "--num-gpus=2", "--wait=1", "-qn", "--name=", "--min-utility=0.2",
    "-tdgx2", "--topology=dgx2", "--max-bypass=-1",
]  # fmt: skip


LINES = st.sampled_from(["run", "alloc", "release", "-t"]).flatmap(
    lambda first: st.lists(st.sampled_from(TOKENS), max_size=7).map(lambda rest: [first, *rest])
)


@settings(max_examples=40, deadline=None)
@given(args=LINES)
def test_generated_lines_agree_or_go_to_typer(args: list[str]) -> None:
    _same_through_both(args)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(args=LINES)
def test_many_generated_lines_agree_or_go_to_typer(args: list[str]) -> None:
    """The fast loop tries 40 lines; the whole suite tries 300 more."""
    _same_through_both(args)


def test_the_topology_variable_is_read_as_click_reads_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GPUALLOC_TOPOLOGY", "dgx2")
    assert (
        fastpath.parse(["run", "--", "x"], {"GPUALLOC_TOPOLOGY": "dgx2"}).global_values["topology"]
        == "dgx2"
    )
    assert _same_through_both(["run", "--", "x"])
    assert _same_through_both(["-t", "hgx-h100", "run", "--", "x"])


@pytest.mark.parametrize("value", ["true", "yes", "2", "on"])
def test_debug_words_other_than_0_and_1_go_to_typer(value: str) -> None:
    assert fastpath.parse(["run", "--", "x"], {"GPUALLOC_DEBUG": value}) is None
    assert fastpath.parse(["run", "--", "x"], {"GPUALLOC_DEBUG": "1"}) is not None


def test_completion_requests_go_to_typer() -> None:
    assert fastpath.parse(["run", "--", "x"], {fastpath.COMPLETION_VARIABLE: "bash"}) is None


def test_a_missing_bandwidth_table_is_the_same_error_on_both_paths(
    tmp_path: Path, cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = ["--bandwidth-table", str(tmp_path / "none.json"), "-t", "dgx2", "alloc"]
    fast = cli(*args)
    monkeypatch.setattr(fastpath, "parse", lambda args, environ: None)
    slow = cli(*args)
    assert (fast.exit_code, fast.stderr) == (slow.exit_code, slow.stderr)
    assert "does not exist" in fast.stderr


@pytest.mark.slow
def test_the_fast_path_imports_neither_typer_nor_pydantic_nor_the_brokers_client(
    tmp_path: Path,
) -> None:
    probe = (
        "import sys, json\n"
        "from gpualloc.cli.main import run\n"
        "try:\n    run(['-t', 'dgx1-v100', 'alloc', '--hold'])\nexcept SystemExit:\n    pass\n"
        "heavy = ['typer', 'click', 'pydantic', 'rich', 'networkx', 'psutil', 'pynvml',\n"
        "         'socket', 'gpualloc.wire.client',  # no broker here: not its client either\n"
        "         'shutil', 'hashlib', 'typing_extensions', 'inspect', 'platform',\n"
        "         'gpualloc.cli.static_help']\n"
        "sys.stderr.write(json.dumps([m for m in heavy if m in sys.modules]))\n"
    )
    env = {**os.environ, "GPUALLOC_STATE_DIR": str(tmp_path)}
    env.pop("GPUALLOC_BROKER", None)
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.stdout.strip() == "0"
    assert json.loads(result.stderr.splitlines()[-1]) == []


def test_the_typer_path_still_does_the_work(cli: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fastpath, "parse", lambda args, environ: None)
    held = cli("-t", "dgx2", "alloc", "--hold", "-n", "2")
    assert held.exit_code == 0 and held.stdout.strip() == "0,1"
    planned = cli("-t", "dgx2", "run", "--dry-run", "--json", "--", "true")  # run itself execs
    assert planned.exit_code == 0 and json.loads(planned.stdout)["placement"]["gpus"] == [2]
    released = cli("-t", "dgx2", "release", "--mine")
    assert released.exit_code == 0 and "released GPU 0-1" in released.stdout


# ---- every other command: the table made from typer's tree ---------------------------------------

EAGER = {"version", "manual", "install_completion", "show_completion"}
GLOBAL_DEFAULTS = {"topology": None, "bandwidth_table": None, "refresh": False, "debug": False}


def _typer_reads(args: list[str]) -> tuple[str, dict, dict] | None:
    """What typer makes of ``gpualloc ARGS`` up to the command function: the command's path,
    the global options and the function's values (as typer's wrapper passes them); None when
    typer refuses the line or answers it itself."""
    click = sys.modules[typer.BadParameter.__module__]  # typer's click, vendored or not
    root = _click_group()
    try:
        context = root.make_context("gpualloc", list(args))
        global_values = {k: v for k, v in context.params.items() if k not in EAGER}
        command, path = root, []
        while hasattr(command, "commands"):
            rest = [*getattr(context, "_protected_args", ()), *context.args]
            if not rest:
                return None
            name, command, rest = command.resolve_command(context, rest)
            path.append(name)
            context = command.make_context(name, rest, parent=context)
    except (click.ClickException, click.Exit, typer.Exit):
        return None
    values = {}
    for param in command.params:
        value = context.params[param.name]
        if value is not None and (param.multiple or param.nargs == -1):
            value = None if param.default is None and not value else list(value)
        values[param.name] = value
    return " ".join(path), global_values, values


def _fast_reads(args: list[str]) -> tuple[str, dict, dict] | None:
    command = fastpath.parse(list(args), os.environ)
    if command is None:
        return None
    return command.name, {**GLOBAL_DEFAULTS, **command.global_values}, command.values


def _read_alike(args: list[str]) -> bool:
    """Typer reads every line the fast path takes as it does; True when it took it."""
    fast = _fast_reads(args)
    if fast is not None:
        assert _typer_reads(args) == fast, args
    return fast is not None


TABLE_TAKEN = [
    ["status"],
    ["status", "--json", "-w", "--interval", "0.5", "--idle", "2h"],
    ["status", "--interval=3", "--interval", "0.2"],
    ["-t", "dgx2", "--refresh", "gc", "--json"],
    ["topo", "show", "--json"],
    ["--topology=dgx2", "topo", "list"],
    ["doctor", "--measured", "a.txt", "--json", "--measured", "b.txt"],
    ["metrics"],
    ["metrics", "--serve", "127.0.0.1:9400"],
    ["plan", "-n", "2", "--busy", "0", "--explain"],
    ["plan", "-n2", "--insensitive", "--sensitive", "--compare", "--json", "--pattern", "all"],
    ["slurm", "gres-conf", "--node", "n1", "--threads-per-core", "2", "--device-dir", ""],
    ["slurm", "prolog"],
    ["topo", "import", "nvidia-smi.txt", "--name", "x", "--mig", "a", "--mig", "b"],
    ["topo", "import", "--json", "--", "-odd-name.txt"],
    ["topo", "export", "--format", "gexf", "-o", "out.gexf"],
    ["topo", "record", "--output=", "--output", "x.json"],
    ["serve", "--socket", "/tmp/x", "--background", "--heed-foreign"],
    ["calibrate", "--from", "x", "--no-collectives", "--repeats", "2", "--from", "y"],
    ["config", "show", "--json"],
]
TABLE_LEFT = [
    ["status", "--interval", "0.1"],
    ["status", "--interval", "x"],
    ["status", "--interval", "nan"],
    ["status", "extra"],
    ["status", "-h"],
    ["status", "--json=1"],
    ["status", "-wq"],
    ["topo"],
    ["topo", "bogus"],
    ["topo", "--json", "show"],
    ["topo", "import", "a", "b"],
    ["slurm", "gres-conf", "--threads-per-core", "0"],
    ["doctor", "--measured"],
    ["plan", "-n", "\u0663"],
    ["simulate", "--generate", "x"],
    ["--version", "status"],
    ["--manual"],
]


def test_the_table_takes_the_commands_whose_modules_import_no_typer() -> None:
    table = fastpath.table_commands()
    assert {
        "status",
        "gc",
        "plan",
        "topo show",
        "topo list",
        "doctor",
        "metrics",
        "config show",
    } <= set(table)
    assert not set(table) & {"run", "alloc", "release", "simulate"}


@pytest.mark.parametrize("args", TABLE_TAKEN, ids=" ".join)
def test_table_lines_reach_the_command_as_through_typer(args: list[str]) -> None:
    assert _read_alike(args)


@pytest.mark.parametrize("args", TABLE_LEFT, ids=" ".join)
def test_table_lines_typer_refuses_or_answers_are_left_to_it(args: list[str]) -> None:
    assert fastpath.parse(list(args), {}) is None


def test_a_path_is_left_for_gpualloc_to_check(tmp_path: Path) -> None:
    """No path option has click check it (its words, exit 2): gpualloc's reader says why a
    file cannot be read, exit 8 for every option (tests/test_user_files.py)."""
    minors = tmp_path / "mig-minors"
    assert _read_alike(["slurm", "gres-conf", "--mig-minors", str(minors)])  # missing
    assert _read_alike(["slurm", "gres-conf", "--mig-minors", str(tmp_path)])  # a directory
    minors.write_text("")
    assert _read_alike(["slurm", "gres-conf", "--mig-minors", str(minors)])


TABLE_TOKENS = [
    *{
        name
        for spec in fastpath.table_commands().values()
        for option in spec.options
        for name in option.names
    },
    "status", "gc", "topo", "show", "list", "import", "plan", "doctor", "slurm", "gres-conf",
    "--", "-", "-h", "0", "2", "-1", "0.1", "1.5", "x", "", "nan", "2h", "a.txt", "-n2",
    "--interval=1", "--json=1", "-wq", "-ox",
]  # fmt: skip
TABLE_LINES = st.sampled_from(["status", "gc", "topo", "plan", "doctor", "slurm", "-t"]).flatmap(
    lambda first: st.lists(st.sampled_from(TABLE_TOKENS), max_size=6).map(
        lambda rest: [first, *rest]
    )
)


@settings(max_examples=60, deadline=None)
@given(args=TABLE_LINES)
def test_generated_table_lines_agree_or_go_to_typer(args: list[str]) -> None:
    _read_alike(args)


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(args=TABLE_LINES)
def test_many_generated_table_lines_agree_or_go_to_typer(args: list[str]) -> None:
    _read_alike(args)


@pytest.mark.parametrize(
    "args",
    [
        ["status", "--json"],
        ["gc", "--json"],
        ["topo", "show", "--json"],
        ["topo", "list", "--json"],
        ["plan", "-n", "2", "--json"],
        ["doctor", "--json"],
        ["metrics"],
        ["config", "show", "--json"],
    ],
    ids=" ".join,
)
def test_a_table_command_does_the_same_on_both_paths(
    args: list[str], cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    line = ["-t", "dgx1-v100", *args]
    assert fastpath.parse(line, os.environ) is not None
    fast = cli(*line)
    monkeypatch.setattr(fastpath, "parse", lambda args, environ: None)
    slow = cli(*line)
    assert (fast.exit_code, fast.stdout, fast.stderr) == (slow.exit_code, slow.stdout, slow.stderr)


def test_an_exit_status_a_command_returns_is_kept_on_both_paths(
    cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """doctor returns 17 (a check failed) instead of raising typer.Exit: no typer to import."""
    line = ["-t", "dgx1-v100", "doctor", "--json"]
    monkeypatch.setattr("gpualloc.cli.doctor._ledger_findings", lambda host: [_problem()])
    fast = cli(*line)
    monkeypatch.setattr(fastpath, "parse", lambda args, environ: None)
    slow = cli(*line)
    assert fast.exit_code == slow.exit_code == 17
    assert fast.stdout == slow.stdout


def _problem() -> Any:
    from gpualloc.checkup import Finding

    return Finding("ledger", "-", "problem", "a planted problem")


@pytest.mark.slow
def test_the_table_commands_import_neither_typer_nor_pydantic(tmp_path: Path) -> None:
    probe = (
        "import sys, json, importlib\n"
        "from gpualloc.cli import fastpath\n"
        "for spec in fastpath.table_commands().values():\n"
        "    importlib.import_module(spec.function.partition(':')[0])\n"
        "from gpualloc.cli.main import run\n"
        "try:\n    run(['-t', 'dgx1-v100', 'status'])\nexcept SystemExit:\n    pass\n"
        "heavy = ['typer', 'click', 'pydantic', 'rich']\n"
        "sys.stderr.write(json.dumps([m for m in heavy if m in sys.modules]))\n"
    )
    env = {**os.environ, "GPUALLOC_STATE_DIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120
    )
    assert "GPUs of dgx1-v100" in result.stdout
    assert json.loads(result.stderr.splitlines()[-1]) == []


def test_the_table_ships_in_the_wheel() -> None:
    """Without its table an installed gpualloc would still work, through typer: slowly."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the tomli dependency
        import tomli as tomllib

    pyproject = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    shipped = pyproject["tool"]["setuptools"]["package-data"]["gpualloc.cli"]
    assert Path(fastpath.TABLE_FILE).name in shipped


def test_the_groups_that_show_their_help_when_given_nothing_are_the_pages() -> None:
    """static_help decides a one-word line without reading its pages."""
    from gpualloc.cli import static_help

    pages = json.loads(Path(static_help.PAGES_FILE).read_text())
    assert {path for path, page in pages.items() if page["group"]} == static_help.GROUPS
