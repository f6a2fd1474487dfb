"""The broker's protocol, fuzzed by two hostile users while a third works.

Hypothesis generates requests (a fifth of them; the rest are bred from those, fields crossed
between them): well-formed ones of every operation with fields replaced by
random JSON (huge and negative numbers, NaN, lone surrogates, deep nesting, wrong types),
requests near every bound the broker enforces (``tests/fuzz_values.py``'s
:func:`~tests.fuzz_values.broker_bounds`, each value moved by up to two), and
raw garbage lines. Two real Unix users send them to a real broker as fast as it answers while a
third user's ``alloc`` and ``release`` must each be answered within 1 s; afterwards the broker
still answers, its ledger reads back, and its log holds no internal error (a request that
raised anything but a gpualloc error). ``GPUALLOC_FUZZ_REQUESTS`` sets how many requests (CI:
the default, 20,000; ``benchmarks/fuzz_broker.py`` runs this longer).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from gpualloc.errors import GpuallocError
from gpualloc.ledger.document import read_ledger
from gpualloc.ledger.store import new_lease_id
from gpualloc.wire.client import BrokerClient
from tests.broker_harness import RunningBroker
from tests.fuzz_values import BOUNDS_TOPOLOGY, broker_bounds, request_text
from tests.unix_users import as_user, ensure_user, start_as_user, wait_for_user

pytestmark = pytest.mark.slow
if os.geteuid() != 0:
    pytest.skip(
        "the fuzz test runs its users as real Unix users (root only)", allow_module_level=True
    )

REQUESTS = int(os.environ.get("GPUALLOC_FUZZ_REQUESTS", "20000"))
BATCH = 100
CROSSINGS = 5
"""One request in this many is drawn by Hypothesis; the others are bred from those."""
ANSWER_S = 1.0
"""How long the honest user's alloc or release may take, at most, under the fuzzing."""

# ---- what the fuzzers send ---------------------------------------------------------------------

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(["", "0", "-1", "all", "mapa", "ring", "0-99999999999", "\udcff", "\x1b[2J"]),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5)
    ),
    max_leaves=12,
)
EDGES = st.lists(
    st.sampled_from([[0, 1], [1, 0], [0, 2], [2, 1], [1, 3], [0, 0], [0, 9]]), max_size=12
)
"""Edge lists that name pairs twice, most of them (the order searches assume one edge a pair
beyond the 2-GPU ring: such a pattern once ended the placement worker)."""
LEASE_ID = st.sampled_from(["0123456789ab", "aaaaaaaaaaaa", "", "../../etc/passwd", "x" * 300])
TEMPLATES: list[tuple[str, dict[str, Any]]] = [
    ("hello", {}),
    ("alloc", {"lease_id": "0123456789ab", "options": {"policy": "mapa", "count": 1},
               "terms": {"source": "alloc", "hold": True}}),
    ("alloc", {"lease_id": "aaaaaaaaaaaa",
               "options": {"count": 2, "sensitive": True, "pattern": "ring", "policy": "drb",
                           "edges": [[0, 1]], "require": [0], "exclude": [3]},
               "terms": {"source": "alloc", "hold": True, "name": "fuzz"}}),
    ("alloc", {"lease_id": "dddddddddddd",
               "options": {"count": 3, "sensitive": True, "pattern": "file:twice",
                           "policy": "drb", "edges": [[0, 1], [1, 0], [0, 2]]},
               "terms": {"source": "alloc", "hold": True}}),
    ("alloc", {"lease_id": "bbbbbbbbbbbb", "options": {"policy": "mapa", "count": 2,
                                                        "pattern": "all"},
               "terms": {"source": "alloc", "hold": True}, "views": True}),
    ("alloc", {"lease_id": "cccccccccccc",
               "options": {"policy": "mapa", "share": True, "mem": 1},
               "terms": {"source": "run", "pid": 1}}),
    ("release", {"leases": ["0123456789ab"]}),
    ("release", {"mine": True}),
    ("confirm", {"lease": "0123456789ab"}),
    ("evict", {"lease": "0123456789ab", "grace_s": 1}),
    ("snapshot", {"full": True}),
    ("snapshot", {"full": False}),
    ("gc", {}),
    ("slurm", {"hook": "prolog", "env": {"SLURM_JOB_ID": "1", "SLURM_JOB_GPUS": "0"}}),
]  # fmt: skip


def _paths(value: Any, path: tuple = ()) -> list[tuple]:
    found = [path]
    if isinstance(value, dict):
        for key, inner in value.items():
            found += _paths(inner, (*path, key))
    return found


def _replaced(value: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    copy = dict(value)
    copy[path[0]] = _replaced(value[path[0]], path[1:], new)
    return copy


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A template with one to three of its fields (or the whole of its arguments) replaced."""
    op, args = draw(st.sampled_from(TEMPLATES))
    if "lease_id" in args:  # a fresh id mostly, so that the request gets past it
        args = {**args, "lease_id": draw(st.text("0123456789abcdef", min_size=12, max_size=12))}
    for _ in range(draw(st.integers(0, 3))):
        path = draw(st.sampled_from(_paths(args)))
        args = _replaced(
            args, path, draw((EDGES if path[-1:] == ("edges",) else VALUES) | LEASE_ID)
        )
    body: dict[str, Any] = {"v": 1, "op": op, "args": args}
    if draw(st.integers(0, 19)) == 0:
        body = _replaced(body, (draw(st.sampled_from(["v", "op", "args"])),), draw(VALUES))
    return json.dumps(body).encode() + b"\n"


BOUND_CASES = [(bound, value) for bound in broker_bounds() for value in bound.values]


@st.composite
def near_bound(draw: st.DrawFn) -> bytes:
    """A request just under, at or over one of the broker's bounds (a number moved by up to
    two: the walk below checks the exact values)."""
    bound, value = draw(st.sampled_from(BOUND_CASES))
    if type(value) is int:
        value += draw(st.integers(-2, 2))
    return bound.line(value) + b"\n"


REQUEST_LINES = st.one_of(
    mutated(),
    mutated(),
    mutated(),
    near_bound(),
    st.binary(max_size=200).map(lambda raw: raw.replace(b"\n", b" ") + b"\n"),
    st.builds(lambda op: json.dumps({"v": 1, "op": op}).encode() + b"\n", st.text(max_size=8)),
)


def generated(count: int) -> list[bytes]:
    """``count`` request lines: a fifth drawn by Hypothesis in batches (generation only:
    nothing to shrink, and no example database), the rest bred from those by
    :func:`crossed` (Hypothesis draws about 3 ms a request: 20,000 took a minute of CI)."""
    drawn = drawn_lines(max(1, count // CROSSINGS))
    return (drawn + crossed(drawn, count - len(drawn)))[:count]


def crossed(lines: list[bytes], count: int, seed: int = 40) -> list[bytes]:
    """``count`` requests bred from the JSON ones among ``lines``: one's request with a
    field, or its arguments, replaced by a value of another, and now and then another's
    operation (a seeded :class:`random.Random`, so a CI run sends the same ones)."""
    bodies = []
    for line in lines:
        try:
            body = json.loads(line)
        except (ValueError, RecursionError):  # garbage, or nested past Python's recursion
            continue
        if isinstance(body, dict):
            bodies.append(body)
    if not bodies:
        return []
    chooser = random.Random(seed)
    bred: list[bytes] = []
    while len(bred) < count:
        mother, father = chooser.choice(bodies), chooser.choice(bodies)
        given = father
        for _ in range(chooser.randint(0, 3)):  # a value somewhere inside the father
            if not isinstance(given, dict) or not given:
                break
            given = given[chooser.choice(list(given))]
        inside = [path for path in _paths(mother) if path[:1] == ("args",)]
        if not inside:
            continue
        child = _replaced(mother, chooser.choice(inside), given)
        if chooser.randint(0, 9) == 0 and isinstance(child, dict):
            child = {**child, "op": father.get("op")}
        bred.append(json.dumps(child).encode() + b"\n")
    return bred


def drawn_lines(count: int) -> list[bytes]:
    """``count`` request lines drawn by Hypothesis."""
    found: list[bytes] = []

    @settings(
        max_examples=max(1, count // BATCH),
        phases=[Phase.generate],
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.lists(REQUEST_LINES, min_size=BATCH, max_size=BATCH))
    def collect(batch: list[bytes]) -> None:
        found.extend(batch)

    collect()
    return found[:count]


# ---- every bound, walked once ------------------------------------------------------------------


def _answer(path: Path, line: bytes) -> dict[str, Any]:
    """What the broker answers ``line`` on a connection of its own: the exit code (0: ok, or
    queued), the message, the result, and whether the connection stays open (a hello after
    it is answered). The sender's leases are released after it."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(10)
        connection.connect(str(path))
        connection.sendall(line + b"\n")
        reader = connection.makefile("rb")
        raw = reader.readline()
        if not raw:
            return {"code": "closed without an answer"}
        body = json.loads(raw)
        error = body.get("error") or {}
        seen = {"code": error.get("code", 0), "message": error.get("message", ""),
                "result": body.get("result")}  # fmt: skip
        try:
            connection.sendall(request_text("hello", {}) + b"\n")
            seen["open"] = b'"ok":true' in reader.readline()
        except OSError:
            seen["open"] = False
    release = request_text("release", {"mine": True, "include_running": True})
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(10)
        connection.connect(str(path))
        connection.sendall(release + b"\n")
        connection.makefile("rb").readline()
    return seen


def _connected(path: Path, line: bytes) -> socket.socket:
    """A connection kept open, ``line`` sent on it."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.settimeout(10)
    connection.connect(str(path))
    with contextlib.suppress(BrokenPipeError):  # refused at once: its reason is there to read
        connection.sendall(line + b"\n")
    return connection


def _first_answer(connection: socket.socket) -> dict[str, Any]:
    """The exit code (0: ok, or waiting) and the message of the first answer on
    ``connection``."""
    raw = connection.makefile("rb").readline()
    if not raw:
        return {"code": "closed", "message": ""}
    error = json.loads(raw).get("error") or {}
    return {"code": error.get("code", 0), "message": error.get("message", "")}


def _held_limits(path: Path, gpus: int) -> list[tuple[str, int, Any]]:
    """The bounds a user reaches by holding things open: connections (``broker.
    max_connections``), each answered before the next opens, and waiting jobs
    (``queue.max_waiting``), sent at once behind a lease of every GPU, each answered by its
    first event (a waiter hears it at the broker's next look) or refused; (bound, count,
    answer) for the count just under, at and over each."""
    from gpualloc.config import BY_KEY

    found: list[tuple[str, int, Any]] = []
    held: list[socket.socket] = []
    limit = BY_KEY["broker.max_connections"].default
    try:
        for count in range(1, limit + 2):
            held.append(_connected(path, request_text("hello", {})))
            if count >= limit - 1:
                found.append(("connections per user (broker.max_connections)", count,
                              _first_answer(held[-1])))  # fmt: skip
            else:
                _first_answer(held[-1])
    finally:
        for connection in held:
            connection.close()
    held = []
    limit = BY_KEY["queue.max_waiting"].default
    everything = {"policy": "mapa", "count": gpus}
    try:
        held.append(_connected(path, request_text("alloc", _args(everything))))
        found.append(("every GPU held, the queue's bound next", 1, _first_answer(held[0])))
        one = {"policy": "mapa", "count": 1}
        held += [
            _connected(path, request_text("alloc", _args(one, wait={}))) for _ in range(limit + 1)
        ]
        answers = [_first_answer(c) for c in held[1:]]
        codes = sorted(answers, key=lambda answer: str(answer["code"]))  # 0 (waiting), then 12
    finally:
        for connection in held:
            connection.close()
    for count in (limit - 1, limit, limit + 1):
        found.append(("waiting jobs per user (queue.max_waiting)", count, codes[count - 1]))
    return found


def _args(request: dict[str, Any], **more: Any) -> dict[str, Any]:
    terms = {"source": "alloc", "hold": True}
    return {"lease_id": new_lease_id(), "options": request, "terms": terms, **more}


def _walk(path: Path, bounds: list[Any], gpus: int) -> list[list[Any]]:
    """Every bound's values, sent as this process's user: [bound, value, what was seen]."""
    seen: list[list[Any]] = []
    for bound in bounds:
        for value in bound.values:
            answer = _answer(path, bound.line(value))
            made = answer.pop("result", None)
            if bound.kept is not None and answer["code"] == 0:
                answer["kept"] = bound.kept(value, made)
            seen.append([bound.name, repr(value)[:40], answer])
    for name, value, answer in _held_limits(path, gpus):
        seen.append([name, repr(value), {**answer, "open": True}])
    return seen


def _wanted() -> list[list[Any]]:
    from gpualloc.config import BY_KEY
    from gpualloc.wire.protocol import MAX_REQUEST_BYTES

    wanted = []
    for bound in broker_bounds():
        for value, code in zip(bound.values, bound.codes, strict=True):
            closes = bound.name.startswith("request bytes") and value > MAX_REQUEST_BYTES
            answer: dict[str, Any] = {"code": code, "open": not closes}
            if bound.kept is not None and code == 0:
                answer["kept"] = True
            wanted.append([bound.name, repr(value)[:40], answer])
    for key, name, over in (
        ("broker.max_connections", "connections per user (broker.max_connections)", 18),
        ("queue.max_waiting", "waiting jobs per user (queue.max_waiting)", 12),
    ):
        if key == "queue.max_waiting":
            held = {"code": 0, "open": True}
            wanted.append(["every GPU held, the queue's bound next", "1", held])
        limit = BY_KEY[key].default
        for value, code in ((limit - 1, 0), (limit, 0), (limit + 1, over)):
            wanted.append([name, repr(value), {"code": code, "open": True}])
    return wanted


def test_every_bound_a_request_meets_is_answered_as_documented_below_at_and_above() -> None:
    """Each bound the broker enforces (request size, a command's cut, names, ids, counts of
    GPUs and edges, GPU indices, memory near 2**63, pids, the queue's priority, bypass and
    entries, durations, numbers JSON has not, nesting, connections), walked just under, at
    and just over by a user who is not root: each value gets its own answer (exit code),
    one line, on a connection left open (but the request too large, refused and closed),
    and the broker logs no internal error. A wait's timeout past a float (``10**400``)
    was an internal error that left its waiter queued, a NaN or infinite one a wait that
    never ended, a request nested deeper than Python recurses an internal error."""
    broker = RunningBroker(BOUNDS_TOPOLOGY).start()
    user = ensure_user("gpualloc-t-alice")
    report = broker.directory / "bounds.json"  # a directory every user reaches
    report.touch()
    os.chown(report, user.uid, user.gid)
    try:
        from gpualloc.topologies import load_bundled

        # Read as root: the checkout (its bundled topologies) may be root's alone.
        bounds, gpus = list(broker_bounds()), load_bundled(BOUNDS_TOPOLOGY).gpu_count
        walked = lambda: report.write_text(json.dumps(_walk(broker.socket, bounds, gpus)))  # noqa: E731
        as_user(user.uid, user.gid, walked)
        seen = json.loads(report.read_text())
        messages = [answer.pop("message", "") for _, _, answer in seen]
        said = zip(seen, _wanted(), messages, strict=True)
        wrong = [f"seen {s}, wanted {w[2]}: {m!r}" for s, w, m in said if s != w]
        assert not wrong, "\n".join(wrong)
        assert not [m for m in messages if "\n" in m], "an answer of more than one line"
        log = broker.log_text()
        assert "internal error" not in log and "Traceback" not in log, log[-3000:]
    finally:
        broker.stop()
        shutil.rmtree(broker.directory, ignore_errors=True)


# ---- the users ---------------------------------------------------------------------------------


def _fuzz(path: Path, lines: list[bytes]) -> None:
    """Send every line, each on a connection kept while the broker keeps it."""
    connection: socket.socket | None = None
    reader: Any = None
    for count, line in enumerate(lines):
        if count % 200 == 0:  # give back what the fuzzing got, so the honest user finds GPUs
            line = b'{"v":1,"op":"release","args":{"mine":true}}\n' + line
        try:
            if connection is None:
                connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                connection.settimeout(2)
                connection.connect(str(path))
                reader = connection.makefile("rb")
            connection.sendall(line)
            for _ in range(line.count(b"\n")):
                if not reader.readline():
                    raise ConnectionResetError
        except OSError:  # closed by the broker (a bad version), or a queued alloc: start again
            if connection is not None:
                connection.close()
            connection = None


def _honest(path: Path, seconds: float, report: int) -> None:
    """Alloc and release one GPU again and again for ``seconds``; writes the slowest answer."""
    client = BrokerClient(path, answer_s=10)
    slowest, cycles, started = 0.0, 0, time.monotonic()
    while time.monotonic() - started < seconds:
        began = time.monotonic()
        try:
            made = client.call(
                "alloc",
                {"lease_id": new_lease_id(), "options": {"policy": "mapa", "count": 1},
                 "terms": {"source": "alloc", "hold": True, "name": "honest"}},
            )  # fmt: skip
        except GpuallocError:  # all GPUs held by the fuzzers for now: an answer all the same
            made = None
        slowest = max(slowest, time.monotonic() - began)
        if made is not None:
            began = time.monotonic()
            client.call("release", {"leases": [made["lease"]["id"]]})
            slowest = max(slowest, time.monotonic() - began)
            cycles += 1
        time.sleep(0.01)
    os.write(report, json.dumps({"slowest_s": slowest, "cycles": cycles}).encode())


def test_two_users_fuzzing_the_broker_neither_stall_nor_break_it(tmp_path: Path) -> None:
    lines = generated(REQUESTS)
    assert len(lines) == REQUESTS
    config = tmp_path / "system.toml"  # limits high enough that the fuzz reaches the handlers
    config.write_text(
        "[broker]\nmax_requests_per_s = 1000000\nmax_connects_per_s = 100000\n"
        "placement_budget = 0.05\n"
    )
    config.chmod(0o644)
    broker = RunningBroker("dgx1-v100", system_config=config).start()
    worker = broker.worker()
    report, reported = os.pipe()
    try:
        mallory, trudy = ensure_user("gpualloc-t-alice"), ensure_user("gpualloc-t-bob")
        carol = ensure_user("gpualloc-t-carol")
        half = len(lines) // 2
        started = time.monotonic()
        fuzzers = [
            (start_as_user(u.uid, u.gid, lambda part=part: _fuzz(broker.socket, part)), u.uid)
            for u, part in ((mallory, lines[:half]), (trudy, lines[half:]))
        ]
        honest = start_as_user(carol.uid, carol.gid, lambda: _honest(broker.socket, 8.0, reported))
        os.close(reported)
        for pid, uid in fuzzers:
            wait_for_user(pid, uid)
        took = time.monotonic() - started
        wait_for_user(honest, carol.uid)
        seen = json.loads(os.read(report, 4096))
        assert seen["slowest_s"] <= ANSWER_S, seen
        assert seen["cycles"] > 0, "the honest user never got a GPU"
        assert broker.hello()["protocol"] == 1
        log = broker.log_text()
        assert "internal error" not in log, log[log.find("internal error") :][:3000]
        assert broker.worker() == worker, log[log.find("placement worker") :][:3000]
        status_run = subprocess.run(
            [sys.executable, "-m", "gpualloc", "status", "--json"],
            env={**os.environ, "GPUALLOC_BROKER": str(broker.socket)},
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert status_run.returncode == 0, status_run.stderr
        (written,) = [p for p in broker.state.glob("ledger@*.json") if ".good." not in p.name]
        _, set_aside = read_ledger(written.read_text(), str(written))
        assert not set_aside, set_aside  # the ledger reads back whole: no record unreadable
        print(
            f"{REQUESTS} fuzzed requests ({len(set(lines))} distinct) in {took:.1f} s; "
            f"the honest user's slowest answer {seen['slowest_s'] * 1000:.0f} ms, "
            f"{seen['cycles']} alloc+release cycles"
        )
    finally:
        broker.stop()
        shutil.rmtree(broker.directory, ignore_errors=True)
