"""One job request, declared once: the table of :mod:`gpualloc.job_options` makes the options
of run, alloc and plan (their parser and help), ``JobOptions`` (held equal to it, and sent
whole to the broker) and the Python API's keywords. A new option is one row and its
field; these tests add a row and find it everywhere else."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import msgspec
import pytest

from gpualloc.errors import RequestError
from gpualloc.job_options import JOB_OPTIONS, job_fields, options_of

DUMMY_ROW = """
import gpualloc.job_options as table

table.JOB_OPTIONS = (
    *table.JOB_OPTIONS,
    table.JobOption(
        "max_temperature", "int", "Only GPUs cooler than this many degrees C (a test's row).",
        metavar="C", minimum=30, maximum=110, commands=("run", "alloc"),
    ),
)
"""

PROBE = """
import json

from gpualloc.cli import parser
from gpualloc.cli.commands import entry, load
from gpualloc.cli.help import page
from gpualloc.errors import RequestError

found = {}
for command in ("run", "alloc", "plan"):
    found[f"{command}_help"] = "--max-temperature C" in page(command, load(entry(command)))
line = parser.parse_command(["run", "--max-temperature", "80", "--", "true"])
found["parser"] = line.values["max_temperature"] == 80
try:
    parser.parse_command(["run", "--max-temperature", "5", "--", "true"])
    found["parser_bounds"] = False
except RequestError as refused:
    found["parser_bounds"] = "must be at least 30" in refused.message
print(json.dumps(found))
"""


def test_a_row_added_to_the_table_reaches_every_shape_of_the_request() -> None:
    """The row alone, no other edit: the help of run and alloc (not plan, which the row does
    not name), the parser with its bounds (the broker's client sends every field of
    ``JobOptions``, so the wire needs no edit either). What a real
    option needs besides is its field in ``JobOptions`` (typed, written where a checker reads
    it: the next test fails until it is there) and its use: what it changes in
    ``placement.options.want_of`` (or in the lease's terms)."""
    script = textwrap.dedent(DUMMY_ROW) + textwrap.dedent(PROBE)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found.pop("plan_help") is False
    assert all(found.values()), found


def test_the_fields_a_client_sends_are_the_structs_with_their_types() -> None:
    """``JobFields`` (what the command line builds and the broker's socket carries, without
    msgspec; a TypedDict only for the checker) names every field of ``JobOptions``, in order,
    with the same type as written, and nothing else; its names are the table's ``job`` rows."""
    import ast
    import inspect

    from gpualloc.model import job as struct_module
    from gpualloc.model import job_fields as fields_module

    def annotations(module: object, name: str) -> list[tuple[str, str]]:
        tree = ast.parse(inspect.getsource(module))  # type: ignore[arg-type]
        (found,) = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name]
        return [
            (stmt.target.id, ast.unparse(stmt.annotation))
            for stmt in found.body
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
        ]

    assert annotations(fields_module, "JobFields") == annotations(struct_module, "JobOptions")
    assert {row.dest for row in job_fields()} == fields_module.FIELDS


def test_the_structs_fields_are_the_job_rows_with_their_defaults_and_kinds() -> None:
    """JobOptions is written by hand, so that a type checker reads its fields; the rows stay
    the one description of the options: the same names in the same order, the same defaults,
    and a type that takes what the row's kind parses to."""
    from gpualloc.model.job import JobOptions

    rows = job_fields()
    fields = msgspec.structs.fields(JobOptions)
    assert [field.name for field in fields] == [row.dest for row in rows]
    kinds = {"flag": bool, "int": int, "float": float, "str": str}
    for field, row in zip(fields, rows, strict=True):
        assert field.default == row.default, row.dest
        assert field.default is not msgspec.NODEFAULT, row.dest
        example = {"flag": True, "int": 1, "float": 0.5, "str": "0"}[row.kind]
        assert isinstance(example, kinds[row.kind])
        assert getattr(JobOptions(**{row.dest: example}), row.dest) == example, row.dest
        assert kinds[row.kind].__name__ in str(field.type), (row.dest, field.type)


def test_every_declared_job_option_is_a_row() -> None:
    """The commands' job options are exactly their rows, in table order."""
    from gpualloc.cli.commands import entry, load

    for command in ("run", "alloc", "plan"):
        declared = [opt.dest for opt in load(entry(command)).options]
        rows = [row.dest for row in options_of(command)]
        assert [dest for dest in declared if dest in rows] == rows, command


def test_each_row_is_declared_once_with_its_help() -> None:
    names = [row.dest for row in JOB_OPTIONS]
    assert len(names) == len(set(names))
    spellings = [s for row in JOB_OPTIONS for s in (*row.spellings, *row.negative)]
    assert len(spellings) == len(set(spellings))
    assert all(row.help.endswith(".") or row.help.endswith(")") for row in JOB_OPTIONS)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"count": 0}, "-n 0 is out of range"),
        ({"count": True}, "is not a whole number"),
        ({"count": 2.5}, "is not a whole number"),
        ({"min_utility": float("nan")}, "--min-utility is not a number"),
        ({"min_utility": 1.5}, "is out of range"),
        ({"min_bandwidth": float("inf")}, "--min-bandwidth is too large"),
        ({"sm_share": 101}, "--sm-share 101 is out of range"),
    ],
)
def test_the_struct_checks_its_bounds_whoever_builds_it(values: dict, message: str) -> None:
    """The Python API and the broker reach JobOptions without the parser's checks: the
    struct refuses what the parser would, when it is made."""
    from gpualloc.model.job import JobOptions

    with pytest.raises(RequestError, match=message):
        JobOptions(**values)


def test_the_api_takes_the_command_lines_job_options_and_refuses_others() -> None:
    import gpualloc.api as api

    options = api._job_options(1, {"mig": "1g.5gb"})
    assert options.count is None and options.mig == "1g.5gb"
    options = api._job_options(2, {"exclude": {0, 3}, "explicit": None, "policy": "drb"})
    assert options.exclude == (0, 3) and options.policy == "drb"
    with pytest.raises(RequestError, match="unknown job option 'colour'"):
        api._job_options(1, {"colour": "red"})
    assert set(api.__all__) == {"HeldGpus", "hold", "load_topology", "plan"}


def test_the_broker_makes_the_want_its_client_made_of_the_options_it_sends(
    tmp_path: Path,
) -> None:
    """One job encoding on the wire: a broker client sends the JobOptions its Want was made
    of (:func:`gpualloc.host.brokered.sent_options`; a pattern file read by the client goes
    as its name and edges), and the broker makes the same Want of them."""
    from gpualloc.broker.requests import options_want
    from gpualloc.config import Config
    from gpualloc.host.brokered import sent_options
    from gpualloc.model.job import JobOptions
    from gpualloc.placement.options import want_of

    pattern = tmp_path / "pairs.json"
    pattern.write_text(json.dumps({"edges": [[0, 1], [2, 3]]}))
    config = Config.load()
    jobs = [
        JobOptions(),
        JobOptions(count=2, exclude="0-3", policy="drb", drb_weights="2,1,1", min_utility=0.3),
        JobOptions(count=4, pattern=str(pattern), sensitive=True),
        JobOptions(gpus=(3, 1), score="bottleneck"),
        JobOptions(mig="1g.5gb"),
        JobOptions(share=True, mem="4G", sm_share=50, background=True),
        JobOptions(count=2, shareable=True, mem=2**30, exclude=(0,)),
    ]
    for job in jobs:
        made = want_of(job, config)
        sent = json.loads(json.dumps(sent_options(made)))  # as the socket carries it
        assert str(tmp_path) not in json.dumps(sent)  # never a path for root to open
        again = options_want(sent, config)
        assert msgspec.structs.replace(again, options=None) == msgspec.structs.replace(
            made, options=None
        ), job


def test_the_broker_decodes_a_clients_options_into_the_struct() -> None:
    """The broker decodes a client's options into JobOptions, whose bounds refuse what the
    parser would; a pattern is a built-in name or sent edges, never a file to open."""
    from gpualloc.broker.requests import options_want
    from gpualloc.config import Config

    config = Config.load()
    want = options_want({"policy": "drb", "count": 2, "exclude": "0-3"}, config)
    assert want.policy == "drb" and want.request.excluded == {0, 1, 2, 3}
    refusals = [
        ({"policy": "mapa", "count": 0}, "-n 0 is out of range"),
        ({"policy": "mapa", "count": "2"}, "bad options: Expected `int | null`, got `str`"),
        ({"policy": "mapa", "colour": "red"}, "unknown field `colour`"),
        ({"count": 1}, "no policy"),
        ({"policy": "mapa", "pattern": "/etc/shadow"}, "the broker opens no file"),
        ({"policy": "mapa", "count": 2, "edges": [[0, 5]]}, "bad pattern edge (0, 5)"),
        ({"policy": "mapa", "count": 2, "edges": [[0, "x"]]}, "bad options: Expected `int`"),
        ({"policy": "mapa", "pattern": "ring\udcff"}, "not valid UTF-8"),
        ({"policy": "mapa", "count": 2, "pattern": "p\udcff", "edges": [[0, 1]]}, "UTF-8"),
    ]
    for raw, message in refusals:
        with pytest.raises(RequestError, match=re.escape(message)):
            options_want(raw, config)
