"""Output that fits a terminal: tables fold instead of cutting numbers,
one number format per column, human units for people and plain ones for ``--json``, GPUs in
rank order, JSON Lines under ``--watch``, and notes and hints that lead somewhere true."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console

from gpualloc.cli.output import Table, print_rich
from gpualloc.cli.table_fit import ColumnSize, fit_widths, layout, table_width
from gpualloc.cli.topology_view import LEGEND, topology_tables
from gpualloc.topologies import load_bundled
from tests.child_processes import finish, running
from tests.cli_harness import Result

Cli = Callable[..., Result]
FIXTURES = Path(__file__).parent / "fixtures"
SIXTEEN_GPUS = ["torus-2d-16", "cube-mesh-16", "dgx2"]


def rendered(tables: list[Table], width: int, footer: list[str] | None = None) -> str:
    console = Console(width=width, file=io.StringIO(), color_system=None, highlight=False)
    print_rich(console, tables, None, footer or [])
    return console.file.getvalue()  # type: ignore[attr-defined]


def words(text: str) -> set[str]:
    return set(text.split())


def assert_whole(tables: list[Table], output: str, width: int) -> None:
    """Every line fits ``width``, nothing is cut with an ellipsis, and every word of every
    header and cell is on screen whole."""
    assert "…" not in output
    assert max(len(line.rstrip()) for line in output.splitlines()) <= width
    shown = words(output)
    for table in tables:
        for text in [*table.columns, *(cell for row in table.rows for cell in row)]:
            assert words(text) <= shown, f"{text!r} is not shown whole"


# ---- tables fold or split, never cut ------------------------------------------------------


@pytest.mark.parametrize("name", SIXTEEN_GPUS)
@pytest.mark.parametrize("width", [80, 120])
def test_topo_show_of_16_gpus_fits_80_and_120_columns_whole(name: str, width: int) -> None:
    tables = topology_tables(load_bundled(name))
    assert_whole(tables, rendered(tables, width), width)


def test_a_16_gpu_matrix_splits_into_even_column_blocks_at_80_columns() -> None:
    links = next(t for t in topology_tables(load_bundled("torus-2d-16")) if t.title == "Links")
    blocks = layout(links.columns, links.rows, 80)
    assert [len(block.columns) for block in blocks] == [9, 9]  # the row label and 8 GPUs each
    assert all(block.columns[0] == 0 for block in blocks)
    assert sorted({i for block in blocks for i in block.columns}) == list(range(17))
    assert all(table_width(block.widths) <= 80 for block in blocks)
    assert len(layout(links.columns, links.rows, 200)) == 1  # wide enough: one block


def test_simulate_table_fits_80_columns_with_whole_headers(cli, monkeypatch) -> None:
    """At 80 columns the comparison was ``15…`` cells; at 120 its headers read ``Makes…``."""
    monkeypatch.setattr("gpualloc.cli.output.stdout_is_terminal", lambda: True)
    for width in (80, 120):
        monkeypatch.setenv("COLUMNS", str(width))
        args = [
            "-t",
            "dgx1-v100",
            "simulate",
            "--generate",
            "mapa:jobs=40",
            "--policy",
            "mapa,pack",
        ]
        result = cli(*args)
        assert result.exit_code == 0, result.stderr
        assert "…" not in result.stdout
        assert max(len(line.rstrip()) for line in result.stdout.splitlines()) <= width
        for header in ("Policy", "Makespan", "Mean", "JCT", "Stretch", "Decision", "ms"):
            assert header in words(result.stdout)


def test_headers_wrap_at_spaces_before_columns_split() -> None:
    table = Table("t", ["Policy", "Mean JCT", "Worst JCT"], [["mapa", "1.0", "2.0"]])
    assert fit_widths([ColumnSize(9, 4, 4)], 10) == [8]
    assert layout(table.columns, table.rows, 23)[0].widths == [6, 4, 5]
    assert (
        len(layout(table.columns, table.rows, 22)) == 2
    )  # one column narrower: split, the Policy column kept
    output = rendered([table], 23)
    assert "Mean" in output and "JCT" in output and "…" not in output


def test_prose_wraps_at_spaces_and_identifiers_stay_whole() -> None:
    uuid = "GPU-15732f08-ad13-52d3-bc4c-3c8f00fbd124"
    table = Table(
        "t",
        ["GPU", "UUID", "Detail"],
        [["0", uuid, "a long sentence about what went wrong with this GPU today"]],
        wrap=(2,),
    )
    output = rendered([table], 70)
    assert uuid in output
    assert (
        len(layout(table.columns, table.rows, 70, wrap=table.wrap)) == 1
    )  # the detail wrapped; nothing split or cut
    assert_whole([table], output, 70)


def test_indented_footer_lines_keep_their_indent_when_they_wrap() -> None:
    output = rendered([], 40, footer=["  " + "word " * 20])
    assert all(line.startswith("  word") for line in output.splitlines())


@pytest.mark.parametrize("name", ["dgx2", "torus-2d-32"])
def test_piped_tables_fit_an_explicit_columns_and_stay_whole_without(
    cli, monkeypatch, name: str
) -> None:
    """``COLUMNS=80 gpualloc topo show | less`` printed 595-character rows: with COLUMNS set,
    plain output fits it as a terminal would (blocks repeating the row labels, nothing
    cut); without it, or with no number in it, each row stays on one line for grep and awk."""
    monkeypatch.setenv("COLUMNS", "80")
    fitted = cli("-t", name, "topo", "show")
    assert fitted.exit_code == 0, fitted.stderr
    tables = topology_tables(load_bundled(name))
    assert_whole(tables, fitted.stdout, 80)
    assert "\x1b" not in fitted.stdout  # still plain text: no colour, no box
    gpus = len(load_bundled(name).gpus)
    assert words(fitted.stdout) >= {f"GPU{gpu}" for gpu in range(gpus)}
    assert fitted.stdout.count(f"  GPU{gpus - 1} ") >= 2  # a row label in each block
    for columns in (None, "", "wide", "0"):
        if columns is None:
            monkeypatch.delenv("COLUMNS")
        else:
            monkeypatch.setenv("COLUMNS", columns)
        whole = cli("-t", name, "topo", "show").stdout
        assert max(len(line) for line in whole.splitlines()) > 200, columns
        row = next(line for line in whole.splitlines() if line.startswith("  GPU0 "))
        assert f"GPU{gpus - 1}" not in words(row)  # the matrix row: one line, all GPUs
        assert len(row.split()) == gpus + 1


def test_piped_prose_wraps_at_spaces_within_columns(capsys, monkeypatch) -> None:
    from gpualloc.cli.output import print_tables

    uuid = "GPU-15732f08-ad13-52d3-bc4c-3c8f00fbd124"
    detail = "a long sentence about what went wrong with this GPU today"
    table = Table("t", ["GPU", "UUID", "Detail"], [["0", uuid, detail]], wrap=(2,))
    monkeypatch.setenv("COLUMNS", "70")
    print_tables([table], footer=["  " + "word " * 20])
    output = capsys.readouterr().out
    assert_whole([table], output, 70)
    assert output.splitlines()[1].split() == ["GPU", "UUID", "Detail"]
    assert uuid in output and len(output.splitlines()) > 4
    assert all(line.startswith("  word") for line in output.splitlines() if "word" in line)


def test_the_legend_fits_80_columns() -> None:
    assert max(len(line) for line in LEGEND) <= 80


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a pseudo-terminal")
@pytest.mark.parametrize("name", SIXTEEN_GPUS)
def test_topo_show_on_an_80_column_terminal(name: str, tmp_path: Path) -> None:
    """The real entry point on a pseudo-terminal with ``COLUMNS=80``."""
    output = on_terminal(["-t", name, "topo", "show"], 80)
    assert "…" not in output
    assert max(len(line.rstrip()) for line in output.splitlines()) <= 80
    for gpu in range(16):
        assert f"GPU{gpu}" in words(output)
    assert "PHB" in output or "NV6" in output


def on_terminal(args: list[str], columns: int) -> str:
    """What ``gpualloc ARGS`` shows on a terminal of ``columns`` columns (colours off)."""
    import pty

    main, child = pty.openpty()
    env = dict(os.environ, COLUMNS=str(columns), TERM="xterm", NO_COLOR="1")
    process = subprocess.Popen(
        [sys.executable, "-m", "gpualloc", *args],
        stdin=subprocess.DEVNULL,
        stdout=child,
        stderr=child,
        env=env,
    )
    os.close(child)
    chunks = []
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main)
    finish(process, timeout_s=60)
    assert process.returncode == 0
    text = b"".join(chunks).decode().replace("\r\n", "\n")
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


# ---- one number format per column ---------------------------------------------------------


def test_plan_columns_keep_one_format(cli) -> None:
    """``--compare`` mixed ``57.8579``, ``107.88`` and ``125`` in one column."""
    result = cli("-t", "dgx1-v100", "plan", "-n", "3", "--compare")
    assert result.exit_code == 0, result.stderr
    table = result.stdout.split("\n\n")[0]  # the footer says which GPUs were counted taken
    rows = [line.split() for line in table.splitlines()[2:] if line.strip()]
    for column in range(2, 6):  # Effective, Aggregated, Preserved, Bottleneck
        assert {len(row[column].split(".")[1]) for row in rows} == {1}
    assert "57.9" in result.stdout and "57.8579" not in result.stdout


def test_a_bandwidth_matrix_has_one_format() -> None:
    """``150`` beside ``25.0``: a matrix with links of 100 GB/s and more, and slower ones."""
    from gpualloc.model.bandwidth import BandwidthTable

    faster = BandwidthTable(nvlink_link_gbps={1: 20.0, 2: 60.0, 3: 25.0, 4: 25.0, 5: 50.0})
    topology = load_bundled("dgx1-v100").estimated(faster)
    matrix = next(t for t in topology_tables(topology) if t.title.startswith("Bandwidth"))
    cells = {cell for row in matrix.rows for cell in row[1:] if cell != "X"}
    assert {"120.0", "60.0", "7.9"} <= cells
    assert {len(cell.split(".")[1]) if "." in cell else 0 for cell in cells} == {1}


def test_a_measured_matrix_is_not_titled_estimated(cli) -> None:
    measured = FIXTURES / "measured" / "nvbandwidth" / "azure_2gpu_v0.10_testdata.txt"
    result = cli("topo", "import", "--bandwidth-matrix", str(measured))
    assert result.exit_code == 0, result.stderr
    assert "Bandwidth (GB/s, one direction, measured)" in result.stdout
    assert "Bandwidth (GB/s, one direction, estimated)" not in result.stdout


# ---- human units for people, plain ones for --json ----------------------------------------


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0.0, "0.0s"),
        (45.24, "45.2s"),
        (59.96, "1m 00s"),
        (1482.8, "24m 43s"),
        (7500.0, "2h 05m"),
        (3599.7, "1h 00m"),
        (10591816.6, "122d 14h"),
    ],
)
def test_human_durations(seconds: float, shown: str) -> None:
    from gpualloc.durations import human_duration

    assert human_duration(seconds) == shown


@pytest.mark.parametrize(
    ("seconds", "written"),
    [(900.0, "15m"), (30.0, "30s"), (5400.0, "1h30m"), (0.015, "0.015s"), (86400.0, "1d")],
)
def test_durations_as_a_config_file_writes_them_read_back(seconds: float, written: str) -> None:
    from gpualloc.durations import format_duration, parse_duration_text

    assert format_duration(seconds) == written
    assert parse_duration_text(written) == pytest.approx(seconds)


def test_simulate_on_a_cluster_trace_shows_days_not_8_digit_seconds(cli) -> None:
    trace = FIXTURES / "traces" / "openb_pod_list_excerpt.csv"
    result = cli("-t", "dgx2", "simulate", "--trace", str(trace))
    assert result.exit_code == 0, result.stderr
    row = next(line.split() for line in result.stdout.splitlines() if line.startswith("  mapa"))
    assert row[1:3] == ["172d", "11h"]  # the makespan
    assert not re.search(r"\d{6,}", result.stdout)
    data = cli("-t", "dgx2", "simulate", "--trace", str(trace), "--json")
    assert data.exit_code == 0, data.stderr
    summary = json.loads(data.stdout)["policies"]["mapa"]["summary"]
    assert summary["makespan_s"] > 1e7  # --json keeps seconds


def test_config_show_writes_durations_as_the_config_file_would(cli, tmp_path: Path) -> None:
    config = tmp_path / "config" / "gpualloc" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text('lock_timeout = "2m"\n[verify]\ngrace = 0\n', encoding="utf-8")
    result = cli("config", "show")
    assert result.exit_code == 0, result.stderr
    values = {line.split()[0]: line.split()[1] for line in result.stdout.splitlines()[2:] if line}
    assert values["idle.max_gap"] == "15m"
    assert values["lock_timeout"] == "2m"
    assert values["verify.grace"] == "off"
    assert values["broker.placement_budget"] == "0.015s"
    shown = json.loads(cli("config", "show", "--json").stdout)["settings"]
    assert next(s for s in shown if s["key"] == "idle.max_gap")["value"] == 900.0


def test_a_count_of_one_is_singular(cli: Cli, tmp_path: Path) -> None:
    """Counts were written by hand: "wrote host.json (1 GPUs)", "1 lease(s)", "-n 2 but --gpus
    names 1 GPU(s)", "passed over 1 times"."""
    out = tmp_path / "one.json"
    one = ("--topology", "single-gpu")
    assert cli(*one, "topo", "record", "-o", str(out)).stderr == f"wrote {out} (1 GPU)\n"
    assert cli(*one, "alloc", "--hold").exit_code == 0
    assert "0 of 1 GPU free; 1 lease, 0 waiting" in cli(*one, "status").stdout
    refused = cli("--topology", "dgx1-v100", "alloc", "-n", "2", "--gpus", "0")
    assert "-n 2 but --gpus names 1 GPU" in refused.stderr and "GPU(s)" not in refused.stderr
    busy = cli(*one, "alloc", "-n", "2")
    assert "the job asks for 2 GPUs but 1 of 1 GPU is usable" in busy.stderr, busy.stderr


# ---- --watch with --json: JSON Lines ------------------------------------------------------


@pytest.mark.slow
def test_status_json_watch_writes_one_compact_document_a_line() -> None:
    """It wrote pretty JSON documents one after another, which no JSON reader takes."""
    import signal

    watch = ["status", "--json", "--watch", "--interval", "0.2"]
    with running(
        [sys.executable, "-m", "gpualloc", "-t", "dgx1-v100", *watch],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        documents = []
        while len(documents) < 2:  # each redraw arrives whole, as it is drawn
            line = process.stdout.readline()  # type: ignore[union-attr]
            assert line, process.stderr.read()  # type: ignore[union-attr]
            documents.append(json.loads(line))
        process.send_signal(signal.SIGINT)
        assert process.wait(60) == 0
    assert all(len(document["gpus"]) == 8 for document in documents)


# ---- a job's GPUs in rank order -----------------------------------------------------------


def test_ranks_keep_their_order_and_ranges_only_rise() -> None:
    from gpualloc.model.cpuset import format_cpulist, format_ranks

    assert format_ranks([3, 1]) == "3,1"
    assert format_ranks([4, 5, 6, 7, 0, 1, 2, 3]) == "4-7,0-3"
    assert format_ranks([0, 2, 3]) == "0,2-3"
    assert format_cpulist([3, 1]) == "1,3"  # a set of CPUs or GPUs stays sorted


def test_who_holds_what_lists_the_gpus_sorted(cli) -> None:
    """Rank order is for the job's own start line (below); a 7-GPU ring's order squeezed into
    ranges read ``GPU 0-1,3-5,2,6 held by ...`` in the busy error and ``status``."""
    allocated = cli("-t", "dgx1-v100", "alloc", "-n", "7", "--hold", "--format", "env")
    assert allocated.exit_code == 0, allocated.stderr
    ring = allocated.stdout.split("CUDA_VISIBLE_DEVICES=")[1].split()[0].split(",")
    assert ring != sorted(ring) and sorted(ring) == list("0123456")  # MAPA's ring, for CUDA
    busy = cli("-t", "dgx1-v100", "run", "-n", "2", "--", "true")
    assert busy.exit_code == 10 and "GPU 0-6 held by" in busy.stderr, busy.stderr
    released = cli("-t", "dgx1-v100", "release", "--mine")
    assert released.exit_code == 0, released.stderr
    assert "released GPU 0-6 held by" in released.stdout


@pytest.mark.slow
def test_run_announces_its_gpus_in_rank_order() -> None:
    argv = [sys.executable, "-m", "gpualloc", "-t", "dgx1-v100", "run", "--gpus", "3,1"]
    shell = 'echo "$CUDA_VISIBLE_DEVICES"'
    done = subprocess.run(
        [*argv, "--", "sh", "-c", shell], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "3,1\n"
    assert ": GPU 3,1 (" in done.stderr


# ---- run --wait's status line ---------------------------------------------------------------

HOLDERS = "held by alice: 0-3, bob: 4,5, not gpualloc: 6"


def waiting(reason: str = "2 GPU(s) needed with at least 50 GB/s between them, 1 free (GPU 7)"):
    from gpualloc.host.terms import WaitStatus

    return WaitStatus(position=2, queue_length=3, reason=reason, holders=HOLDERS, waited_s=312)


def test_the_waiting_line_on_an_80_column_terminal_keeps_who_holds_the_gpus(monkeypatch) -> None:
    """Cut at the terminal's width, it lost exactly the ``held by ...`` part."""
    from gpualloc.cli.open_ledger import StatusLine

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setenv("COLUMNS", "80")
    StatusLine().show(waiting())
    shown = terminal.getvalue().split("\r\x1b[K")[-1]
    assert shown.endswith(HOLDERS) and len(shown) < 80
    assert shown.startswith("gpualloc: waiting 5m, #2 of 3")


def test_the_waiting_line_gives_up_the_reason_first_then_words_then_holders() -> None:
    from gpualloc.cli.open_ledger import wait_line

    full = wait_line(waiting(), 200)
    assert full == f"gpualloc: waiting 5m, #2 of 3 in the queue: {waiting().reason}; {HOLDERS}"
    shorter = wait_line(waiting(), 120)
    assert shorter.endswith(f"with at …; {HOLDERS}") and len(shorter) <= 120
    assert wait_line(waiting(), 60) == "waiting 5m, #2/3; held by alice: 0-3, bob: 4,5 +1 more"
    assert wait_line(waiting(), 30) == "waiting 5m, #2/3"
    for width in range(20, 200):
        assert len(wait_line(waiting(), width)) <= width


# ---- notes and hints that lead somewhere true ----------------------------------------------

OPENB = FIXTURES / "traces" / "openb_pod_list_excerpt.csv"


def test_a_trace_asking_for_parts_of_gpus_says_once_that_they_run_whole(cli) -> None:
    quiet = cli("-t", "dgx2", "simulate", "--trace", str(OPENB))
    assert quiet.exit_code == 0, quiet.stderr
    notes = [line for line in quiet.stderr.splitlines() if "part of a GPU" in line]
    assert len(notes) == 1 and "each holds a whole GPU" in notes[0] and "--sharing" in notes[0]
    shared = cli("-t", "dgx2", "simulate", "--trace", str(OPENB), "--sharing", "8")
    assert shared.exit_code == 0, shared.stderr
    assert "part of a GPU" not in shared.stderr


def test_a_pod_list_without_times_is_told_what_it_lacks(cli, tmp_path: Path) -> None:
    pods = tmp_path / "openb_pod_list_cut.csv"
    pods.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\nopenb-pod-0000,12000,16384,1,460,\n",
        encoding="utf-8",
    )
    result = cli("-t", "dgx2", "simulate", "--trace", str(pods))
    assert result.exit_code == 14, result.stderr
    assert "lacks creation_time, deletion_time, scheduled_time" in result.stderr
    assert "arrival_s" not in result.stderr.splitlines()[0]
    nodes = tmp_path / "openb_node_list_gpu_node.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nopenb-node-0000,64000,262144,2,P100\n")
    listed = cli("-t", "dgx2", "simulate", "--trace", str(nodes))
    assert listed.exit_code == 14 and "node list" in listed.stderr


def test_the_hints_for_an_nccl_tests_output_are_not_a_circle(cli, monkeypatch) -> None:
    """topo import sent it to calibrate --from, which without a GPU sent it back."""
    from gpualloc.discovery import resolve
    from gpualloc.errors import NoGpuFound

    nccl = FIXTURES / "measured" / "nccl_tests" / "a100x8_sxm4_40gb_superbench.txt"
    imported = cli("topo", "import", "--bandwidth-matrix", str(nccl))
    hint = next(line for line in imported.stderr.splitlines() if line.startswith("hint:"))
    assert "nvbandwidth" in hint and "on the host that measured them" in hint

    def no_gpu() -> None:
        raise NoGpuFound("no NVIDIA GPU found")

    monkeypatch.setattr(resolve, "host_key", no_gpu)
    stored = cli("calibrate", "--from", str(nccl))
    assert stored.exit_code == 6
    hint = next(line for line in stored.stderr.splitlines() if line.startswith("hint:"))
    assert "on the host that made the file" in hint
    assert "not nccl-tests' collectives" in hint  # topo import is no way for this file


# ---- alloc tells a person its lease -------------------------------------------------------------


def test_alloc_names_its_lease_on_a_terminal_and_prints_only_ids_to_a_script(
    cli, tmp_path: Path
) -> None:
    """``alloc --hold`` printed ``0,3`` and nothing else: the lease needed to give the GPUs back
    was not said (a script reading standard output still reads the ids alone)."""
    shown = on_terminal(["-t", "dgx1-v100", "alloc", "-n", "2", "--hold"], 80)
    ids, said = shown.splitlines()
    lease = re.fullmatch(r"lease ([0-9a-f]+): 'gpualloc release \1' gives the GPUs back", said)
    assert ids == "0,3" and lease is not None, shown
    piped = cli("-t", "dgx1-v100", "alloc", "-n", "2", "--hold")
    assert piped.exit_code == 0 and piped.stdout == "1,2\n" and piped.stderr == ""


@pytest.mark.parametrize("group", [(), ("topo",), ("slurm",), ("config",)])
def test_command_summaries_are_whole_at_80_columns(group: tuple[str, ...]) -> None:
    """``gpualloc --help`` cut every command's summary mid-sentence with '...'."""
    shown = subprocess.run(
        [sys.executable, "-m", "gpualloc", *group, "--help"],
        capture_output=True, text=True, check=True, env=dict(os.environ, COLUMNS="80"), timeout=120,
    ).stdout  # fmt: skip
    listed = shown.split("Commands:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert listed
    for line in listed:
        assert not line.endswith("...") and line.rstrip().endswith("."), line
        assert len(line) <= 80, line
