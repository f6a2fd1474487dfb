"""``gpualloc simulate`` answers bad input well: one ``error:`` line, at most one
``hint:``, a documented exit code, no traceback, nothing written, and soon."""

from __future__ import annotations

import errno
import json
import math
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpualloc.errors import ExitCode
from gpualloc.simulate.trace import parse_trace
from tests.house_rules import refused

SIMULATE = ("--topology", "dgx1-v100", "simulate")
HEADER = "id,arrival_s,gpus,duration_s,sensitive"
LONG = "x" * 5000


def _refused(result, code: ExitCode) -> str:
    """The house rule's refusal (:func:`tests.house_rules.refused`) with exit ``code``: its
    ``error:`` line first, and nothing on stdout."""
    error = refused(result, code)
    assert result.stderr.splitlines()[0] == error and result.stdout == "", result.stderr
    return error


def _jsonl(field: str | None = None, raw: str = "") -> str:
    """A JSON Lines job, ``field`` written as the text ``raw`` (which need not be JSON)."""
    job: dict[str, object] = {"id": "a", "arrival_s": 0, "gpus": 1, "duration_s": 5}
    job["sensitive"] = True
    if field is not None:
        job[field] = "@"
    return json.dumps(job).replace('"@"', raw) + "\n"


# ---- 1. --load --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "generate",
    ["mapa:jobs=5,arrival=spread", "mapa"],
)
def test_load_nan_is_refused_at_once_not_simulated_forever(generate: str, tmp_path: Path) -> None:
    """A NaN load made every arrival NaN, a time the event loop never reaches: it ran forever."""
    args = [*SIMULATE, "--generate", generate, "--load", "nan", "--save-trace", "t.jsonl"]
    done = subprocess.run(
        [sys.executable, "-m", "gpualloc", *args],
        capture_output=True,
        text=True,
        timeout=20,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == ExitCode.USAGE, done.stderr
    assert done.stderr.startswith("error: --load nan") and "Traceback" not in done.stderr
    assert not (tmp_path / "t.jsonl").exists()


@pytest.mark.parametrize("load", ["inf", "-inf", "1e-300", "1e300", "0", "-1", "1001"])
def test_loads_that_are_not_finite_or_absurd_are_refused(cli, load: str) -> None:
    result = cli(*SIMULATE, "--generate", "mapa:jobs=5,arrival=spread", f"--load={load}")
    assert "0.001..1000" in _refused(result, ExitCode.USAGE)


def test_sensible_loads_still_simulate(cli) -> None:
    for load in ("0.001", "0.9", "1000"):
        result = cli(*SIMULATE, "--generate", "mapa:jobs=5,arrival=spread", "--load", load)
        assert result.exit_code == 0, result.stderr


@pytest.mark.parametrize(
    "spec", ["mixed:jobs=5,load=nan", "drb:jobs=5,rate_per_min=nan", "mixed:jobs=5,w1=1e308"]
)
def test_generator_settings_that_are_not_finite_are_refused_at_once(spec: str) -> None:
    """The generators' own rates hung the same way as --load nan."""
    done = subprocess.run(
        [sys.executable, "-m", "gpualloc", *SIMULATE, "--generate", spec],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert done.returncode == ExitCode.TRACE, done.stderr
    assert done.stderr.startswith("error: --generate") and "Traceback" not in done.stderr


# ---- 2. numbers in traces that are not finite --------------------------------------------------


@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        ("inf.csv", f"{HEADER}\na,0,1,inf,1\n", "duration_s 'inf' is not a finite number"),
        ("nan.csv", f"{HEADER}\na,nan,1,5,1\n", "arrival_s 'nan' is not a finite number"),
        ("big.csv", f"{HEADER}\na,1e999,1,5,1\n", "arrival_s '1e999' is not a finite number"),
        ("nan.jsonl", _jsonl("arrival_s", "NaN"), "NaN is not a finite number"),
        ("inf.jsonl", _jsonl("duration_s", "Infinity"), "Infinity is not a finite number"),
        ("minus.jsonl", _jsonl("min_bandwidth", "-Infinity"), "-Infinity is not a finite"),
        ("e999.jsonl", _jsonl("duration_s", "1e999"), "duration_s 'inf' is not a finite"),
        ("digits.jsonl", _jsonl("gpus", "9" * 5000), "not valid JSON (a number too long)"),
        ("huge.jsonl", _jsonl("gpus", "9" * 400), "is not a finite number"),
    ],
)
def test_traces_with_numbers_that_are_not_finite_are_refused(
    cli, tmp_path: Path, name: str, text: str, said: str
) -> None:
    trace = tmp_path / name
    trace.write_text(text)
    saved = tmp_path / "saved.jsonl"
    result = cli(*SIMULATE, "--trace", str(trace), "--json", "--save-trace", str(saved))
    assert said in _refused(result, ExitCode.TRACE)
    assert not saved.exists()


ENGINE_WITH_A_NAN_ARRIVAL = """
import math
from gpualloc.errors import TraceError
from gpualloc.simulate.engine import SimOptions, simulate
from gpualloc.simulate.trace import SimJob
from gpualloc.topologies import load_bundled

try:
    simulate(load_bundled("dgx1-v100"), [SimJob("a", math.nan, 1, 5.0, True)], SimOptions("mapa"))
except TraceError as exc:
    print(exc)
"""


def test_the_engine_refuses_a_time_that_never_comes() -> None:
    """Through the API too: a NaN arrival would hold the event loop forever (so in a process
    of its own, with a timeout)."""
    done = subprocess.run(
        [sys.executable, "-c", ENGINE_WITH_A_NAN_ARRIVAL],
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    )
    assert "not a finite number" in done.stdout


def test_json_output_holds_no_nan_or_infinity(cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever a summary holds, --json writes JSON every reader takes: null for no number."""
    from gpualloc.simulate import summary

    real = summary.summarise
    monkeypatch.setattr(summary, "summarise", lambda r: {**real(r), "makespan_s": math.inf})
    result = cli(*SIMULATE, "--generate", "mapa:jobs=5", "--json")
    assert result.exit_code == 0, result.stderr

    def strict(name: str) -> float:
        raise AssertionError(f"{name} in --json output")

    data = json.loads(result.stdout, parse_constant=strict)
    assert data["policies"]["mapa"]["summary"]["makespan_s"] is None


# ---- 3. what was an internal error --------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("mapa:jobs=0", "jobs='0' is not within 1.."),
        ("mixed:jobs=5,host_gpus=0", "host_gpus='0' is not within 1.."),
        ("drb:jobs=0", "jobs='0' is not within 1.."),
    ],
)
def test_generator_counts_of_zero_are_refused(cli, spec: str, said: str) -> None:
    assert said in _refused(cli(*SIMULATE, "--generate", spec), ExitCode.TRACE)


@pytest.mark.parametrize("weights", ["nan,1,1", "1,inf,1"])
def test_drb_weights_that_are_not_finite_are_refused(cli, weights: str) -> None:
    result = cli("--topology", "dgx1-v100", "plan", "-n", "2", "--policy", "drb",
                 "--drb-weights", weights)  # fmt: skip
    assert "--drb-weights" in _refused(result, ExitCode.USAGE)


def test_save_trace_onto_a_full_disk_is_an_io_error(cli, tmp_path, monkeypatch) -> None:
    from gpualloc import atomic

    def full(path: Path, text: str, **_: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic, "write_text_atomic", full)
    result = cli(*SIMULATE, "--generate", "mapa:jobs=5", "--save-trace", str(tmp_path / "t"))
    assert "No space left on device" in _refused(result, ExitCode.IO)


def test_save_trace_onto_dev_full_writes_in_place_and_is_an_io_error(
    cli, full_device: Path
) -> None:
    """A rename onto /dev/full replaced the device (as root) and said nothing went wrong."""
    for option in ("--save-trace", "--report"):
        result = cli(*SIMULATE, "--generate", "mapa:jobs=5", option, str(full_device))
        line = _refused(result, ExitCode.IO)
        assert option in line and "No space left on device" in line
        assert stat.S_ISCHR(full_device.stat().st_mode)  # still the device


def test_save_trace_onto_a_pipe_nobody_reads_does_not_wait(cli, tmp_path: Path) -> None:
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    result = cli(*SIMULATE, "--generate", "mapa:jobs=5", "--save-trace", str(pipe))
    assert "no process reads" in _refused(result, ExitCode.IO)


# ---- 4. workloads ------------------------------------------------------------------------------


def test_an_unknown_workload_is_refused_naming_the_known(cli, tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(f"{HEADER},workload\na,0,2,5,1,gpt-17\n")
    result = cli(*SIMULATE, "--trace", str(trace), "--save-trace", str(tmp_path / "s"))
    line = _refused(result, ExitCode.TRACE)
    assert "unknown workload 'gpt-17'" in line
    assert "alexnet" in result.stderr and "bvlc_googlenet" in result.stderr
    assert not (tmp_path / "s").exists()


def test_known_workloads_in_any_spelling_are_accepted(cli, tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    rows = ["VGG-16", "resnet50", "bvlc_alexnet", "bvlc_reference_caffenet", "GoogLeNet", ""]
    trace.write_text(
        f"{HEADER},workload\n" + "".join(f"j{i},{i},2,5,1,{w}\n" for i, w in enumerate(rows))
    )
    result = cli(*SIMULATE, "--trace", str(trace))
    assert result.exit_code == 0, result.stderr


# ---- 5. --share-placement ----------------------------------------------------------------------


def test_share_placement_without_sharing_is_a_usage_error(cli) -> None:
    result = cli(*SIMULATE, "--generate", "mapa:jobs=5", "--share-placement", "best-fit")
    assert "--share-placement applies to --sharing" in _refused(result, ExitCode.USAGE)
    assert "hint: add --sharing N" in result.stderr
    shared = ("--sharing", "2", "--share-placement", "best-fit")
    assert cli(*SIMULATE, "--generate", "mapa:jobs=5", *shared).exit_code == 0


# ---- 6. messages that misled -------------------------------------------------------------------


def test_a_csv_trace_with_a_byte_order_mark_is_read(cli, tmp_path: Path) -> None:
    trace = tmp_path / "excel.csv"
    trace.write_bytes(b"\xef\xbb\xbf" + f"{HEADER}\na,0,2,5,1\nb,1,1,5,0\n".encode())
    result = cli(*SIMULATE, "--trace", str(trace))
    assert result.exit_code == 0, result.stderr
    assert "2 jobs on dgx1-v100" in result.stdout
    assert [job.id for job in parse_trace("\ufeff" + _jsonl())] == ["a"]


@pytest.mark.parametrize(
    ("line", "kind"),
    [("null", "null"), ("[1, 2]", "a list"), ("42", "a number"), ('"a"', "a string")],
)
def test_a_json_line_that_is_not_an_object_says_so(cli, tmp_path, line: str, kind: str) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(f"{line}\n")
    said = _refused(cli(*SIMULATE, "--trace", str(trace)), ExitCode.TRACE)
    assert f"t.jsonl:1: a job is a JSON object, not {kind}" in said and "CSV" not in said


def test_trace_and_generate_are_said_to_exclude_each_other(cli, tmp_path: Path) -> None:
    both = cli(*SIMULATE, "--trace", str(tmp_path / "x"), "--generate", "mapa")
    assert "exclude each other" in _refused(both, ExitCode.USAGE)
    neither = cli(*SIMULATE)
    assert "give --trace FILE or --generate SPEC" in _refused(neither, ExitCode.USAGE)


@pytest.mark.parametrize(
    "args",
    [
        ("--generate", LONG),
        ("--generate", f"mapa:{LONG}"),
        ("--generate", f"mapa:jobs={LONG}"),
        ("--generate", "mapa:jobs=5", "--policy", LONG),
        ("--generate", "mapa:jobs=5", "--share-placement", LONG),
        ("--generate", "mapa:jobs=5", "--queue", LONG),
        ("--generate", "mapa:jobs=5", "--runtime", LONG),
    ],
)
def test_a_long_argument_is_not_echoed_whole(cli, args: tuple[str, ...]) -> None:
    result = cli(*SIMULATE, *args)
    assert result.exit_code in (ExitCode.USAGE, ExitCode.TRACE), result.stderr
    assert "Traceback" not in result.stderr
    assert all(len(line) < 200 for line in result.stderr.splitlines()), result.stderr


@pytest.mark.parametrize("column", ["id", "workload", "pattern", "priority", "sensitive"])
def test_a_long_trace_value_is_not_echoed_whole(cli, tmp_path: Path, column: str) -> None:
    fields = {"id": "a", "workload": "alexnet", "pattern": "ring", "priority": "low"}
    fields["sensitive"] = "1"
    fields[column] = LONG
    trace = tmp_path / "t.csv"
    names = ["arrival_s", "gpus", "duration_s", *fields]
    trace.write_text(",".join(names) + "\n" + ",".join(["0", "9", "5", *fields.values()]) + "\n")
    result = cli(*SIMULATE, "--trace", str(trace))
    assert result.exit_code == ExitCode.TRACE, result.stderr
    assert all(len(line) < 200 for line in result.stderr.splitlines()), result.stderr
