"""Every option value of every command, generated: the option list is read from the
declarations themselves, so an option added later is fuzzed too, each with values of its
kind (numbers, durations, sizes, GPU lists, generator specs, addresses, paths) and hostile ones.
The rules are :mod:`tests.fuzz_harness`'s.

``run`` runs with ``--dry-run`` (it would exec), ``alloc`` with ``--hold`` (then released),
``status`` without ``--watch``, ``serve`` in the foreground with its serving loop stubbed, and
``metrics --serve`` with its HTTP loop stubbed: what is fuzzed is everything up to the loop.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz_harness import (
    LONG,
    check,
    fast,
    no_serving_loops,  # noqa: F401 - a fixture
    workspace,
)
from tests.fuzz_values import (
    OUTPUT_KINDS,
    POLICIES,
    anything,
    durations,
    floats,
    gpu_lists,
    hostile,
    input_kinds,
    input_path,
    integers,
    numbers,
    of,
    output_path,
    sizes,
    text,
)
from tests.recordings import RECORDED

TOPO_M = RECORDED / "dgx1-v100_vast_topo.txt"
BASE: dict[str, tuple[list[str], list[str]]] = {
    "": ([], ["topo", "show"]),
    "plan": (["--topology", "dgx1-v100", "plan"], []),
    "run": (["--topology", "dgx1-v100", "run", "--dry-run"], ["--", "true"]),
    "alloc": (["--topology", "dgx1-v100", "alloc", "--hold"], []),
    "release": (["--topology", "dgx1-v100", "release", "--mine"], []),
    "status": (["--topology", "dgx1-v100", "status"], []),
    "metrics": (["--topology", "dgx1-v100", "metrics"], []),
    "doctor": (["--topology", "dgx1-v100", "doctor"], []),
    "serve": (["--topology", "dgx1-v100", "serve"], []),
    "simulate": (["--topology", "dgx1-v100", "simulate"], []),
    "calibrate": (["--topology", "dgx1-v100", "calibrate"], []),
    "topo import": (["topo", "import"], []),
    "topo record": (["topo", "record"], []),
    "topo export": (["--topology", "dgx1-v100", "topo", "export"], []),
    "slurm gres-conf": (["--topology", "dgx1-v100", "slurm", "gres-conf"], []),
}
"""How each command runs around the options fuzzed (the root's: before ``topo show``)."""
SKIPPED = {("run", "command")}
OUTPUTS = {"--save-trace", "--report", "--output", "--plot"}

GENERATOR_KEYS = {
    "mapa": ("jobs", "min_gpus", "max_gpus", "min_service", "max_service", "hold", "arrival"),
    "drb": ("jobs", "rate_per_min", "max_gpus"),
    "mixed": (
        "jobs", "load", "host_gpus", "insensitive", "min_service", "max_service",
        *(f"w{size}" for size in range(1, 9)),
    ),
}  # fmt: skip
small_jobs = st.one_of(st.integers(0, 40).map(str), st.sampled_from(["2e6", "1e9", "-1", "0.5"]))
"""A job count that simulates in well under a second, or one out of bounds (refused at once):
a legitimate million jobs takes minutes, which is no hang."""
spec_values = st.one_of(numbers, hostile, st.sampled_from(["zero", "spread", "1e308", "1e300"]))
generator_specs = st.one_of(
    st.sampled_from(list(GENERATOR_KEYS)).flatmap(
        lambda name: st.lists(
            st.one_of(
                st.tuples(st.just("jobs"), small_jobs),
                st.tuples(st.sampled_from(GENERATOR_KEYS[name][1:]), spec_values),
                st.tuples(st.sampled_from(["", "x", "JOBS", "jobs "]), spec_values),
            ),
            max_size=4,
        ).map(lambda items: f"{name}:jobs=5," + ",".join(f"{k}={v}" for k, v in items))
    ),
    st.sampled_from(["mapa", "MAPA", "mapa:", "mapa:jobs", "mapa:=", "x:jobs=1", ":", "mixed::"]),
    hostile,
)
HOSTS = ("", "127.0.0.1", "[::1]", "::1", "localhost", "0.0.0.0", "[", "[]", "1")
host_ports = st.one_of(
    st.tuples(st.sampled_from(HOSTS), st.one_of(integers, hostile)).map(":".join), hostile, text
)
drb_weights = st.lists(st.one_of(numbers, hostile), min_size=1, max_size=4).map(",".join)
mig_devices = of("1g.5gb", "3g.20gb", "7g.80gb", "1c.3g.20gb", "GPU0/MIG3", "0:3", "MIG-x")

TEXT_VALUES: dict[str, st.SearchStrategy[str]] = {
    "N": anything(integers),
    "MIB": anything(integers),
    "PID": anything(integers),
    "PERCENT": anything(numbers),
    "U": anything(floats),
    "RHO": anything(floats),
    "GBPS": anything(floats),
    "SECONDS": anything(floats),
    "DURATION": anything(durations),
    "SIZE": anything(sizes),
    "LIST": anything(gpu_lists),
    "POLICY": of(*POLICIES),
    "C,I,F": anything(drb_weights),
    "PROFILE|DEVICE": mig_devices,
    "CLASS": of("high", "normal", "low"),
    "MODE": of("auto", "bind", "none"),
    "RULE": of("fifo", "backfill", "fgd", "best-fit", "first-fit", "spread"),
    "FORMAT": of("json", "env", "ids", "graphml", "gexf"),
    "SHELL": of("bash", "zsh", "fish"),
    "SPEC": generator_specs,
    "[HOST]:PORT": host_ports,
    "NAME": anything(text),
    "TYPE": anything(text),
    "[LEASE]...": anything(text),
    "MODEL": of("auto", "mapa", "bottleneck", "bandwidth", "profile", "fixed"),
    "PATTERN": of("ring", "all", "tree", "star"),
    "NAME|PATH": of("dgx1-v100", "dgx-a100-mig", "single-gpu", "DGX1-V100"),
}
"""What a text value of each metavar is drawn from."""


def _options() -> list[tuple[str, str, str]]:
    """(command, option, metavar) for every option and argument that takes a value."""
    from gpualloc.cli.commands import GLOBAL_OPTIONS, every_command

    found = []
    for name, command in [("", None), *every_command()]:
        if name not in BASE:
            continue
        for opt in command.options if command else GLOBAL_OPTIONS:
            if opt.takes_value:
                found.append((name, max(opt.names, key=len), str(opt.metavar or opt.dest)))
        argument = command.argument if command else None
        if argument is not None and (name, argument.dest) not in SKIPPED:
            found.append((name, argument.dest, argument.metavar))
    return found


OPTIONS = _options()
COMMANDS = sorted({command for command, _, _ in OPTIONS})


def _value_plan(option: str, metavar: str) -> st.SearchStrategy[tuple]:
    """How to make a value: ("text", VALUE), ("input", KIND, DATA), ("output", KIND),
    ("place", KIND) for a socket or directory to make."""
    if option in OUTPUTS:
        return st.tuples(st.just("output"), st.sampled_from(OUTPUT_KINDS))
    if metavar in ("PATH", "DIR") and option != "--device-dir":
        return st.one_of(
            st.tuples(st.just("place"), st.sampled_from(OUTPUT_KINDS)),
            st.tuples(st.just("text"), st.sampled_from(["", " ", "\x1b", "a" * 5000])),
        )
    files = st.tuples(st.just("input"), input_kinds, st.binary(max_size=200))
    if metavar in ("FILE", "[FILE]"):
        return files
    values = TEXT_VALUES.get(metavar, anything(text))
    texts = st.tuples(st.just("text"), values)
    return st.one_of(texts, files) if metavar in ("PATTERN", "NAME|PATH") else texts


option_cases = st.sampled_from(COMMANDS).flatmap(
    lambda command: st.tuples(
        st.just(command),
        st.lists(
            st.sampled_from([o for o in OPTIONS if o[0] == command]).flatmap(
                lambda o: st.tuples(st.just(o[1]), _value_plan(o[1], o[2]))
            ),
            min_size=1,
            max_size=3,
            unique_by=lambda pair: pair[0],
        ),
    )
)


def _value(workdir: Path, option: str, plan: tuple, n: int) -> str:
    if plan[0] == "text":
        return plan[1]
    if plan[0] == "input":
        return input_path(workdir, plan[1], plan[2], f"input{n}.txt")
    if option == "--plot" and plan[1] == "new":
        return str(workdir / "plots")
    # A name of its own: a FIFO made for one option must not be another's "existing" file.
    return output_path(workdir, plan[1], f"{n}.json" if option != "--socket" else f"{n}.sock")


def _arguments(workdir: Path, command: str, options: list[tuple[str, tuple]]) -> list[str]:
    before, after = BASE[command]
    args, positional = list(before), []
    for n, (option, plan) in enumerate(options):
        value = _value(workdir, option, plan, n)
        if not option.startswith("-"):
            positional.append(value)
        elif value.startswith("-"):
            args.append(f"{option}={value}")
        else:
            args += [option, value]
    given = {option for option, _ in options}
    if command == "simulate" and not {"--generate", "--trace"} & given:
        args += ["--generate", "mapa:jobs=5"]
    if command == "serve":
        if "--socket" not in given:
            args += ["--socket", str(workdir / "broker.sock")]
        if "--state-dir" not in given:
            args += ["--state-dir", str(workdir / "broker")]
    if command == "" and "--topology" not in given:
        args += ["--topology", "dgx1-v100"]
    if command == "topo import" and "topo_file" not in given:
        positional.append(str(TOPO_M))
    if positional:
        args += ["--", *positional] if after[:1] != ["--"] else positional
    return [*args, *after]


def _option_case(case: tuple[str, list[tuple[str, Any]]]) -> None:
    command, options = case
    with workspace() as workdir:
        args = _arguments(workdir, command, options)
        result = check(args, workdir, ledgers=[workdir / "broker"])
        if result.exit_code == 0 and command == "alloc":
            check(["--topology", "dgx1-v100", "release", "--mine"], workdir, typed=args)
        shutil.rmtree(workdir / "broker", ignore_errors=True)


@pytest.mark.usefixtures("no_serving_loops")
@fast(30)
@given(case=option_cases)
def test_option_values(case: tuple) -> None:
    _option_case(case)


@pytest.mark.slow
@pytest.mark.usefixtures("no_serving_loops")
@LONG
@given(case=option_cases)
def test_option_values_at_length(case: tuple) -> None:
    _option_case(case)


def test_every_command_with_values_is_fuzzed() -> None:
    """The tree walk finds the options the issue names (a walk that finds nothing fuzzes
    nothing, and passes)."""
    found = {(command, option) for command, option, _ in OPTIONS}
    for pair in [
        ("simulate", "--load"), ("simulate", "--generate"), ("simulate", "--save-trace"),
        ("status", "--idle"), ("metrics", "--serve"), ("serve", "--socket"),
        ("slurm gres-conf", "--node"), ("calibrate", "--size-mib"), ("calibrate", "--repeats"),
        ("run", "--timeout"), ("alloc", "--mem"), ("topo import", "--name"), ("", "--topology"),
    ]:  # fmt: skip
        assert pair in found, pair
    assert all(command in BASE for command in COMMANDS)
