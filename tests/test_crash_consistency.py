"""The ledgers survive real kills: real ``gpualloc`` processes and a real
broker are SIGKILLed at random moments, inside their in-place writes included, and what every
later command sees is checked against what the killed processes' clients were told.

Two ways to die, both a real SIGKILL of a real process:

- *inside a write*: the process runs gpualloc through :data:`WRAPPER`, which counts the
  ledger's writes (:func:`gpualloc.ledger.in_place._write_over`, ``write_text_atomic``) and
  kills itself at a chosen one: after a chosen fraction of its bytes, after all of them but
  before the file is cut to length, before it, or just after it (between the good copy and
  ``ledger.json``);
- *at a random moment*: another process sends SIGKILL after a random delay, while the writes
  are slowed down (a few bytes at a time) so that a good share of the kills land inside one.

The invariants, after each kill: every later command works (exit 0, or "busy" for an alloc
when the GPUs are taken; never an internal error or a ledger error); a lease whose alloc was
answered is in the ledger, with its GPUs, until it is released; a lease whose release was
answered is never seen again; a lease whose alloc or release was killed is found in either
state, and stays in the state first seen; no lease appears that nobody asked for; no GPU is
held by two leases. Each run draws its seed (``CRASH_SEED=<n>`` repeats one); every failure
names it, the step and the kill (``CRASH_KEEP=1`` keeps the broker's directory to look at).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.broker_harness import ROOT, RunningBroker
from tests.child_processes import finish
from tests.cli_harness import run_in_process
from tests.unix_users import UnixUser, UserCommandLine, ensure_user, shared_directory

TOPOLOGY = "dgx1-v100"
TIMEOUT_S = 60

WRAPPER = r"""
import os, signal, sys, time

plan = sys.argv.pop(1).split(":")
from gpualloc import atomic
from gpualloc.ledger import in_place, owned_store, store

real_over, real_atomic, events = in_place._write_over, atomic.write_text_atomic, [0]


def die():
    os.kill(os.getpid(), signal.SIGKILL)


if plan[0] == "slow":  # a few bytes at a time: a kill from outside lands inside a write

    def over(descriptor, data):
        for start in range(0, len(data), 48):
            os.pwrite(descriptor, data[start : start + 48], start)
            time.sleep(0.0002)
        os.ftruncate(descriptor, len(data))

    in_place._write_over = over
elif plan[0] == "kill":  # kill:<which write>:<how>:<fraction of its bytes>
    at, how, fraction = int(plan[1]), plan[2], float(plan[3])

    def over(descriptor, data):
        events[0] += 1
        if events[0] == at:
            if how == "cut":
                os.pwrite(descriptor, data[: max(1, int(len(data) * fraction))], 0)
                die()
            elif how == "untruncated":
                os.pwrite(descriptor, data, 0)
                die()
            elif how == "before":
                die()
        real_over(descriptor, data)
        if events[0] == at:
            die()

    def replace(path, text, **options):
        events[0] += 1
        if events[0] == at and how != "after":  # stopped before its rename
            temporary = path.with_name(f".{path.name}.{os.urandom(6).hex()}.tmp")
            temporary.write_bytes(text.encode()[: int(len(text) * fraction)])
            die()
        real_atomic(path, text, **options)
        if events[0] == at:
            die()

    in_place._write_over = over
    store.write_text_atomic = owned_store.write_text_atomic = replace

from gpualloc.cli.main import run

sys.argv[0] = "gpualloc"
run()
"""
"""Runs ``gpualloc ARGS`` as ``python -c WRAPPER PLAN ARGS``; PLAN is ``none``, ``slow`` or
``kill:<n>:<how>:<fraction>`` (the module docstring)."""

HOWS = ("cut", "cut", "cut", "untruncated", "before", "after")
"""How a process killed inside a write dies there (a torn file, most often)."""


def _seed() -> int:
    chosen = os.environ.get("CRASH_SEED")
    return int(chosen) if chosen else random.SystemRandom().randrange(2**32)


def _kill_plan(rng: random.Random, writes: int) -> str:
    return f"kill:{rng.randint(1, writes)}:{rng.choice(HOWS)}:{rng.uniform(0.01, 0.99):.3f}"


@dataclass
class Expected:
    """What the clients were told, and so what the ledger must hold (module docstring)."""

    present: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Leases that must be in the ledger, with their GPUs."""
    gone: set[str] = field(default_factory=set)
    """Leases that must never be seen (again): released, refused, or seen gone."""
    unknown_allocs: set[str] = field(default_factory=set)
    """Names (embedded) or ids (broker) of allocs whose process or answer was killed."""
    unknown_releases: set[str] = field(default_factory=set)
    recoveries: int = 0

    def check(self, leases: list[dict], key: str, where: str) -> None:
        """Hold ``leases`` (as ``status --json`` or the broker's snapshot lists them) to what
        was told; a killed command's outcome is settled by the first look after it."""
        found = {lease["id"]: lease for lease in leases}
        gpus = {lid: tuple(gpu["index"] for gpu in lease["gpus"]) for lid, lease in found.items()}
        twice = [
            gpu for gpu, count in Counter(g for v in gpus.values() for g in v).items() if count > 1
        ]
        assert not twice, f"{where}: GPUs {twice} held by two leases: {gpus}"
        for lid, held in self.present.items():
            if lid in self.unknown_releases:
                continue
            assert lid in found, f"{where}: lease {lid} (GPUs {held}) was lost: {sorted(gpus)}"
            assert gpus[lid] == held, f"{where}: lease {lid} holds {gpus[lid]}, not {held}"
        back = sorted(set(found) & self.gone)
        assert not back, f"{where}: leases {back} were released or refused, and are back"
        for lid in sorted(set(found) - set(self.present)):
            tag = found[lid]["name"] if key == "name" else lid
            assert tag in self.unknown_allocs, (
                f"{where}: lease {lid} ({tag}) was never asked for, or its killed alloc was "
                f"seen to have failed before: {found[lid]}"
            )
            self.unknown_allocs.discard(tag)  # one alloc makes one lease at most
            self.present[lid] = gpus[lid]
        for lid in self.unknown_releases:
            if lid not in found:
                self.present.pop(lid, None)
                self.gone.add(lid)
        if key != "name":  # an id never used again: a killed alloc not found is gone
            self.gone |= self.unknown_allocs
        self.unknown_allocs.clear()
        self.unknown_releases.clear()


# ---- the embedded file ledger --------------------------------------------------------------


def _cli(plan: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WRAPPER, plan, "--topology", TOPOLOGY, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd="/",
    )


@dataclass
class Step:
    """One command of a run: what it was, how it was to die, and how it ended."""

    what: str
    plan: str
    process: subprocess.Popen[str]
    lease: str = ""
    kill_after_s: float | None = None
    out: str = ""
    err: str = ""

    def describe(self) -> str:
        killed = f", SIGKILL after {self.kill_after_s:.3f} s" if self.kill_after_s else ""
        return f"{self.what} (plan {self.plan}{killed}): rc {self.process.returncode}, {self.err!r}"


def _status(where: str, expected: Expected) -> list[dict]:
    """The ledger as the next command sees it (``status --json``, in this process)."""
    result = run_in_process(["--topology", TOPOLOGY, "status", "--json"])
    assert result.exit_code == 0, f"{where}: status failed: {result.stderr}"
    shown = json.loads(result.stdout)
    expected.recoveries += sum("recovered generation" in note for note in shown["notes"])
    return shown["leases"]


Launch = Callable[..., "subprocess.Popen[str]"]
"""Runs ``gpualloc`` with a plan and arguments, as :func:`_cli` does (as some user)."""


def _start(
    rng: random.Random,
    expected: Expected,
    plan: str,
    taken: set[str],
    tag: str,
    launcher: Callable[[str | None], tuple[str, Launch]] = lambda lease: ("root", _cli),
) -> Step:
    """An alloc (named ``tag``) or a release of a lease the ledger holds (not in ``taken``),
    run by whom ``launcher`` says (given the lease released, or None for an alloc)."""
    free = [lid for lid in expected.present if lid not in taken]
    if free and (len(expected.present) >= 4 or rng.random() < 0.35):
        lease = rng.choice(free)
        taken.add(lease)
        who, launch = launcher(lease)
        return Step(f"{who}: release {lease}", plan, launch(plan, "release", lease), lease=lease)
    n = str(rng.choice((1, 1, 2)))
    who, launch = launcher(None)
    process = launch(plan, "alloc", "--hold", "-n", n, "--name", tag, "--format", "json")
    return Step(f"{who}: alloc -n {n} --name {tag}", plan, process, lease=tag)


def _settle(step: Step, expected: Expected, where: str) -> None:
    """Wait for ``step``'s process; hold what it says to what it may say; note what it did."""
    step.out, step.err = finish(step.process, timeout_s=TIMEOUT_S)
    code = step.process.returncode
    if code == -signal.SIGKILL:
        if ": alloc " in step.what:
            expected.unknown_allocs.add(step.lease)
        else:
            expected.unknown_releases.add(step.lease)
        return
    about = f"{where}: {step.describe()}"
    assert "Traceback" not in step.err and "internal error" not in step.err, about
    if ": release " in step.what:
        assert code == 0, about
        expected.present.pop(step.lease)
        expected.gone.add(step.lease)
    elif code == 0:
        lease = json.loads(step.out)["lease"]
        expected.present[lease["id"]] = tuple(gpu["index"] for gpu in lease["gpus"])
    else:
        assert code in (9, 10), about  # the GPUs are taken: said, not a failure of the ledger


def _reproduce(seed: int) -> str:
    return f"seed {seed} (CRASH_SEED={seed} pytest {Path(__file__).name} repeats it)"


@pytest.mark.slow
def test_cli_commands_killed_inside_their_writes_lose_nothing() -> None:
    """One command at a time, most of them killed at a chosen point of a chosen write: the
    good copy, ``ledger.json``, the good copy's replacement after a recovery."""
    seed = _seed()
    rng, expected, history = random.Random(seed), Expected(), list[str]()
    for step_number in range(40):
        where = f"{_reproduce(seed)}, step {step_number}"
        plan = _kill_plan(rng, 2) if rng.random() < 0.7 else "none"
        step = _start(rng, expected, plan, set(), f"s{step_number}")
        _settle(step, expected, where)
        if plan == "none":
            assert step.process.returncode in (0, 9, 10), f"{where}: {step.describe()}"
        history.append(f"step {step_number}: {step.describe()}")
        expected.check(_status(where, expected), "name", f"{where}; the last steps: {history[-6:]}")
    assert expected.recoveries, f"{_reproduce(seed)}: no kill left a torn ledger to recover"


def _user_launch(command_line: UserCommandLine, user: UnixUser, shared: Path) -> Launch:
    """:func:`_cli` as ``user``, on the shared state directory ``shared``."""
    environment = command_line._environment(user, {"GPUALLOC_STATE_DIR": str(shared)})

    def launch(plan: str, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [command_line.python, "-c", WRAPPER, plan, "--topology", TOPOLOGY, *args],
            env=environment, user=user.uid, group=user.gid, extra_groups=[],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/",
        )  # fmt: skip

    return launch


@pytest.fixture
def shared(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A state directory as an administrator makes it (mode 1777), this test's."""
    import shutil

    path = shared_directory("gpualloc-crash-")
    monkeypatch.setenv("GPUALLOC_STATE_DIR", str(path))
    yield path
    if not os.environ.get("CRASH_KEEP"):
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow
def test_a_torn_ledger_names_its_copy_until_it_is_finished(shared: Path) -> None:
    """Found by the test below: a torn ledger names the good copy written before it. A
    transaction that recovered from it replaced its own copy, then the ledger; killed between
    the two, its owner left the torn ledger naming a copy that no longer held it, and the next
    reader took the newest copy of any user: root's, of an alloc that was killed and had been
    seen not to count. Its lease came back, holding a GPU."""
    alice = ensure_user("gpualloc-t-alice")
    as_alice = _user_launch(UserCommandLine(alice), alice, shared)

    def run(launch: Launch, plan: str, name: str) -> int:
        args = ("alloc", "--hold", "-n", "1", "--name", name, "--format", "json")
        process = launch(plan, *args)
        finish(process, timeout_s=TIMEOUT_S)
        return process.returncode

    def names() -> set[str]:
        return {lease["name"] for lease in _status("the test", Expected())}

    assert run(_cli, "none", "granted") == 0
    assert run(as_alice, "kill:2:cut:0.5", "alice's, torn") == -signal.SIGKILL
    assert run(_cli, "kill:2:before:0", "root's, killed") == -signal.SIGKILL
    seen = names()
    assert "root's, killed" not in seen and "granted" in seen
    assert run(as_alice, "kill:2:before:0", "alice's, killed") == -signal.SIGKILL
    assert names() - {"alice's, killed"} == seen


@pytest.mark.slow
def test_users_killed_inside_their_writes_lose_nothing(shared: Path) -> None:
    """Two users and root share a state directory (mode 1777): each writes a good copy of
    their own, recovers from another's (the one a torn ledger's first bytes name), and a
    release is its lease's owner's or root's."""
    users = [ensure_user(f"gpualloc-t-{name}") for name in ("alice", "bob")]
    command_line = UserCommandLine(users[0])
    launches = {user.name: _user_launch(command_line, user, shared) for user in users}
    seed = _seed()
    rng, expected, owners = random.Random(seed), Expected(), dict[str, int]()
    history: list[str] = []
    turn = iter(range(10**6))

    def launcher(lease: str | None) -> tuple[str, Launch]:
        if lease is None:  # each in turn: every one writes
            user = [*users, None][next(turn) % 3]
        else:
            owner = [user for user in users if owners.get(lease) == user.uid]
            user = owner[0] if owner and rng.random() < 0.7 else None
        return ("root", _cli) if user is None else (user.name, launches[user.name])

    for step_number in range(30):
        where = f"{_reproduce(seed)}, step {step_number}"
        plan = _kill_plan(rng, 2) if rng.random() < 0.7 else "none"
        step = _start(rng, expected, plan, set(), f"u{step_number}", launcher)
        _settle(step, expected, where)
        leases = _status(where, expected)
        history.append(f"step {step_number}: {step.describe()}")
        expected.check(leases, "name", f"{where}; the last steps: {history[-6:]}")
        owners = {lease["id"]: lease["uid"] for lease in leases}
    assert expected.recoveries, f"{_reproduce(seed)}: no kill left a torn ledger"
    writers = {copy.stat().st_uid for copy in shared.glob("*.good.json")}
    assert len(writers) == 3, f"{_reproduce(seed)}: good copies of uids {writers} alone"


@pytest.mark.slow
def test_concurrent_cli_commands_killed_at_random_moments_lose_nothing() -> None:
    """Three commands at a time (waiting for each other's lock), their writes slowed down,
    some of them killed after a random delay; beside them a ``status`` that reads without the
    lock, and must neither fail nor show a GPU twice."""
    seed = _seed()
    rng, expected = random.Random(seed), Expected()
    for round_number in range(18):
        where = f"{_reproduce(seed)}, round {round_number}"
        taken: set[str] = set()
        steps = [
            _start(rng, expected, "slow", taken, f"r{round_number}.{index}") for index in range(3)
        ]
        stable = set(expected.present) - taken  # no command of the round touches them
        reader = _cli("none", "status", "--json")
        began = time.monotonic()
        kills = sorted((rng.uniform(0.05, 0.6), index) for index in range(3) if rng.random() < 0.6)
        for delay, index in kills:
            steps[index].kill_after_s = delay
            time.sleep(max(0.0, began + delay - time.monotonic()))
            if steps[index].process.poll() is None:
                steps[index].process.send_signal(signal.SIGKILL)
        for step in steps:
            _settle(step, expected, where)
        shown, problems = finish(reader, timeout_s=TIMEOUT_S)
        assert reader.returncode == 0, f"{where}: an unlocked status failed: {problems}"
        seen = json.loads(shown)["leases"]
        twice = Counter(g["index"] for lease in seen for g in lease["gpus"])
        assert max(twice.values(), default=0) <= 1, f"{where}: status showed a GPU twice"
        missed = stable - {lease["id"] for lease in seen}
        assert not missed, f"{where}: status did not show leases {missed}, untouched all along"
        described = "; ".join(step.describe() for step in steps)
        expected.check(_status(where, expected), "name", f"{where} after {described}")


# ---- the broker ----------------------------------------------------------------------------


class CrashingBroker(RunningBroker):
    """A real ``gpualloc serve`` run through :data:`WRAPPER` with :attr:`plan`."""

    plan = "none"

    def argv(self) -> list[str]:
        serve = super().argv()
        return [sys.executable, "-c", WRAPPER, self.plan, *serve[3:]]

    def restart(self, plan: str) -> bool:
        """Start again with ``plan``; False when it died while starting (a write of its
        recovery killed), and it was started again without one."""
        self.plan = plan
        try:
            self.start()
            return True
        except AssertionError:
            assert self.process is not None and self.process.returncode == -signal.SIGKILL
            self.plan = "none"
            self.start()
            return False


@pytest.fixture
def crashing_broker() -> Iterator[CrashingBroker]:
    import shutil

    if os.geteuid() != 0:
        pytest.skip("the broker's tests run it as root (CI runs as root)")
    broker = CrashingBroker(TOPOLOGY)
    try:
        yield broker
    finally:
        broker.stop()
        if not os.environ.get("CRASH_KEEP"):
            shutil.rmtree(broker.directory, ignore_errors=True)


def _hold(lease_id: str, gpus: int) -> dict:
    return {
        "lease_id": lease_id,
        "options": {"policy": "mapa", "count": gpus, "sensitive": False},
        "terms": {"source": "alloc", "hold": True},
    }


def _client(broker: RunningBroker, rng: random.Random, mine: list[str], told: list) -> None:
    """Alloc and release until the broker is gone; what each request was told, in ``told``:
    ("granted", id, gpus), ("refused", id), ("released", id), ("alloc?", id), ("release?", id),
    or ("error", what, answer) for an answer no request may get."""
    try:
        while True:
            if mine and (len(mine) >= 2 or rng.random() < 0.4):
                lease = mine.pop(rng.randrange(len(mine)))
                try:
                    body = broker.raw_call("release", {"leases": [lease]})
                except (OSError, ValueError):
                    told.append(("release?", lease))
                    return
                result = body.get("result") or {}
                if body.get("ok") and [x["id"] for x in result["released"]] == [lease]:
                    told.append(("released", lease))
                else:
                    told.append(("error", f"release {lease}", body))
            else:
                lease = f"{rng.getrandbits(48):012x}"
                try:
                    body = broker.raw_call("alloc", _hold(lease, rng.choice((1, 1, 2))))
                except (OSError, ValueError):
                    told.append(("alloc?", lease))
                    return
                if body.get("ok"):
                    gpus = tuple(gpu["index"] for gpu in body["result"]["lease"]["gpus"])
                    told.append(("granted", lease, gpus))
                    mine.append(lease)
                elif body["error"]["code"] in (9, 10):
                    told.append(("refused", lease))
                else:
                    told.append(("error", f"alloc {lease}", body))
    except BaseException as exc:  # said to the test, never lost in a thread
        told.append(("error", "the client failed", repr(exc)))


@pytest.mark.slow
@pytest.mark.parametrize("how", ["before", "cut", "after"])
def test_a_broker_killed_while_it_recovers_its_torn_ledger_loses_nothing(
    crashing_broker: CrashingBroker, how: str
) -> None:
    """Found by the test below: a broker started on a ledger it tore moved the file aside,
    then put its good copy in its place; killed in between, it left no ``ledger.json``, and
    the next broker started empty, every granted lease lost. The torn file must stay where
    it is until the good copy replaces it."""
    broker = crashing_broker
    broker.restart("none")
    granted = {broker.call("alloc", _hold(f"{n:012x}", 1))["lease"]["id"] for n in range(3)}
    broker.plan = "kill:2:cut:0.5"  # the next batch's ledger.json, torn halfway
    broker.kill9()
    broker.start()
    with pytest.raises((OSError, ValueError)):  # no answer: killed in its write
        broker.call("alloc", _hold(f"{4:012x}", 1))
    broker.process.wait(timeout=TIMEOUT_S)
    assert broker.process.returncode == -signal.SIGKILL
    assert not broker.restart(f"kill:1:{how}:0.5"), "not killed in its recovery"
    leases = {lease["id"] for lease in broker.call("snapshot")["ledger"]["leases"]}
    assert granted <= leases <= granted | {f"{4:012x}"}, broker.log_text()[-2000:]
    kept = list(broker.state.glob("ledger*.damaged-*"))  # the torn file, once per recovery
    assert len(kept) == (1 if how == "after" else 2), kept


@pytest.mark.slow
def test_a_broker_killed_during_its_group_commits_loses_nothing(
    crashing_broker: CrashingBroker,
) -> None:
    """Four clients flood the broker; it is killed inside a chosen write of its group commit
    (its good copy, ``ledger.json``, its recovery at start) or, its writes slowed down, after a
    random delay; restarted, it must hold what it answered."""
    seed = _seed()
    rng, expected = random.Random(seed), Expected()
    broker, clients = crashing_broker, 4
    broker.restart("none")
    answered = 0
    for round_number in range(24):
        where = f"{_reproduce(seed)}, round {round_number}, plan {broker.plan}"
        leases = broker.call("snapshot")["ledger"]["leases"]
        try:
            expected.check(leases, "id", f"{where}: after the restart")
        except AssertionError as failed:
            log = broker.log_text()[-2500:]
            raise AssertionError(f"{failed}\nthe broker's log: {log}") from None
        held = sorted(expected.present)
        told: list[list] = [[] for _ in range(clients)]
        threads = [
            threading.Thread(
                target=_client,
                args=(
                    broker,
                    random.Random(f"{seed}.{round_number}.{c}"),
                    held[c::clients],
                    told[c],
                ),
            )
            for c in range(clients)
        ]
        for thread in threads:
            thread.start()
        assert broker.process is not None
        if broker.plan.startswith("kill"):
            try:
                broker.process.wait(timeout=5)  # its own kill, at the write it was told
            except subprocess.TimeoutExpired:
                broker.kill9()
        else:
            time.sleep(rng.uniform(0.01, 0.4))
            broker.kill9()
        for thread in threads:
            thread.join(timeout=TIMEOUT_S)
            assert not thread.is_alive(), f"{where}: a client hangs"
        for entry in (entry for mine in told for entry in mine):
            assert entry[0] != "error", f"{where}: {entry}"
            if entry[0] == "granted":
                expected.present[entry[1]] = entry[2]
            elif entry[0] == "released":
                expected.present.pop(entry[1])
                expected.gone.add(entry[1])
            elif entry[0] == "refused":
                expected.gone.add(entry[1])
            elif entry[0] == "alloc?":
                expected.unknown_allocs.add(entry[1])
            else:
                expected.unknown_releases.add(entry[1])
        answered += sum(entry[0] in ("granted", "released") for mine in told for entry in mine)
        draw = rng.random()
        plan = _kill_plan(rng, 12) if draw < 0.6 else "slow" if draw < 0.85 else "none"
        broker.restart(plan)
    broker.kill9()
    broker.restart("none")
    expected.check(broker.call("snapshot")["ledger"]["leases"], "id", f"{_reproduce(seed)}: end")
    log = broker.log_text()
    assert "Traceback" not in log, log[-3000:]
    assert "recovered generation" in log, f"{_reproduce(seed)}: no kill left a torn ledger"
    assert answered > 30, f"{_reproduce(seed)}: {answered} grants and releases in all"
