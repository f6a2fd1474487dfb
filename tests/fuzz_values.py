"""What the fuzzing tests' cases are made of: hostile values by kind (numbers, durations,
sizes, GPU lists, names), files of every kind a user may name (empty, binary, 65 MiB, truncated
JSON, a FIFO, ``/dev/zero``, a directory, a dangling link, ...), output paths, and every bound a
request to the broker meets (``tests/test_fuzz_broker.py``). The rules a case's answer is held
to are ``tests/fuzz_harness.py``'s.

Every path a strategy makes is relative (a case runs in its own directory) or one of a few
absolute ones that nothing can be written to by mistake (``/dev/null``, ``/dev/full``, a
directory that does not exist): the suite runs as root, and a generated ``-o /etc/passwd``
would be obeyed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from hypothesis import strategies as st

from gpualloc.topologies import load_bundled

LONG_TEXT = "a" * 5000
HOSTILE = (
    "", " ", "nan", "NaN", "-nan", "inf", "-inf", "+Infinity", "1e308", "1e309", "-1e308",
    "-0", "-0.0", "0", "-1", "1", "2", "9" * 30, str(2**63), str(-(2**63) - 1), "0x10",
    "1_000", "١٢", "１２", "\x1b[31m", "\n", "\t1", "1\r", LONG_TEXT, "/" * 300, "日本",
    "\u202e", "\udcff", "1e-320", "5e-324", "½", "1,2", "=", ":", "%s", "{}", "'", '"', "--",
)  # fmt: skip
"""Values no option should take badly: not numbers, not finite, too large, signed zero,
digits int() reads but people do not, control and bidi characters, a lone surrogate (a byte
of an argument that was not UTF-8), very long text."""

POLICIES = ("mapa", "mapa-greedy", "drb", "pack", "spread", "besteffort", "slurm", "baseline")
hostile = st.sampled_from(HOSTILE)
text = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=30)
integers = st.one_of(
    st.integers(-3, 20), st.integers(-(2**70), 2**70), st.sampled_from([2**31, 2**63, 2**64])
).map(str)
floats = st.one_of(
    st.floats().map(repr),
    st.floats(min_value=-10, max_value=10).map(lambda f: f"{f:.3g}"),
    st.sampled_from(["1e308", "1e-308", "5e-324", "-0.0", "0.5", "1.0", "2.5", "999999"]),
)
numbers = st.one_of(integers, floats)
DURATION_UNITS = ("", "s", "m", "h", "d", "ms", "w", "min", "sec", "x", " s", "S", "H", "mn")
durations = st.one_of(
    st.tuples(numbers, st.sampled_from(DURATION_UNITS)).map("".join),
    st.sampled_from(["1h30m", "1h-30m", "30m1h", "h", "1.5h", "0s", "off", "none", "PT1H"]),
)
SIZE_UNITS = ("", "B", "K", "M", "G", "T", "P", "E", "Z", "KiB", "MiB", "GiB", "GB", "gb", " G")
sizes = st.tuples(numbers, st.sampled_from(SIZE_UNITS)).map("".join)
list_items = st.one_of(
    st.integers(-3, 20).map(str),
    st.tuples(integers, integers).map(lambda pair: f"{pair[0]}-{pair[1]}"),
    st.sampled_from(["", "-", "0-", "-3", "a", " 1", "1.5", "nan", "0x1", "GPU0", "٣"]),
)
gpu_lists = st.lists(list_items, min_size=1, max_size=5).map(",".join)


def of(*known: str) -> st.SearchStrategy[str]:
    """One of ``known``, in any case and with spaces, or something hostile."""
    return st.one_of(
        st.sampled_from(known),
        st.sampled_from(known).map(str.upper),
        st.sampled_from(known).map(lambda name: f" {name} "),
        st.lists(st.sampled_from(known), min_size=2, max_size=4).map(",".join),
        hostile,
        text,
    )


def anything(strategy: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """``strategy``, or a hostile value, or any text."""
    return st.one_of(strategy, hostile, text)


# ---- files -------------------------------------------------------------------------------------

TOPOLOGY_JSON = load_bundled("dgx1-v100").to_json()

FILE_KINDS = (
    "empty", "binary", "huge", "truncated-json", "wrong-json", "text", "fifo", "dev-zero",
    "directory", "symlink-to-directory", "dangling-symlink", "missing", "topology", "bytes",
)  # fmt: skip

WRONG_JSON = ("[]", '"x"', "1", "null", '{"gpus": "x"}', '{"schema_version": 99}', "{}")


def make(path: Path, kind: str, data: bytes) -> Path:
    """A file (or something else) of ``kind`` at ``path``."""
    if kind == "empty":
        path.write_bytes(b"")
    elif kind in ("binary", "bytes"):
        path.write_bytes(data)
    elif kind == "huge":
        with path.open("wb") as file:
            file.truncate(65 * 2**20)
    elif kind == "truncated-json":
        path.write_text(TOPOLOGY_JSON[: len(data) * 37 % len(TOPOLOGY_JSON)])
    elif kind == "wrong-json":
        path.write_text(WRONG_JSON[len(data) % len(WRONG_JSON)])
    elif kind == "text":
        path.write_text(data.decode("latin-1"))
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    elif kind == "symlink-to-directory":
        path.symlink_to(path.parent)
    elif kind == "dangling-symlink":
        path.symlink_to(path.parent / "nowhere")
    elif kind == "topology":
        path.write_text(TOPOLOGY_JSON)
    return path  # "missing": nothing there


# ---- paths -------------------------------------------------------------------------------------

OUTPUT_KINDS = (
    "new", "existing", "directory", "missing-directory", "dev-full", "dev-null", "fifo",
    "dangling-symlink", "long-name", "control-characters", "empty", "dash", "proc",
    "symlink-to-dev-full", "trailing-slash",
)  # fmt: skip


def output_path(workdir: Path, kind: str, suffix: str = ".json") -> str:
    """Where a case asks gpualloc to write, of ``kind``; always in ``workdir`` or harmless."""
    target = workdir / f"out{suffix}"
    if kind == "existing":
        target.write_text("kept\n")
    elif kind == "directory":
        return str(workdir)
    elif kind == "missing-directory":
        return str(workdir / "no" / "such" / f"out{suffix}")
    elif kind == "dev-full":
        return "/dev/full"
    elif kind == "dev-null":
        return "/dev/null"
    elif kind == "fifo":
        import os

        os.mkfifo(target)
    elif kind == "dangling-symlink":
        target.symlink_to(workdir / "nowhere" / "x")
    elif kind == "long-name":
        return str(workdir / ("n" * 300 + suffix))
    elif kind == "control-characters":
        return str(workdir / f"out\x1b[31m\n{suffix}")
    elif kind == "empty":
        return ""
    elif kind == "dash":
        return "-"
    elif kind == "proc":
        return "/proc/self/status"
    elif kind == "symlink-to-dev-full":
        target.symlink_to("/dev/full")
    elif kind == "trailing-slash":
        return f"{target}/"
    return str(target)


input_kinds = st.sampled_from(FILE_KINDS)


def input_path(workdir: Path, kind: str, data: bytes, name: str = "input.txt") -> str:
    """A file a case names as input, of one of the harness's kinds (``make``)."""
    return str(make(workdir / name, kind, data))


# ---- the broker's bounds -----------------------------------------------------------------------

BOUNDS_TOPOLOGY = "dgx1-v100"
"""The host the bounds are walked on (:data:`BROKER_BOUNDS`' answers are this host's)."""


class Bound(NamedTuple):
    """One bound the broker enforces (its constant named), walked by ``values``: the request
    line of each (``line(value)``) and the exit code its answer must carry (0: answered ok; a
    request over the size limit is answered 18 and its connection closed). ``kept``, where
    given, says what an accepted lease must hold of the value. Answers are those of a user
    who is not root, on :data:`BOUNDS_TOPOLOGY` with nothing held."""

    name: str
    line: Callable[[Any], bytes]
    values: tuple[Any, ...]
    codes: tuple[int, ...]
    kept: Callable[[Any, dict[str, Any]], bool] | None = None


def request_text(op: str, args: dict[str, Any]) -> bytes:
    return json.dumps({"v": 1, "op": op, "args": args}).encode()


def _held(**terms: Any) -> dict[str, Any]:
    return {"source": "alloc", "hold": True, **terms}


def _alloc(request: dict[str, Any] | None = None, **args: Any) -> bytes:
    from gpualloc.ledger.store import new_lease_id

    body = {"lease_id": new_lease_id(), "options": request or {"policy": "mapa", "count": 1}}
    return request_text("alloc", {**body, "terms": _held(), **args})


def _options(count: int) -> bytes:
    """An alloc as the broker's client sends it: the command line's options."""
    from gpualloc.ledger.store import new_lease_id

    options = {"policy": "mapa", "count": count}
    return request_text("alloc", {"lease_id": new_lease_id(), "options": options, "terms": _held()})


def _one(**fields: Any) -> dict[str, Any]:
    """A job's options as a client sends them (``host.brokered.sent_options``)."""
    return {"policy": "mapa", "count": 1, **fields}


def _own(pid: Any) -> Any:
    """``"own"``: the sender's pid (the line is made by the process that sends it)."""
    return os.getpid() if pid == "own" else pid


def _shared(**share: Any) -> bytes:
    return _alloc(_one(share=True, **share), terms={"source": "run", "pid": os.getpid()})


def _padded_hello(size: int) -> bytes:
    head = request_text("hello", {})
    return head + b" " * (size - len(head))


def _edges(ranks: int, count: int) -> bytes:
    pairs = [[a, b] for a in range(ranks) for b in range(a + 1, ranks)] * 3  # then repeats
    request = {"policy": "mapa", "count": ranks, "sensitive": True, "pattern": "bounds.json"}
    return _alloc({**request, "edges": pairs[:count]})


def _timeout(value: Any) -> bytes:
    return _alloc(wait={"timeout_s": value})


def _raw_timeout(token: str) -> bytes:
    """A wait's timeout written as ``token`` (NaN and Infinity: Python's JSON, not JSON)."""
    return _timeout(0.5).replace(b'"timeout_s": 0.5', f'"timeout_s": {token}'.encode())


def _nested(depth: int) -> bytes:
    return request_text("hello", {}).replace(b"{}", b'{"x": ' + b"[" * depth + b"]" * depth + b"}")


def _digits(count: int) -> bytes:
    return request_text("hello", {"x": 0}).replace(b"0", b"9" * count)


def broker_bounds() -> list[Bound]:
    """Every bound a request to the broker meets, from the constants that set them, walked
    below, at and above (``tests/test_fuzz_broker.py``)."""
    from gpualloc.broker.requests import MAX_SELECTORS
    from gpualloc.config import BY_KEY
    from gpualloc.durations import MAX_DURATION_S
    from gpualloc.host.lease_terms import MAX_NAME_CHARS, MAX_WORD_CHARS
    from gpualloc.job_options import MAX_GPUS
    from gpualloc.model.printable import MAX_COMMAND_CHARS, MAX_COMMAND_WORDS
    from gpualloc.model.request import max_edges
    from gpualloc.topologies import load_bundled
    from gpualloc.wire.protocol import MAX_REQUEST_BYTES

    host = load_bundled(BOUNDS_TOPOLOGY)
    gpus, memory = host.gpu_count, max(g.memory_total_bytes or 0 for g in host.gpus)
    bypass = BY_KEY["queue.max_bypass"].default
    words, chars = MAX_COMMAND_WORDS, MAX_COMMAND_CHARS
    year = MAX_DURATION_S
    return [
        Bound("request bytes (MAX_REQUEST_BYTES)", _padded_hello,
              (MAX_REQUEST_BYTES - 1, MAX_REQUEST_BYTES, MAX_REQUEST_BYTES + 1), (0, 0, 18)),
        Bound("command words (MAX_COMMAND_WORDS)",
              lambda n: _alloc(terms=_held(command=["w"] * n)), (words - 1, words, words + 1),
              (0, 0, 0), lambda n, made: len(made["lease"]["command"]) == min(n, words)),
        Bound("command characters (MAX_COMMAND_CHARS)",
              lambda n: _alloc(terms=_held(command=["c" * n])), (chars - 1, chars, chars + 1),
              (0, 0, 0), lambda n, made: len(made["lease"]["command"][0]) == min(n, chars)),
        Bound("lease name characters (MAX_NAME_CHARS)",
              lambda n: _alloc(terms=_held(name="n" * n)),
              (MAX_NAME_CHARS - 1, MAX_NAME_CHARS, MAX_NAME_CHARS + 1), (0, 0, 2)),
        Bound("lease selector characters (MAX_WORD_CHARS)",
              lambda n: request_text("release", {"leases": ["a" * n]}),
              (MAX_WORD_CHARS - 1, MAX_WORD_CHARS, MAX_WORD_CHARS + 1), (0, 0, 2)),
        Bound("lease selectors (MAX_SELECTORS)",
              lambda n: request_text("release", {"leases": ["zz"] * n}),
              (MAX_SELECTORS - 1, MAX_SELECTORS, MAX_SELECTORS + 1), (0, 0, 2)),
        Bound("lease id digits (12)", lambda n: _alloc(lease_id="a" * n), (11, 12, 13), (2, 0, 2)),
        Bound("GPUs of a request's options (host size, MAX_GPUS)", _options,
              (0, 1, gpus, gpus + 1, MAX_GPUS, MAX_GPUS + 1, 2**64), (2, 0, 0, 9, 9, 2, 2)),
        Bound("pattern edges of the host's size (max_edges)", lambda e: _edges(gpus, e),
              (max_edges(gpus) - 1, max_edges(gpus), max_edges(gpus) + 1), (0, 0, 2)),
        Bound("pattern edges of two ranks (max_edges)", lambda e: _edges(2, e),
              (max_edges(2) - 1, max_edges(2), max_edges(2) + 1), (0, 0, 2)),
        Bound("GPU index required", lambda g: _alloc(_one(require=[g])),
              (-1, 0, gpus - 1, gpus), (2, 0, 0, 2)),
        Bound("GPU index excluded", lambda g: _alloc(_one(exclude=[g])),
              (-1, gpus - 1, gpus), (2, 0, 2)),
        Bound("GPU index explicit", lambda g: _alloc(_one(count=None, gpus=[g])),
              (-1, gpus - 1, gpus), (2, 0, 2)),
        Bound("min_utility (0 to 1)", lambda u: _alloc(_one(min_utility=u)),
              (-1e-9, 0, 1, 1 + 1e-9), (2, 0, 9, 2)),
        Bound("declared memory_bytes (the GPU's, 2**63)",
              lambda m: _alloc(terms=_held(shareable=True, memory_bytes=m)),
              (0, 1, memory, memory + 1, 2**63 - 1, 2**63, 2**64), (2, 0, 0, 9, 9, 9, 9)),
        Bound("shared job's memory_bytes (the GPU's, 2**63)", lambda m: _shared(mem=m),
              (0, memory, memory + 1, 2**63, 2**64), (2, 0, 9, 9, 9)),
        Bound("shared job's sm_percent (1 to 100)", lambda p: _shared(sm_share=p),
              (0, 1, 100, 101), (2, 0, 0, 2)),
        Bound("pid (one of the sender's)",
              lambda pid: _alloc(terms={"source": "alloc", "pid": _own(pid)}),
              (-1, 0, "own", 2**63, 2**64), (2, 2, 0, 2, 2)),
        Bound("wait priority (queue.privileged)", lambda p: _alloc(wait={"priority": p}),
              ("low", "normal", "high", "highest"), (0, 0, 12, 2)),
        Bound("wait max_bypass (queue.max_bypass)", lambda b: _alloc(wait={"max_bypass": b}),
              (-1, bypass - 1, bypass, 2**64), (2, 12, 0, 0)),
        Bound("wait timeout_s (MAX_DURATION_S)", _timeout,
              (-1, 0, year, year + 1, 10**400, "10", True), (2, 0, 0, 2, 2, 2, 2)),
        Bound("numbers JSON has (RFC 8259)", _raw_timeout,
              ("1e308", "1e309", "NaN", "Infinity", "-Infinity"), (2, 18, 18, 18, 18)),
        Bound("a lease's time_limit_s (MAX_DURATION_S)",
              lambda t: _alloc(terms={**_held(), "time_limit_s": t}),
              (-1, 0, year, year + 1, "10", True), (2, 0, 0, 2, 2, 2)),
        Bound("a lease's signal ([number, seconds, leader only])",
              lambda sig: _alloc(terms={"source": "alloc", "pid": os.getpid(),
                                        "time_limit_s": 60, "signal": sig}),
              ([10, 60, False], [0, 60, False], [10, -1, False], "USR1", [10, 60, "x"]),
              (0, 2, 2, 2, 2)),
        Bound("eviction grace_s (MAX_DURATION_S)",
              lambda g: request_text("evict", {"leases": ["a" * 12], "grace_s": g}),
              (-1, 0, year, year + 1), (2, 0, 0, 2)),
        Bound("JSON nesting (Python's recursion)", _nested, (100, 30_000), (0, 18)),
        Bound("integer digits (sys.int_info.default_max_str_digits)", _digits,
              (4300, 4301), (0, 18)),
    ]  # fmt: skip
