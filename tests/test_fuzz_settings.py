"""Settings, generated: every ``GPUALLOC_*`` variable with values of its kind,
alone and several together, and config.toml files (the user's, through ``XDG_CONFIG_HOME``, and
the system's, through ``GPUALLOC_SYSTEM_CONFIG``) made of known keys with wrong types and values,
unknown keys, nested tables, huge and non-finite numbers, durations, invalid TOML and binary.
The rules are :mod:`tests.fuzz_harness`'s.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpualloc.config import SETTINGS
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
    hostile,
    input_kinds,
    integers,
    make,
    of,
    output_path,
    text,
)

COMMANDS = (
    ["alloc", "--hold"],
    ["plan", "-n", "2"],
    ["run", "--dry-run", "--", "true"],
    ["status"],
    ["status", "--json"],
    ["config", "show"],
    ["metrics"],
    ["doctor"],
    ["gc"],
    ["release", "--mine"],
    ["simulate", "--generate", "mapa:jobs=5"],
    ["slurm", "gres-conf"],
    ["topo", "show"],
    ["serve", "--socket", "{w}/broker.sock", "--state-dir", "{w}/broker"],
)


def _variables() -> tuple[str, ...]:
    """Every variable the help lists (``GPUALLOC_PRIORITY, GPUALLOC_MAX_BYPASS``: both) and
    every setting's: one list, so that a variable added later is fuzzed too."""
    from gpualloc.cli.commands import ENVIRONMENT_VARIABLES

    listed = {
        name.split("=")[0].strip()
        for names, _ in ENVIRONMENT_VARIABLES
        for name in names.split(",")
    }
    return tuple(sorted(listed | {s.variable for s in SETTINGS if s.variable}))


VARIABLES = _variables()
booleans = of("1", "0", "true", "false", "yes", "no", "on", "off", "TRUE", "2")
TYPED: dict[str, st.SearchStrategy[str]] = {
    "GPUALLOC_TOPOLOGY": of("dgx1-v100", "dgx-a100-mig", "single-gpu", "no-such"),
    "GPUALLOC_DEBUG": booleans,
    "GPUALLOC_NO_SLURM": booleans,
    "GPUALLOC_IGNORE_FOREIGN": booleans,
    "GPUALLOC_POLICY": of(*POLICIES),
    "GPUALLOC_NUMA": of("auto", "bind", "none"),
    "GPUALLOC_PRIORITY": of("high", "normal", "low"),
    "GPUALLOC_MAX_BYPASS": anything(integers),
    "GPUALLOC_VERIFY_ACTION": of("warn", "kill"),
    "GPUALLOC_LOCK_TIMEOUT": anything(durations),
    "GPUALLOC_BROKER_TIMEOUT": anything(durations),
    "GPUALLOC_VERIFY_GRACE": anything(durations),
    "GPUALLOC_PLACEMENT_BUDGET": anything(durations),
    "GPUALLOC_GPUS": anything(st.sampled_from(["0", "0,1", "7", "99", "-1"])),
    "GPUALLOC_LEASE_ID": anything(text),
}
"""Values of a variable's own kind; the paths are made in the case (:data:`PLACES`)."""
PLACES = {
    "GPUALLOC_STATE_DIR", "GPUALLOC_CACHE_DIR", "GPUALLOC_BROKER", "GPUALLOC_SYSTEM_CONFIG",
    "XDG_CONFIG_HOME", "GPUALLOC_BANDWIDTH_TABLE",
}  # fmt: skip
"""Variables naming a place: a path in the case's directory of some kind, or a hostile text
(never a real directory: as root, ``GPUALLOC_STATE_DIR=/`` would be obeyed)."""


def _variable_value(name: str) -> st.SearchStrategy[tuple]:
    if name in PLACES:
        return st.one_of(
            st.tuples(st.just("place"), st.sampled_from(OUTPUT_KINDS)),
            st.tuples(st.just("file"), input_kinds, st.binary(max_size=100)),
            st.tuples(st.just("text"), st.sampled_from(["", " ", "relative", "~nobody-x/y"])),
            st.tuples(st.just("text"), hostile.filter(lambda v: not v.startswith("/"))),
        )
    return st.tuples(st.just("text"), TYPED.get(name, anything(text)))


variable_cases = st.tuples(
    st.sampled_from(COMMANDS),
    st.lists(
        st.sampled_from(VARIABLES).flatmap(lambda n: st.tuples(st.just(n), _variable_value(n))),
        min_size=1,
        max_size=4,
        unique_by=lambda pair: pair[0],
    ),
)


def _materialise(workdir: Path, plan: tuple, n: int) -> str:
    if plan[0] == "text":
        return plan[1].replace("\x00", "")
    if plan[0] == "file":
        return str(make(workdir / f"given{n}.toml", plan[1], plan[2]))
    return output_path(workdir / "places", plan[1], f"{n}")


def _command(command: list[str], workdir: Path, env: dict[str, str]) -> list[str]:
    args = [arg.replace("{w}", str(workdir)) for arg in command]
    return args if "GPUALLOC_TOPOLOGY" in env else ["--topology", "dgx1-v100", *args]


def _variable_case(case: tuple) -> None:
    command, variables = case
    with workspace() as workdir:
        (workdir / "places").mkdir()
        env = {name: _materialise(workdir, plan, n) for n, (name, plan) in enumerate(variables)}
        args = _command(command, workdir, env)
        watched = [workdir / "broker", workdir / "places"]
        result = check(args, workdir, env, ledgers=watched)
        if result.exit_code == 0 and command[0] == "alloc":
            check(_command(["release", "--mine"], workdir, env), workdir, env, typed=args)


@pytest.mark.usefixtures("no_serving_loops")
@fast(30)
@given(case=variable_cases)
def test_variables_alone_and_together(case: tuple) -> None:
    _variable_case(case)


@pytest.mark.slow
@pytest.mark.usefixtures("no_serving_loops")
@LONG
@given(case=variable_cases)
def test_variables_alone_and_together_at_length(case: tuple) -> None:
    _variable_case(case)


def test_every_variable_is_fuzzed() -> None:
    assert {"GPUALLOC_BROKER_TIMEOUT", "GPUALLOC_NO_SLURM", "GPUALLOC_LEASE_ID"} <= set(VARIABLES)
    assert set(TYPED) | PLACES <= set(VARIABLES)


# ---- configuration files -----------------------------------------------------------------------

KEYS = tuple(s.key for s in SETTINGS)
SAFE_NOTIFY = ("true", "false", "exit 3", "", " ", 'echo "$GPUALLOC_LEASE_ID"')
"""``idle.notify`` is run by ``gc`` as a shell command: only these, never generated text."""


def _toml_string(value: str) -> str:
    return json.dumps(value)  # a TOML basic string, but for \/ (never written) and surrogates


toml_scalars = st.one_of(
    st.one_of(hostile, text, durations, st.sampled_from(POLICIES)).map(_toml_string),
    st.sampled_from(["nan", "+nan", "-nan", "inf", "+inf", "-inf", "1e308", "-0.0", "5e-324"]),
    st.sampled_from(["true", "false", "0", "-1", "1", "30", str(2**63 - 1), str(2**63)]),
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda f: repr(f) if f == f else "0.0"),
    st.sampled_from(["1979-05-27T07:32:00Z", "07:32:00", "1979-05-27", "0x10", "0o7", "1_000"]),
)
toml_values = st.recursive(
    toml_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4).map(lambda items: "[" + ", ".join(items) + "]"),
        st.dictionaries(st.sampled_from(["a", "SYS", "1", "x"]), inner, max_size=3).map(
            lambda table: "{" + ", ".join(f"{k} = {v}" for k, v in table.items()) + "}"
        ),
    ),
    max_leaves=6,
)
config_keys = st.one_of(
    st.sampled_from(KEYS),
    st.sampled_from(["polcy", "queue.x", "x.y.z", "queue", "idle", "share.max_jobs.x", '"a b"']),
)
BANDWIDTH_FIELDS = (
    "nvlink_link_gbps", "default_nvlink_generation", "pcie_lane_gbps", "pcie_path_factor",
    "unknown_path_factor", "nccl_nvlink_efficiency", "staged_path_factor", "nope",
)  # fmt: skip


def _document(entries: list[tuple[str, str]], bandwidth: list[tuple[str, str]]) -> str:
    """A TOML document: ``entries`` as dotted keys at the top (tables where the key is
    dotted), then a ``[bandwidth_table]``."""
    lines = []
    for key, value in entries:
        if key == "idle.notify" and value.startswith('"'):
            value = _toml_string(SAFE_NOTIFY[len(value) % len(SAFE_NOTIFY)])
        lines.append(f"{key} = {value}")
    if bandwidth:
        lines.append("[bandwidth_table]")
        lines += [f"{field} = {value}" for field, value in bandwidth]
    return "\n".join(lines) + "\n"


BROKEN = (
    'policy = "mapa', "policy =", "= 1", "[queue\nmax_bypass = 1", "policy = 1\npolicy = 2",
    "[queue]\n[queue]", "a.b = 1\na = 2", "x = [1, 2", "\ufeffpolicy = \"mapa\"",
    'policy = """\n' * 3, "[" * 500, "a." * 400 + "b = 1", "k = " + "[" * 200 + "]" * 200,
    "\n".join(f"k{i} = {i}" for i in range(5000)), "policy = '" + "x" * 100_000 + "'",
)  # fmt: skip
"""Documents no TOML reader takes, and valid ones of a shape nobody writes."""

documents = st.one_of(
    st.builds(
        _document,
        st.lists(st.tuples(config_keys, toml_values), max_size=5, unique_by=lambda e: e[0]),
        st.lists(
            st.tuples(st.sampled_from(BANDWIDTH_FIELDS), toml_values),
            max_size=3,
            unique_by=lambda e: e[0],
        ),
    ),
    st.sampled_from(BROKEN),
    st.binary(max_size=200).map(lambda data: data.decode("latin-1")),
)
config_cases = st.tuples(
    st.sampled_from(COMMANDS),
    st.lists(st.tuples(st.sampled_from(["user", "system"]), documents), min_size=1, max_size=2),
)


def _config_case(case: tuple) -> None:
    command, files = case
    with workspace() as workdir:
        for which, document in files:
            folder = workdir / ("config/gpualloc" if which == "user" else "etc")
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "config.toml").write_bytes(document.encode("utf-8", "surrogateescape"))
        args = _command(command, workdir, {})
        said = [word for _, document in files for word in re.split(r"[\s,\[\]{}=]+", document)]
        result = check(args, workdir, quoted=said, ledgers=[workdir / "broker"])
        if result.exit_code == 0 and command[0] == "alloc":
            check(_command(["release", "--mine"], workdir, {}), workdir, typed=args)


@pytest.mark.usefixtures("no_serving_loops")
@fast(30)
@given(case=config_cases)
def test_configuration_files(case: tuple) -> None:
    _config_case(case)


@pytest.mark.slow
@pytest.mark.usefixtures("no_serving_loops")
@LONG
@given(case=config_cases)
def test_configuration_files_at_length(case: tuple) -> None:
    _config_case(case)


def test_the_documents_hold_what_the_issue_names() -> None:
    """Known keys, non-finite floats and durations do reach the files (a strategy that lost
    them would pass)."""
    tomllib = pytest.importorskip("tomllib")
    document = _document([("lock_timeout", "nan"), ("queue.backfill_window", '"2h"')], [])
    assert math.isnan(tomllib.loads(document)["lock_timeout"])
    assert set(KEYS) >= {"lock_timeout", "queue.max_bypass", "idle.notify", "broker.state_dir"}
