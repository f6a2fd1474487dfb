"""One number cannot make gpualloc work without bound.

On main before the fix, each of these hung or grew until the kernel killed the process: a job
count turned into a pattern of that many edges (``-n 10**17``: a 24 GB broker), GPU lists
(``--gpus 0-99999999999``) and CPU or NUMA ranges in recorded text expanded before they were
bounded. Now a count above :data:`~gpualloc.job_options.MAX_GPUS` is a usage error, a count the
host cannot hold is exit 9 as before (before any search), and every list is checked from its
numbers alone; each refusal is one ``error:`` line naming the bound.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest

from gpualloc.errors import ExitCode, RequestError
from gpualloc.job_options import MAX_GPUS
from gpualloc.model.cpuset import CPU_ID_BOUND, parse_cpulist
from tests.broker_harness import ROOT, RunningBroker
from tests.cli_harness import Result
from tests.house_rules import refused

TOPOLOGY = ("--topology", "dgx1-v100")  # 8 GPUs
HUGE = "100000000000000000"
MEMORY_LIMIT_BYTES = 2 * 2**30
"""Address space of every gpualloc these tests start: a regression fails the test with a
MemoryError instead of taking the machine's memory (the 24 GB of the issue)."""


# ---- counts -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("plan", "-n", "100000000"),
        ("plan", "-n", "20000", "--pattern", "all"),
        ("run", "-n", HUGE, "--", "true"),
        ("alloc", "--hold", "-n", HUGE),
    ],
    ids=["plan", "plan-all", "run", "alloc"],
)
def test_a_count_no_host_has_is_refused_before_any_pattern(cli, monkeypatch, args) -> None:
    from gpualloc.placement.mapa import patterns

    def built(*_: object) -> None:
        raise AssertionError("a pattern was built")

    monkeypatch.setattr(patterns, "_BUILDERS", dict.fromkeys(patterns._BUILDERS, built))
    result = cli(*TOPOLOGY, *args)
    assert result.exit_code == ExitCode.USAGE, result.stderr
    assert f"at most {MAX_GPUS}" in refused(result.stderr)


def test_a_count_above_the_host_is_exit_9_and_above_the_cap_a_usage_error(cli) -> None:
    """Up to the cap, today's answer (exit 9, the host's numbers, no search); past it, exit 2."""
    cases = [
        ("9", ExitCode.NO_PLACEMENT, "the job asks for 9 GPUs but 8 of 8 GPUs are usable"),
        (str(MAX_GPUS), ExitCode.NO_PLACEMENT, f"the job asks for {MAX_GPUS} GPUs but 8 of 8"),
        (str(MAX_GPUS + 1), ExitCode.USAGE, f"at most {MAX_GPUS}"),
    ]
    for count, code, says in cases:
        result = cli(*TOPOLOGY, "plan", "-n", count, "--pattern", "all")
        assert result.exit_code == code, result.stderr
        assert says in refused(result.stderr)


def test_the_library_refuses_a_count_before_building_a_pattern() -> None:
    from gpualloc.config import Config
    from gpualloc.model.job import JobOptions
    from gpualloc.placement.mapa.patterns import PatternError, build_pattern
    from gpualloc.placement.options import want_of

    with pytest.raises(RequestError, match=f"out of range .1 to {MAX_GPUS}."):
        JobOptions(count=10**17)
    with pytest.raises(RequestError, match="out of range"):
        JobOptions(count=10**5000)  # not even printable: CPython refuses str() past 4300 digits
    for pattern in ("ring", "all"):
        with pytest.raises(PatternError, match=f"more than {MAX_GPUS}"):
            build_pattern(pattern, 10**17)
    for iterable in ("gpus", "exclude", "require"):
        with pytest.raises(RequestError, match=f"at most {MAX_GPUS}"):
            want_of(JobOptions(**{iterable: range(10**17)}), Config.load())


@pytest.mark.parametrize("iterable", ["explicit", "exclude", "require"])
def test_the_api_reads_a_gpu_list_no_further_than_a_host_could_have(iterable: str) -> None:
    """``gpualloc.api`` keeps an iterable of GPUs as a tuple: it reads no more of it than
    MAX_GPUS and one, and refuses the rest as the struct does (``range(10**17)`` was a
    MemoryError, and an endless generator would never have ended)."""
    import itertools

    from gpualloc import api

    topology = api.load_topology("dgx1-v100")
    for values in (range(10**17), itertools.count()):
        with pytest.raises(
            RequestError, match=f"names more GPUs than a host has .at most {MAX_GPUS}"
        ):
            api.plan(topology, 2, **{iterable: values})


# ---- GPU lists ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("run", "--gpus", "0-99999999999", "--", "true"),
        ("run", "--exclude", "0-99999999999", "--", "true"),
        ("alloc", "--hold", "--require", "0-99999999999"),
        ("plan", "-n", "1", "--busy", "0-99999999999"),
        ("plan", "-n", "1", "--free", "1,0-99999999999"),
    ],
    ids=["gpus", "exclude", "require", "busy", "free"],
)
def test_a_gpu_range_is_bounded_before_it_is_expanded(cli, args) -> None:
    result = cli(*TOPOLOGY, *args)
    assert result.exit_code == ExitCode.USAGE, result.stderr
    assert f"GPU index 99999999999 is too large (at most {MAX_GPUS - 1})" in refused(result.stderr)


def test_a_gpu_list_naming_more_gpus_than_a_host_has_is_refused(cli) -> None:
    many = ",".join(["0-200"] * 1000)  # every index small, 201,000 GPUs named
    result = cli(*TOPOLOGY, "run", "--gpus", many, "--", "true")
    assert result.exit_code == ExitCode.USAGE, result.stderr
    assert f"names 201000 GPUs, more than a host has (at most {MAX_GPUS})" in refused(result.stderr)


# ---- CPU and NUMA ranges in recorded text -------------------------------------------------

TOPO_M = """\
        GPU0    GPU1    CPU Affinity    NUMA Affinity
GPU0     X      PHB     {cpus}          {numa}
GPU1    PHB      X      0-11            0
"""


@pytest.mark.parametrize(
    ("cpus", "numa", "says"),
    [
        ("0-99999999999", "0", f"CPU id 99999999999 is too large (at most {CPU_ID_BOUND - 1})"),
        ("0-11", "0-99999999999", "NUMA node id 99999999999 is too large"),
    ],
    ids=["cpu-affinity", "numa-affinity"],
)
def test_a_topo_m_affinity_range_is_bounded_before_it_is_expanded(
    cli, tmp_path: Path, cpus: str, numa: str, says: str
) -> None:
    text = tmp_path / "topo.txt"
    text.write_text(TOPO_M.format(cpus=cpus, numa=numa))
    result = cli("topo", "import", str(text))
    assert result.exit_code == ExitCode.TOPOLOGY_PARSE, result.stderr
    error = refused(result.stderr)
    assert "line 2" in error and says in error


@pytest.mark.parametrize(
    ("numactl", "says"),
    [
        ("available: 1 nodes (0-99999999999)\nnode 0 cpus: 0 1\n", "NUMA node id 99999999999"),
        ("available: 1 nodes (0)\nnode 0 cpus: 0 99999999999\n", "CPU id 99999999999"),
    ],
    ids=["node-range", "cpu-id"],
)
def test_a_numactl_range_is_bounded_before_it_is_expanded(
    cli, tmp_path: Path, numactl: str, says: str
) -> None:
    topo, numa = tmp_path / "topo.txt", tmp_path / "numa.txt"
    topo.write_text(TOPO_M.format(cpus="0-11", numa="0"))
    numa.write_text(numactl + "node 0 size: 100 MB\n")
    result = cli("topo", "import", str(topo), "--numa", str(numa))
    assert result.exit_code == ExitCode.TOPOLOGY_PARSE, result.stderr
    error = refused(result.stderr)
    assert "line 1" in error or "line 2" in error
    assert f"{says} is too large (at most {CPU_ID_BOUND - 1})" in error


def test_a_cpulist_names_its_bound_and_merges_before_expanding() -> None:
    with pytest.raises(
        ValueError, match=f"CPU id 99999999999 is too large .at most {CPU_ID_BOUND - 1}"
    ):
        parse_cpulist("0-99999999999")
    with pytest.raises(ValueError, match=re.escape("12345678901234567890... (5000 digits)")):
        parse_cpulist("1234567890" * 500)  # refused by its length, never given to int()
    assert parse_cpulist("2-3,0-1," * 20_000 + "5") == [0, 1, 2, 3, 5]


# ---- the real entry point and the broker --------------------------------------------------


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "code"),
    [
        (("plan", "-n", "100000000"), ExitCode.USAGE),
        (("plan", "-n", "20000", "--pattern", "all"), ExitCode.USAGE),
        (("run", "--gpus", "0-99999999999", "--", "true"), ExitCode.USAGE),
        (("alloc", "--hold", "-n", HUGE), ExitCode.USAGE),
    ],
    ids=["plan", "plan-all", "run-gpus", "alloc"],
)
def test_the_issues_commands_answer_at_once(args: tuple[str, ...], code: ExitCode) -> None:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "gpualloc", *TOPOLOGY, *args],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=20,
        preexec_fn=_limited,
    )
    assert result.returncode == code, result.stderr
    refused(result.stderr)
    assert time.monotonic() - started < 10


class _LimitedBroker(RunningBroker):
    """The harness's broker in a bounded address space (see MEMORY_LIMIT_BYTES)."""

    def argv(self) -> list[str]:
        limit = (
            "import os, resource, sys; "
            f"cap = {MEMORY_LIMIT_BYTES}; resource.setrlimit(resource.RLIMIT_AS, (cap, cap)); "
            "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
        )
        return [sys.executable, "-c", limit, *super().argv()[1:]]

    def peak_rss_bytes(self) -> int:
        assert self.process is not None
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        line = next(line for line in status.splitlines() if line.startswith("VmHWM:"))
        return int(line.split()[1]) * 1024


@pytest.fixture
def broker() -> Iterator[_LimitedBroker]:
    if os.geteuid() != 0:
        pytest.skip("the broker's tests run it as root (CI runs as root)")
    running = _LimitedBroker("dgx1-v100").start()
    yield running
    running.stop()
    shutil.rmtree(running.directory, ignore_errors=True)


def _alloc(lease_id: str, **options: object) -> dict:
    """An ``alloc`` as the broker's client sends it (``BrokeredHost._alloc``)."""
    return {
        "lease_id": lease_id,
        "options": {"policy": "mapa", **options},
        "terms": {"source": "alloc", "hold": True},
        "wait": None,
        "allow_unhealthy": False,
        "views": {"uuid": False},
    }


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [{"count": 10**17}, {"count": 10**17, "pattern": "all"}, {"gpus": "0-99999999999"}],
    ids=["count", "count-all", "gpus"],
)
def test_the_broker_refuses_a_hostile_number_at_once_and_keeps_serving(
    broker: _LimitedBroker, options: dict
) -> None:
    before = broker.peak_rss_bytes()
    started = time.monotonic()
    answer = broker.raw_call("alloc", _alloc("aaaaaaaaaaaa", **options))
    assert time.monotonic() - started < 2
    assert answer["ok"] is False and answer["error"]["code"] == ExitCode.USAGE, answer
    assert broker.call("alloc", _alloc("bbbbbbbbbbbb", count=2))["lease"]["id"] == "bbbbbbbbbbbb"
    assert broker.peak_rss_bytes() < before + 64 * 2**20, "the refusal cost memory"


# ---- the work of one request is bounded by its ranks ---------------------------------------------


def test_a_pattern_file_of_many_repeated_edges_is_refused_at_once(
    cli: Callable[..., Result], tmp_path: Path
) -> None:
    """A 44 KB pattern of 8 ranks stalled the broker for half a minute: a pattern has at most
    n(n-1) edges, and names each pair once beyond the 2-GPU ring, checked while the file is
    read."""
    pattern = tmp_path / "long.json"
    pattern.write_text(json.dumps([[0, 1]] * 5000))
    started = time.monotonic()
    result = cli("--topology", "dgx1-v100", "plan", "-n", "8", "--pattern", str(pattern))
    assert result.exit_code != 0 and time.monotonic() - started < 5
    assert "edge #1 (0, 1) names ranks 0 and 1 again" in result.stderr, result.stderr


def test_a_sent_pattern_of_many_edges_is_refused_before_any_placement() -> None:
    """What a broker client sends as a pattern's edges: refused as a bad request (exit 2), not
    placed, whatever its edge list's length."""
    from gpualloc.broker.requests import options_want
    from gpualloc.config import Config

    raw = {
        "count": 8, "pattern": "file:x", "edges": [[0, 1]] * 5000, "sensitive": True,
        "policy": "mapa", "score": "auto",
    }  # fmt: skip
    started = time.monotonic()
    with pytest.raises(RequestError, match="at most 28 edges"):
        options_want(raw, Config.load())
    assert time.monotonic() - started < 1


def test_a_pattern_naming_a_pair_twice_is_refused_on_every_way_in() -> None:
    """The order searches assume one edge a pair beyond the 2-GPU ring; a pair named twice
    over three ranks raised an AssertionError in the broker's placement worker (which ended)
    and was an internal error on the file ledger. The model refuses it, so that no way in
    (pattern file, library, broker request, queued job) skips the rule; a broker client's is
    a bad request (exit 2)."""
    from gpualloc.broker.requests import options_want
    from gpualloc.config import Config
    from gpualloc.model.request import CommunicationPattern
    from gpualloc.placement.want import Want

    with pytest.raises(ValueError, match=r"edge #1 \(1, 0\) names ranks 0 and 1 again"):
        CommunicationPattern("custom", 3, ((0, 1), (1, 0), (0, 2)))
    assert CommunicationPattern("ring", 2, ((0, 1), (1, 0))).size == 2  # MAPA's 2-GPU ring
    with pytest.raises(ValueError, match="at most 2 edges"):
        CommunicationPattern("custom", 2, ((0, 1),) * 3)
    raw = {
        "count": 3, "pattern": "file:x", "edges": [[0, 1], [2, 0], [0, 1]], "sensitive": True,
        "policy": "drb", "score": "auto",
    }  # fmt: skip
    with pytest.raises(RequestError, match="names ranks 0 and 1 again") as refused:
        options_want(raw, Config.load())
    assert refused.value.exit_code == 2 and refused.value.message.startswith("the job's pattern")
    good = options_want({**raw, "edges": [[0, 1], [2, 0]]}, Config.load())
    queued = msgspec.structs.replace(good.queued(), edges=((0, 1), (2, 0), (1, 0)))
    with pytest.raises(RequestError, match="names ranks 0 and 1 again"):
        Want.from_queued(queued)
    from types import SimpleNamespace

    from gpualloc.host.queue import attempts
    from gpualloc.ledger.occupancy import Occupancy
    from gpualloc.ledger.schema import Ledger
    from gpualloc.topologies import load_bundled

    topology = load_bundled("dgx1-v100")  # a waiter an older gpualloc queued in a file ledger
    look = attempts(topology, Occupancy.build(topology, Ledger(host="test"), ()))
    attempt = look(SimpleNamespace(request=msgspec.structs.replace(queued, policy="drb")))
    assert attempt.placement is None and "names ranks 0 and 1 again" in attempt.reason
