"""Every file format gpualloc reads, mutated from real files: topology JSON
(wrong types, missing keys, non-finite numbers, huge lists, duplicate indices), raw
``nvidia-smi topo -m`` text, ``nvlink -s``, ``numactl``, MIG listings, ``topo -p2p``, bandwidth
matrices and tables, nvbandwidth / p2pBandwidthLatencyTest / nccl-tests outputs (``topo import
--bandwidth-matrix``, ``calibrate --from``, ``doctor --measured``), simulation traces (CSV,
JSON Lines, the Alibaba pod list), job profiles, pattern files and Slurm's MIG minors. The
rules are :mod:`tests.fuzz_harness`'s; the real files are in ``tests/fixtures``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz_harness import LONG, check, fast, workspace
from tests.recordings import FIXTURES

TOPOLOGIES = Path(__file__).resolve().parent.parent / "gpualloc" / "topologies"
PROFILE = TOPOLOGIES.parent / "simulate" / "drb_profile.json"


def _text(path: Path) -> str:
    """A fixture's recorded output, without its provenance header (``#`` lines, a blank)."""
    text = path.read_text(encoding="utf-8")
    head, blank, rest = text.partition("\n\n")
    return rest if blank and all(line.startswith("#") for line in head.splitlines()) else text


def _fixtures(folder: str, pattern: str = "*") -> tuple[str, ...]:
    return tuple(_text(p) for p in sorted((FIXTURES / folder).glob(pattern)))


TOPO_M = _fixtures("topologies", "*_topo.txt") + _fixtures("measured/topo")
NVLINK = _fixtures("topologies", "nvlink_status_*") + _fixtures("measured/nvlink_status")
NUMA = _fixtures("topologies", "numactl_*")
MIG = _fixtures("topologies", "mig_*") + _fixtures("measured/mig")
P2P = _fixtures("topologies", "p2p_*")
MATRICES = (
    _fixtures("bandwidth")
    + _fixtures("measured/nvbandwidth")
    + _fixtures("measured/p2p_bandwidth_latency")
)
MEASURED = MATRICES + _fixtures("measured/nccl_tests")
POD_LIST = (
    "\n".join((FIXTURES / "traces" / "openb_pod_list_excerpt.csv").read_text().splitlines()[:40])
    + "\n",
)  # its header and first tasks: enough to mutate, quick to simulate
CSV_TRACE = (
    "id,arrival_s,gpus,duration_s,sensitive,pattern,workload,min_utility,min_bandwidth,priority\n"
    "a,0,2,30,1,ring,alexnet,0.5,10,normal\nb,5,1,60,0,tree,googlenet,0,0,low\n"
    "c,7.5,4,10,true,all,vgg16,0.3,,high\n"
)
JSONL_TRACE = (
    '{"id": "a", "arrival_s": 0, "gpus": 2, "duration_s": 30, "sensitive": true}\n'
    '{"id": "b", "arrival_s": 5, "gpus": 1, "duration_s": 60, "sensitive": false, '
    '"gpu_fraction": 0.5}\n'
)
MIG_MINORS = "".join(
    f"gpu{g}/gi{gi}/access {g * 200 + gi * 10}\ngpu{g}/gi{gi}/ci0/access {g * 200 + gi * 10 + 1}\n"
    for g in range(2)
    for gi in (1, 2, 7)
)


# ---- mutating text -----------------------------------------------------------------------------

TOKENS = (
    "nan", "NaN", "inf", "-inf", "-1", "0", "1e308", "1e-320", "99999999999999999999", "X",
    "NV99", "NV0", "NV", "PIX", "SYS", "GPU99", "GPU0", "GPU", "-", "N/A", "\x1b[31m", "a" * 300,
    "0-999999999", "١", "", "|", ",", "1,2", "GB/s", "MIG", "\ufeff", "-0", "0x10",
)  # fmt: skip
"""What a token of a recorded output is replaced with."""
edits = st.lists(
    st.one_of(
        st.tuples(st.just("token"), st.integers(0, 10**6), st.sampled_from(TOKENS)),
        st.tuples(st.just("delete-line"), st.integers(0, 10**6)),
        st.tuples(st.just("duplicate-line"), st.integers(0, 10**6)),
        st.tuples(st.just("swap-lines"), st.integers(0, 10**6), st.integers(0, 10**6)),
        st.tuples(st.just("repeat-line"), st.integers(0, 10**6), st.integers(2, 200)),
        st.tuples(st.just("truncate"), st.floats(0, 1)),
        st.tuples(st.just("bytes"), st.integers(0, 10**6), st.binary(min_size=1, max_size=20)),
        st.tuples(st.just("drop-column"), st.integers(0, 40)),
    ),
    min_size=1,
    max_size=4,
)


def mutate_text(text: str, edits: list[tuple]) -> bytes:
    """``text`` with ``edits`` applied: tokens replaced, lines dropped, repeated, swapped, the
    file cut, bytes that are not UTF-8 put in, a column dropped."""
    data = text.encode("utf-8", "surrogateescape")
    for edit in edits:
        lines = data.split(b"\n")
        kind, where = edit[0], edit[1]
        line = where % len(lines) if isinstance(where, int) else 0
        if kind == "token":
            spans = [m.span() for m in re.finditer(rb"\S+", data)]
            if spans:
                start, end = spans[where % len(spans)]
                data = data[:start] + edit[2].encode("utf-8", "surrogateescape") + data[end:]
        elif kind == "delete-line":
            data = b"\n".join(lines[:line] + lines[line + 1 :])
        elif kind == "duplicate-line":
            data = b"\n".join(lines[: line + 1] + lines[line:])
        elif kind == "swap-lines":
            other = edit[2] % len(lines)
            lines[line], lines[other] = lines[other], lines[line]
            data = b"\n".join(lines)
        elif kind == "repeat-line":
            data = b"\n".join(lines[:line] + [lines[line]] * edit[2] + lines[line + 1 :])
        elif kind == "truncate":
            data = data[: int(len(data) * where)]
        elif kind == "bytes":
            at = where % (len(data) + 1)
            data = data[:at] + edit[2] + data[at:]
        elif kind == "drop-column":
            data = b"\n".join(
                b" ".join(c for i, c in enumerate(row.split()) if i != where) for row in lines
            )
    return data


def texts(samples: tuple[str, ...]) -> st.SearchStrategy[bytes]:
    """One of ``samples`` as it is, or mutated."""
    return st.tuples(st.sampled_from(samples), st.one_of(st.just([]), edits)).map(
        lambda pair: mutate_text(*pair)
    )


# ---- mutating JSON -----------------------------------------------------------------------------

DEEP = "[" * 100_000 + "]" * 100_000
DEEP_MARK = b"(a document nested 100,000 deep)"
JSON_VALUES = (
    float("nan"), float("inf"), float("-inf"), 1e308, -0.0, 10**30, -1, 0, 0.5, "", None, [],
    {}, "x" * 5000, True, "1", [1, 1], {"x": 1}, 2**63, -(2**63) - 1, "\x1b[31m",
)  # fmt: skip


def _paths(document: Any, prefix: tuple = ()) -> list[tuple]:
    """Every place in ``document`` (keys of objects, indices of the first items of lists)."""
    found = [prefix]
    if isinstance(document, dict):
        for key, value in document.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(document, list):
        for index, value in enumerate(document[:3]):
            found += _paths(value, (*prefix, index))
    return found


def _parent(document: Any, path: tuple) -> tuple[Any, Any]:
    for step in path[:-1]:
        document = document[step]
    return document, path[-1]


json_edits = st.lists(
    st.tuples(
        st.sampled_from(["set", "delete", "duplicate", "grow", "unknown-key"]),
        st.integers(0, 10**6),
        st.sampled_from(range(len(JSON_VALUES))),
    ),
    min_size=1,
    max_size=3,
)


def mutate_json(document: Any, edits: list[tuple]) -> bytes:
    """``document`` with values set to hostile ones, keys deleted, list items duplicated or a
    list grown up to a thousandfold, unknown keys added; written with NaN and Infinity as
    Python's json writes them."""
    document = json.loads(json.dumps(document))
    for kind, where, value in edits:
        paths = [p for p in _paths(document) if p]
        if not paths:
            break
        parent, key = _parent(document, paths[where % len(paths)])
        # A copy, never JSON_VALUES' own: a later edit of it made a cycle (and changed them).
        fresh = json.loads(json.dumps(JSON_VALUES[value]))
        if kind == "set":
            parent[key] = fresh
        elif kind == "delete":
            del parent[key]
        elif kind == "duplicate" and isinstance(parent, list):
            parent.insert(key, json.loads(json.dumps(parent[key])))
        elif kind == "grow" and isinstance(parent[key], list):
            # To 10,000 items at most: a list grown a thousandfold thrice took 12 GB to write.
            times = 10_000 // max(1, len(parent[key]))
            parent[key] = parent[key] * max(1, min(1000, times))
        elif kind == "unknown-key" and isinstance(parent[key], dict):
            parent[key]["no_such_key"] = fresh
    return json.dumps(document).encode()


def jsons(samples: tuple[Any, ...], *, deep: bool = True) -> st.SearchStrategy[bytes]:
    """One of ``samples`` mutated, or (``deep``) a document nested too deep for a recursive
    reader (:data:`DEEP`, made when the case runs: hypothesis would print all of it)."""
    mutated = st.tuples(st.sampled_from(samples), json_edits).map(lambda pair: mutate_json(*pair))
    return st.one_of(mutated, st.just(DEEP_MARK)) if deep else mutated


TOPOLOGY_DOCUMENTS = tuple(
    json.loads((TOPOLOGIES / f"{name}.json").read_text())
    for name in ("dgx1-v100", "dgx-a100-mig", "single-gpu")
)
BANDWIDTH_TABLES = (
    {"pcie_path_factor": {"SYS": 0.4}, "nvlink_link_gbps": {"2": 25.0}},
    {"default_pcie_generation": 4, "unknown_path_factor": 0.5, "pcie_lane_gbps": {"4": 1.969}},
)
PATTERNS = ([[0, 1], [1, 2]], {"edges": [[0, 1], [1, 0], [0, 2]]}, [[0, 1]])
PROFILES = (json.loads(PROFILE.read_text()),)


# ---- the formats and the commands that read them -----------------------------------------------

BASE_TOPO = str(FIXTURES / "topologies" / "dgx1-v100_vast_topo.txt")
TWO_GPU_TOPO = str(FIXTURES / "topologies" / "2x-rtx5090_threadripper_phb_topo.txt")
FORMATS: dict[str, tuple[st.SearchStrategy[bytes], tuple[list[str], ...]]] = {
    "topology.json": (
        jsons(TOPOLOGY_DOCUMENTS),
        (
            ["-t", "{f}", "topo", "show"],
            ["-t", "{f}", "plan", "-n", "2"],
            ["-t", "{f}", "alloc", "--hold", "-n", "1"],
            ["-t", "{f}", "alloc", "--hold", "--mig", "1g.5gb"],
            ["-t", "{f}", "status", "--json"],
            ["-t", "{f}", "metrics"],
            ["-t", "{f}", "doctor"],
            ["-t", "{f}", "slurm", "gres-conf"],
            ["-t", "{f}", "topo", "export", "--format", "json"],
            ["-t", "{f}", "run", "--dry-run", "-n", "2", "--", "true"],
            ["-t", "{f}", "simulate", "--generate", "mapa:jobs=5"],
        ),
    ),
    "topo.txt": (
        texts(TOPO_M),
        (["topo", "import", "{f}"], ["-t", "{f}", "topo", "show"], ["-t", "{f}", "plan"]),
    ),
    "nvlink.txt": (texts(NVLINK), (["topo", "import", BASE_TOPO, "--nvlink", "{f}"],)),
    "numa.txt": (texts(NUMA), (["topo", "import", BASE_TOPO, "--numa", "{f}"],)),
    "mig.txt": (texts(MIG), (["topo", "import", "--mig", "{f}"],)),
    "p2p.txt": (texts(P2P), (["topo", "import", TWO_GPU_TOPO, "--p2p", "{f}"],)),
    "matrix.txt": (
        texts(MATRICES),
        (
            ["topo", "import", "--bandwidth-matrix", "{f}"],
            ["topo", "import", BASE_TOPO, "--bandwidth-matrix", "{f}"],
            ["-t", "dgx1-v100", "doctor", "--measured", "{f}"],
        ),
    ),
    "measured.txt": (
        texts(MEASURED),
        (["-t", "dgx1-v100", "calibrate", "--from", "{f}"], ["doctor", "--measured", "{f}"]),
    ),
    "bandwidth.json": (
        jsons(BANDWIDTH_TABLES),
        (
            ["--bandwidth-table", "{f}", "-t", "dgx1-v100", "plan", "-n", "2"],
            ["--bandwidth-table", "{f}", "-t", "dgx1-v100", "topo", "show"],
        ),
    ),
    "trace.csv": (
        st.one_of(texts((CSV_TRACE,)), texts(POD_LIST)),
        (["-t", "dgx1-v100", "simulate", "--trace", "{f}"],),
    ),
    "trace.jsonl": (
        st.one_of(texts((JSONL_TRACE,)), jsons(({"id": "a", "arrival_s": 0, "gpus": 1},))),
        (["-t", "dgx1-v100", "simulate", "--trace", "{f}", "--json"],),
    ),
    "profile.json": (
        jsons(PROFILES),
        (["-t", "dgx1-v100", "simulate", "--generate", "drb:jobs=5", "--profile", "{f}"],),
    ),
    "pattern.json": (
        jsons(
            PATTERNS, deep=False
        ),  # deep: test_fuzz_findings, a fix for placement/mapa/patterns.py
        (
            ["-t", "dgx1-v100", "plan", "-n", "3", "--pattern", "{f}"],
            ["-t", "dgx1-v100", "alloc", "--hold", "-n", "3", "--pattern", "{f}"],
        ),
    ),
    "mig-minors": (
        texts((MIG_MINORS,)),
        (["-t", "dgx-a100-mig", "slurm", "gres-conf", "--mig-minors", "{f}"],),
    ),
}
"""Each format: the files (mutated from real ones) and the commands that read them."""

format_cases = st.sampled_from(sorted(FORMATS)).flatmap(
    lambda name: st.tuples(st.just(name), st.sampled_from(FORMATS[name][1]), FORMATS[name][0])
)


def _format_case(case: tuple[str, list[str], bytes]) -> None:
    name, command, data = case
    with workspace() as workdir:
        path = workdir / name
        path.write_bytes(DEEP.encode() if data == DEEP_MARK else data)
        args = [str(path) if arg == "{f}" else arg for arg in command]
        result = check(args, workdir, quoted=_strings(data))
        if result.exit_code == 0 and "alloc" in args:
            check([*args[:2], "release", "--mine"], workdir, quoted=_strings(data))


def _strings(data: bytes) -> list[str]:
    """What a file says that gpualloc may say back (its names, a token it quotes)."""
    return data.decode("utf-8", "replace").split()


@fast(25)
@given(case=format_cases)
def test_file_formats(case: tuple) -> None:
    _format_case(case)


@pytest.mark.slow
@LONG
@given(case=format_cases)
def test_file_formats_at_length(case: tuple) -> None:
    _format_case(case)


def test_the_real_files_are_read() -> None:
    """Unmutated, every sample is one gpualloc takes (a fixture that fails already would only
    test the first error)."""
    assert len(TOPO_M) > 10 and NVLINK and NUMA and MIG and P2P and MATRICES and POD_LIST
    with workspace() as workdir:
        for text in TOPO_M[:3]:
            (workdir / "t.txt").write_text(text)
            result = check(["topo", "import", str(workdir / "t.txt")], workdir)
            assert result.exit_code == 0, result.stderr
        (workdir / "trace.csv").write_text(CSV_TRACE)
        result = check(["-t", "dgx1-v100", "simulate", "--trace", "trace.csv"], workdir)
        assert result.exit_code == 0, result.stderr
