"""``gc`` removes the temporary files that writers killed inside an atomic write leave in the state
directory (tests/test_crash_consistency.py leaves them: nothing else reads them or cleans them up).

The litter is made the way it happens: a real process killed with SIGKILL inside
:func:`gpualloc.atomic.write_text_atomic`, after it created its temporary file and before the
rename. A writer renames its own within milliseconds, so only files a minute old go; a fresh
one may be a write in progress and stays.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from gpualloc.host.local import ORPHAN_LOCK_AGE_S
from tests.cli_harness import TIMEOUT_S, gpualloc, status

# Creates the temporary file, says so, and hangs in fsync until it is killed.
KILLED_WRITER = """\
import os, sys, time
from pathlib import Path
from gpualloc import atomic

def hang(fd):
    print("writing", flush=True)
    time.sleep(600)

atomic.os.fsync = hang
atomic.write_text_atomic(Path(sys.argv[1]), "{}")
"""


def _killed_write(target: Path) -> Path:
    """The temporary file a writer of ``target`` killed mid-write leaves."""
    before = set(target.parent.glob(".*.tmp"))
    argv = [sys.executable, "-c", KILLED_WRITER, str(target)]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as writer:
        try:
            assert writer.stdout is not None and writer.stdout.readline() == "writing\n"
        finally:
            writer.send_signal(signal.SIGKILL)
            writer.wait(timeout=TIMEOUT_S)
    (litter,) = set(target.parent.glob(".*.tmp")) - before
    return litter


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_gc_removes_what_killed_writes_left_and_keeps_a_fresh_one() -> None:
    assert gpualloc("alloc", "--hold", "--gpus", "0,1").returncode == 0
    state = Path(os.environ["GPUALLOC_STATE_DIR"])
    ledger = next(state.glob("*.json"))
    good = ledger.read_text()
    old = _killed_write(ledger)
    fresh = _killed_write(ledger)
    _age(old, ORPHAN_LOCK_AGE_S + 5)

    result = gpualloc("gc", "--json")

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["removed_temporary_files"] == [old.name]
    assert not old.exists()
    assert fresh.exists()  # it may be a write in progress
    assert ledger.read_text() == good  # the killed writes never reached the ledger
    (lease,) = status()["leases"]
    assert [gpu["index"] for gpu in lease["gpus"]] == [0, 1]


def test_gc_says_what_it_removed() -> None:
    assert gpualloc("alloc", "--hold", "--gpus", "0").returncode == 0
    ledger = next(Path(os.environ["GPUALLOC_STATE_DIR"]).glob("*.json"))
    for _ in range(2):
        _age(_killed_write(ledger), ORPHAN_LOCK_AGE_S + 5)

    result = gpualloc("gc")

    assert result.returncode == 0, result.stderr
    assert "removed 2 temporary files left by killed writes" in result.stdout
    assert not list(ledger.parent.glob(".*.tmp"))


def test_gc_leaves_other_scopes_and_roots_journal_alone() -> None:
    """Only this scope's files are written under the ledger lock gc holds: a write of another
    topology's ledger, or of root's journal (a lock of its own), may be alive however old its
    temporary file looks (a writer stopped by SIGSTOP or a frozen cgroup)."""
    assert gpualloc("alloc", "--hold", "--gpus", "0").returncode == 0
    assert gpualloc("alloc", "--hold", "--gpus", "0", topology="dgx2").returncode == 0
    state = Path(os.environ["GPUALLOC_STATE_DIR"])
    (mine,) = [p for p in state.glob("ledger@dgx1-v100*.json") if ".good." not in p.name]
    (other,) = [p for p in state.glob("ledger@dgx2*.json") if ".good." not in p.name]
    journal = mine.with_name(mine.name.replace(".json", ".root-journal.json"))
    others = [_killed_write(other), _killed_write(journal)]
    for path in others:
        _age(path, ORPHAN_LOCK_AGE_S + 5)

    result = gpualloc("gc", "--json")

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["removed_temporary_files"] == []
    assert all(path.exists() for path in others)
    result = gpualloc("gc", "--json", topology="dgx2")
    assert json.loads(result.stdout)["removed_temporary_files"] == [others[0].name]
