"""The shared ledger's defences that need no second user: the lock and its holder, root's journal,
the backfill window, the messages for a full disk and an empty GPUALLOC_STATE_DIR."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from gpualloc.atomic import write_text_atomic
from gpualloc.errors import ConfigError, FileAccessError, LedgerLocked
from gpualloc.host.queue import Attempt, take_turn
from gpualloc.ledger import journal
from gpualloc.ledger.locking import SharedLock
from gpualloc.ledger.schema import Lease, Ledger, QueuedRequest, Waiter
from gpualloc.ledger.statedir import open_state_directory
from gpualloc.ledger.store import LedgerStore
from gpualloc.model.request import Placement, Scores
from tests.child_processes import end, running
from tests.leases import HOST, held_lease


def _lease(*gpus: int, job: str | None = None) -> Lease:
    return held_lease(*gpus, source="slurm" if job else "alloc", slurm_job=job)


def test_a_held_lock_is_reported_with_its_holder_and_nothing_changes(tmp_path: Path) -> None:
    store = LedgerStore(open_state_directory(tmp_path / "state"), host=HOST, lock_timeout_s=0.3)
    with store.transaction() as txn:
        txn.add(_lease(0))
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys, time\n"
         "f = open(sys.argv[1], 'r+'); fcntl.flock(f, fcntl.LOCK_EX); print(flush=True)\n"
         "time.sleep(60)", str(store.directory.lock_file)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "\n"
        started = time.monotonic()
        with pytest.raises(LedgerLocked, match=f"pid {holder.pid}") as caught, store.transaction():
            pytest.fail("the transaction ran without the lock")
        assert 0.3 <= time.monotonic() - started < 2
        assert caught.value.exit_code == 16 and "nothing was changed" in caught.value.message
        seen = store.snapshot()  # status reads without waiting, and says who holds it
        assert [lease.indices for lease in seen.ledger.leases] == [(0,)]
        assert any(f"pid {holder.pid}" in note for note in seen.notes)
    finally:
        end(holder)
    with store.transaction() as txn:  # the kernel dropped it with its holder
        txn.add(_lease(1))


def test_a_lock_won_on_a_file_replaced_meanwhile_does_not_count(tmp_path: Path) -> None:
    """A waiter that finally locks the file its owner removed and replaced must lock the file
    now at the name, or two transactions would run at once."""
    import threading

    path = tmp_path / "x.lock"
    first = SharedLock(path, timeout_s=5)
    first.acquire()
    waiter = SharedLock(path, timeout_s=10)
    got = threading.Event()
    thread = threading.Thread(target=lambda: (waiter.acquire(), got.set()))
    thread.start()  # off the main thread: it polls the first file's lock
    time.sleep(0.1)
    path.unlink()  # its owner removes it; a third process locks the new file at the name
    third = SharedLock(path, timeout_s=1)
    third.acquire()
    first.release()  # the waiter can now lock the old, nameless file ...
    assert not got.wait(0.5), "it took a lock on a file nobody can name any more"
    third.release()  # ... but only this one counts
    assert got.wait(5)
    thread.join()
    waiter.release()


def test_roots_journal_applies_once_in_order_and_a_future_mark_is_ignored() -> None:
    ledger = Ledger(host=HOST, leases=[_lease(1)])
    add = journal.JournalEntry(seq=10, op="add", slurm_job="7", lease=_lease(0, 1, job="7"))
    release = journal.JournalEntry(seq=20, op="release", slurm_job="7")
    notes = journal.apply_journal(ledger, journal.Journal(host=HOST, entries=[add]))
    # Slurm is authoritative: the job's lease has GPU 1 too, and the other lease is marked
    assert [lease.indices for lease in ledger.leases] == [(1,), (0, 1)]
    assert ledger.leases[0].slurm_conflict == "7"
    assert ledger.root_journal_seq == 10 and "also held outside Slurm" in notes[0]
    assert journal.apply_journal(ledger, journal.Journal(host=HOST, entries=[add])) == []
    journal.apply_journal(ledger, journal.Journal(host=HOST, entries=[release, add]))
    assert [lease.indices for lease in ledger.leases] == [(1,)]  # seq order, not file order
    ledger.root_journal_seq = time.time_ns() * 2  # forged: would hide root's entries forever
    notes = journal.apply_journal(ledger, journal.Journal(host=HOST, entries=[add]))
    assert "future" in notes[0] and [lease.indices for lease in ledger.leases] == [(1,), (0, 1)]


@pytest.mark.skipif(os.geteuid() != 0, reason="root's journal is root's: the hooks run as root")
def test_a_journal_not_written_by_root_is_ignored(tmp_path: Path) -> None:
    directory = open_state_directory(tmp_path / "state")
    entry = journal.JournalEntry(seq=1, op="add", slurm_job="9", lease=_lease(3, job="9"))
    written = journal.append_entry(directory.journal_file, directory.journal_lock, HOST, entry)
    assert written.seq > 1  # numbered by the clock
    found, notes = journal.read_journal(directory.journal_file, HOST)
    assert found is not None and notes == []
    directory.journal_file.chmod(0o666)  # writable by everyone: no longer root's word
    found, notes = journal.read_journal(directory.journal_file, HOST)
    assert found is None and "not root's" in notes[0]


def test_gpuallocs_own_atomic_write_replaces_a_planted_link_and_never_follows_it(
    tmp_path: Path,
) -> None:
    """Root's hooks write the journal over whatever a user planted at its name: a link must
    be replaced, not followed (following it would write where the planter chose)."""
    target = tmp_path / "victim"
    target.write_text("untouched\n")
    planted = tmp_path / "journal.json"
    planted.symlink_to(target)
    write_text_atomic(planted, "journal\n")
    assert not planted.is_symlink() and planted.read_text() == "journal\n"
    assert target.read_text() == "untouched\n"


def _waiter(seq: int, gpus: int, *, waited_s: float, window_s: float | None) -> Waiter:
    return Waiter(
        id=f"{seq:012x}",
        seq=seq,
        uid=1000,
        user=f"user{seq}",
        pid=1,
        request=QueuedRequest(gpus=gpus, sensitive=False),
        backfill_window_s=window_s,
        created=datetime.now(timezone.utc) - timedelta(seconds=waited_s),
    )


@pytest.mark.parametrize(("waited_s", "passes"), [(10, True), (7200, False)])
def test_no_backfill_past_a_job_older_than_the_hosts_window(waited_s: float, passes: bool) -> None:
    big = _waiter(0, 8, waited_s=waited_s, window_s=3600)
    small = _waiter(1, 1, waited_s=0, window_s=3600)
    scores = Scores(None, None, 0.0, None, 1.0)
    placement = Placement(policy="mapa", gpus=(3,), scores=scores, objective="test")

    def attempt(waiter: Waiter) -> Attempt:
        return Attempt(placement if waiter.request.gpus == 1 else None, "busy")

    turn = take_turn([big, small], small.id, attempt)
    assert turn.go is passes
    assert passes or "backfill window" in turn.reason


def test_a_full_disk_says_so_and_that_the_ledger_is_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gpualloc.ledger.store as store_module

    store = LedgerStore(open_state_directory(tmp_path / "state"), host=HOST)
    with store.transaction() as txn:
        txn.add(_lease(0))

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(store_module, "write_text_atomic", full)
    monkeypatch.setattr(store_module, "rewrite_own_copy", full)  # the good copy, in place
    with (
        pytest.raises(FileAccessError, match="file system is full") as caught,
        store.transaction() as txn,
    ):
        txn.add(_lease(1))
    assert "the ledger is unchanged" in caught.value.message
    assert "0666" not in (caught.value.hint or "") and "free space" in (caught.value.hint or "")
    monkeypatch.undo()
    assert [lease.indices for lease in store.read().ledger.leases] == [(0,)]


def test_an_empty_state_dir_variable_is_refused_not_silently_the_default(
    monkeypatch: pytest.MonkeyPatch, cli
) -> None:
    from gpualloc.config import Config

    monkeypatch.setenv("GPUALLOC_STATE_DIR", "")
    with pytest.raises(ConfigError, match="GPUALLOC_STATE_DIR is set but empty"):
        Config.load().value("state_dir")
    result = cli("--topology", "dgx1-v100", "status")
    assert result.exit_code == 15 and "unset GPUALLOC_STATE_DIR" in result.stderr


def test_process_facts_from_proc_agree_with_psutil() -> None:
    """Liveness reads /proc itself (so that no command imports psutil for it); what it reads
    must be what psutil reports, since ledgers written before hold psutil's start times."""
    import psutil

    from gpualloc.ledger.liveness import (
        command_line,
        process_alive,
        process_start_time,
        started_by,
    )

    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)  # fmt: skip
    try:
        started = psutil.Process(child.pid).create_time()
        assert process_start_time(child.pid) == pytest.approx(started, abs=0.011)
        assert process_alive(child.pid, started)
        assert not process_alive(child.pid, started - 1)  # the pid, but another process
        assert started_by(child.pid, os.getuid(), since=started)
        assert not started_by(child.pid, os.getuid() + 1, since=started)
        assert not started_by(child.pid, os.getuid(), since=started + 5)
        assert command_line(child.pid)[1:] == ("-c", "import sys; sys.stdin.read()")
        assert child.stdin is not None
        child.stdin.close()
        deadline = time.monotonic() + 30
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert not process_alive(child.pid, None)  # ended, not yet waited for
    finally:
        end(child)  # a failed assertion above left it reading its input for ever
    assert not process_alive(child.pid, None) and process_start_time(child.pid) is None
    assert process_start_time(0) is None and command_line(-1) == ()


BLANKS_ITS_ARGUMENTS = """
import sys, time
fields = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
start, end = int(fields[45]), int(fields[46])  # arg_start and arg_end, proc(5)
with open("/proc/self/mem", "r+b", buffering=0) as memory:
    memory.seek(start)
    kept = memory.read(end - start)
    memory.seek(start)
    memory.write(bytes(end - start))
    print("blank", flush=True)
    time.sleep(float(sys.argv[1]))
    memory.seek(start)
    memory.write(kept)
sys.stdin.read()
"""


def test_arguments_read_empty_for_a_moment_are_read_again() -> None:
    """Just after an exec the kernel shows an empty ``/proc/PID/cmdline`` until the new
    program's arguments are in place, and ``subprocess.Popen`` has returned by then: read once,
    they were lost (the test above failed on it under load, and ``alloc --pid`` of a process
    just started would record no command). A process that blanks its own arguments for a
    moment is that window, made to order."""
    from gpualloc.ledger.liveness import command_line

    argv = [sys.executable, "-c", BLANKS_ITS_ARGUMENTS, "0.02"]
    with running(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as child:
        if child.stdout.readline() != "blank\n":
            pytest.skip("this kernel does not let a process write its own memory")
        assert command_line(child.pid) == tuple(argv)


def test_a_zombie_has_no_arguments_and_is_not_waited_for() -> None:
    """A zombie's (and a kernel thread's) arguments are empty for good: no second look."""
    from gpualloc.ledger.liveness import EMPTY_ARGUMENTS_S, command_line

    with running([sys.executable, "-c", "pass"]) as child:
        deadline = time.monotonic() + 30
        while Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        started = time.monotonic()
        assert command_line(child.pid) == ()
        assert time.monotonic() - started < EMPTY_ARGUMENTS_S


@pytest.mark.parametrize("alarm", ["free", "blocked", "handled"])
def test_waiting_for_a_held_lock_ends_at_the_timeout_whatever_sigalrm_is(
    tmp_path: Path, alarm: str
) -> None:
    """The wait sleeps in flock under an interval timer only where SIGALRM can interrupt it;
    with SIGALRM blocked by a launcher, or used by the program, it polls: never a hang."""
    lock = tmp_path / "x.lock"
    lock.touch()
    waiter = f"""
import signal, sys
from pathlib import Path
from gpualloc.errors import LedgerLocked
from gpualloc.ledger.locking import SharedLock
if {alarm!r} == "blocked":
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])
elif {alarm!r} == "handled":
    signal.signal(signal.SIGALRM, lambda *a: None)
try:
    SharedLock(Path({str(lock)!r}), timeout_s=0.5).acquire()
except LedgerLocked:
    sys.exit(16)
"""
    holder = subprocess.Popen(["flock", str(lock), "sleep", "60"], start_new_session=True)
    try:
        from gpualloc.ledger.liveness import lock_held

        deadline = time.monotonic() + 30
        while not lock_held(lock):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        started = time.monotonic()
        result = subprocess.run([sys.executable, "-c", waiter], timeout=30, check=False)
        assert result.returncode == 16 and time.monotonic() - started < 10
    finally:
        end(holder, group=True)
