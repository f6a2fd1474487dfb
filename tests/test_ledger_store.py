"""The ledger: transactions, reaping, recovery from damage, refusal of unsafe state, races and
crashes (real processes, real locks, real kill -9)."""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import random
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from msgspec.structs import replace

from gpualloc.errors import LedgerError
from gpualloc.ledger.liveness import lock_held, process_start_time, take_lease_lock
from gpualloc.ledger.schema import SCHEMA_VERSION, Ledger
from gpualloc.ledger.statedir import check_state_directory, open_state_directory
from gpualloc.ledger.store import LedgerStore, lease_alive, new_lease_id, parse_ledger
from gpualloc.model.validation import to_builtins
from tests.child_processes import STOP_S, end
from tests.leases import HOST, held_lease
from tests.unix_users import as_user, two_test_users


def _store(path: Path, **options) -> LedgerStore:
    return LedgerStore(open_state_directory(path), host=HOST, **options)


def test_a_lease_is_written_read_back_and_the_files_are_shared(tmp_path):
    store = _store(tmp_path / "state")
    lease = held_lease(2, 3, name="train")
    with store.transaction() as txn:
        txn.add(lease)
    directory = store.directory
    assert stat.S_IMODE(directory.path.stat().st_mode) == 0o1777
    assert stat.S_IMODE(directory.ledger_file.stat().st_mode) == 0o666
    assert stat.S_IMODE(directory.good_copy(os.geteuid()).stat().st_mode) == 0o644
    ledger = store.read().ledger
    assert ledger.leases == [lease]
    assert ledger.generation == 1
    assert ledger.schema_version == SCHEMA_VERSION
    assert json.loads(directory.ledger_file.read_text())["leases"][0]["name"] == "train"


def test_a_gpu_is_never_held_twice(tmp_path):
    store = _store(tmp_path)
    with store.transaction() as txn:
        txn.add(held_lease(0, 1))
    with pytest.raises(LedgerError, match="GPU 1 is already held"), store.transaction() as txn:
        txn.add(held_lease(1, 2))
    assert [lease.indices for lease in store.read().ledger.leases] == [(0, 1)]
    with pytest.raises(ValueError, match="GPU 1 is held by leases"):
        Ledger(host=HOST, leases=[held_lease(0, 1), held_lease(1)])


def test_dead_leases_are_reaped_by_any_transaction(tmp_path):
    dead = held_lease(0)
    store = _store(tmp_path, alive=lambda lease, directory: lease.id != dead.id)
    with store.transaction() as txn:
        txn.add(dead)
        txn.add(held_lease(1))
    txn = store.read()
    assert [lease.id for lease in txn.reaped] == [dead.id]
    assert [lease.indices for lease in txn.ledger.leases] == [(1,)]
    assert store.read().reaped == []


def test_a_lease_lives_as_long_as_its_process(tmp_path):
    directory = open_state_directory(tmp_path)
    child = subprocess.Popen(["sleep", "30"])
    try:
        start = process_start_time(child.pid)
        lease = held_lease(0, hold=False, pid=child.pid, pid_start_time=start)
        assert lease_alive(lease, directory)
        # The same pid with another start time is another program: the kernel reused the pid.
        assert not lease_alive(replace(lease, pid_start_time=start - 5), directory)
    finally:
        end(child)
    assert not lease_alive(lease, directory)


def test_the_lease_lock_keeps_a_lease_alive_after_its_process(tmp_path):
    """The job's children inherit the lock: the lease lives while any of them runs."""
    directory = open_state_directory(tmp_path)
    lease_id = new_lease_id()
    path = directory.lease_lock(lease_id)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from gpualloc.ledger.liveness import take_lease_lock; "
            "take_lease_lock(__import__('pathlib').Path(sys.argv[1])); print('ok', flush=True); "
            "time.sleep(30)",
            str(path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ok"
        lease = held_lease(0, id=lease_id, hold=False, lock=True, pid=2**22 - 1, pid_start_time=1.0)
        assert lock_held(path)
        assert lease_alive(lease, directory)
    finally:
        end(holder)
    assert not lock_held(path)
    assert not lease_alive(lease, directory)


def test_a_lease_lock_is_inherited_across_exec(tmp_path):
    path = tmp_path / "lease.lock"
    descriptor = take_lease_lock(path)
    # close_fds=False: only descriptors marked inheritable survive the exec.
    child = subprocess.Popen(["sleep", "30"], close_fds=False)
    os.close(descriptor)
    try:
        assert lock_held(path)
    finally:
        end(child)
    assert not lock_held(path)


def test_a_torn_ledger_is_recovered_from_the_good_copy(tmp_path):
    store = _store(tmp_path)
    with store.transaction() as txn:
        txn.add(held_lease(0))
        txn.add(held_lease(5, 6))
    text = store.directory.ledger_file.read_text()
    store.directory.ledger_file.write_text(text[: len(text) // 2])
    txn = store.read()
    assert sorted(lease.indices for lease in txn.ledger.leases) == [(0,), (5, 6)]
    assert "recovered generation 1" in txn.notes[0]
    # The recovery is written back: the next reader finds nothing to say.
    assert store.read().notes == []


def test_a_damaged_ledger_without_a_good_copy_is_reported_not_emptied(tmp_path):
    store = _store(tmp_path)
    with store.transaction() as txn:
        txn.add(held_lease(0))
    store.directory.good_copy(os.geteuid()).unlink()
    store.directory.ledger_file.write_text('{"schema_version": 1, "leases": [')
    with pytest.raises(LedgerError, match="no good copy") as caught:
        store.read()
    assert "mv " in caught.value.hint
    assert store.directory.ledger_file.read_text().startswith('{"schema_version": 1')


def test_a_ledger_a_crash_of_the_machine_tore_with_its_good_copies_starts_anew(tmp_path):
    """Nothing is synced: a machine crash may tear the ledger and leave
    every good copy zeroed (a preallocated file never written out). Last written before this
    boot, nothing in it is alive: a new ledger starts, saying so."""
    from gpualloc.ledger.liveness import _boot_time

    store = _store(tmp_path)
    with store.transaction() as txn:
        txn.add(held_lease(0))
    good = store.directory.good_copy(os.geteuid())
    size = good.stat().st_size
    good.write_bytes(b"\0" * size)
    store.directory.ledger_file.write_bytes(b"\0" * 100)
    before_boot = _boot_time() - 60
    os.utime(store.directory.ledger_file, (before_boot, before_boot))
    with store.transaction() as txn:
        assert txn.ledger.leases == [] and "before this boot" in txn.notes[0]
        txn.add(held_lease(1))
    assert [lease.indices for lease in store.read().ledger.leases] == [(1,)]


def test_an_unsynced_good_copy_is_written_without_fsync(tmp_path, monkeypatch):
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd))
    store = _store(tmp_path)
    with store.transaction() as txn:
        txn.add(held_lease(0))
    assert synced == []  # a kill loses nothing from the page cache; a crash ends every lease


def test_a_ledger_from_a_newer_gpualloc_is_refused(tmp_path):
    store = _store(tmp_path)
    with store.transaction() as txn:
        txn.add(held_lease(0))
    data = json.loads(store.directory.ledger_file.read_text())
    data["schema_version"] = SCHEMA_VERSION + 1
    store.directory.ledger_file.write_text(json.dumps(data))
    with pytest.raises(LedgerError, match="newer gpualloc") as caught:
        store.read()
    assert "upgrade" in caught.value.hint


def test_a_ledger_of_another_host_is_refused(tmp_path):
    with _store(tmp_path).transaction() as txn:
        txn.add(held_lease(0))
    other = LedgerStore(open_state_directory(tmp_path), host="elsewhere")
    with pytest.raises(LedgerError, match="belongs to host 'testhost'"):
        other.read()


def test_unsafe_state_directories_are_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(LedgerError, match="symbolic link"):
        open_state_directory(link)
    real.chmod(0o777)
    with pytest.raises(LedgerError, match="without the sticky bit"):
        open_state_directory(real)
    real.chmod(0o755)
    if os.geteuid() == 0:
        os.chown(real, 4242, -1)  # as root (CI): a directory some user owns
    info = os.lstat(real)
    assert info.st_uid != 0
    with pytest.raises(LedgerError, match="root uses only a directory owned by root"):
        check_state_directory(real, info, uid=0)
    check_state_directory(real, info, uid=info.st_uid)  # its owner may use it
    file = tmp_path / "file"
    file.write_text("")
    with pytest.raises(LedgerError, match="not a directory"):
        open_state_directory(file)


def test_the_ledger_file_is_not_followed_through_a_symlink(tmp_path):
    """Root (a Slurm prolog) removes a symlink planted as the ledger and never writes through
    it; a user is refused with the owner named (tests/test_shared_ledger.py)."""
    store = _store(tmp_path / "state")
    target = tmp_path / "elsewhere.json"
    target.write_text("precious\n")
    store.directory.ledger_file.symlink_to(target)
    if os.geteuid() != 0:
        with pytest.raises(LedgerError, match="symbolic link"):
            store.read()
    else:
        with store.transaction() as txn:
            txn.add(held_lease(0))
        assert not store.directory.ledger_file.is_symlink()
        assert [lease.indices for lease in store.read().ledger.leases] == [(0,)]
    assert target.read_text() == "precious\n"


def _contend(path: str, rounds: int, results) -> None:
    """Take any free GPU of 8, then give it back; count what was taken and released."""
    store = LedgerStore(open_state_directory(Path(path)), host=HOST)
    taken = released = 0
    for _ in range(rounds):
        with store.transaction() as txn:
            held = txn.ledger.held_gpus()
            free = [g for g in range(8) if g not in held]
            mine = [lease for lease in txn.ledger.leases if lease.name == str(os.getpid())]
            if mine and (not free or random.random() < 0.5):
                txn.remove(mine[0].id)
                released += 1
            elif free:
                txn.add(held_lease(random.choice(free), name=str(os.getpid())))
                taken += 1
    results.put((taken, released))


def test_concurrent_transactions_never_double_book_or_lose_an_update(tmp_path):
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    workers = [
        context.Process(target=_contend, args=(str(tmp_path), 25, results)) for _ in range(8)
    ]
    for worker in workers:
        worker.start()
    try:
        counts = [results.get(timeout=120) for _ in workers]
    finally:
        for worker in workers:
            worker.join(timeout=STOP_S)  # it has sent its counts; one that hangs is killed
            worker.kill()
            worker.join(timeout=STOP_S)
    ledger = _store(tmp_path).read().ledger  # validates: no GPU held twice
    assert len(ledger.leases) == sum(taken - released for taken, released in counts)
    assert ledger.generation == sum(taken + released for taken, released in counts)


_CHURN = """
import sys
from pathlib import Path
from tests.leases import HOST, held_lease
from gpualloc.ledger.statedir import open_state_directory
from gpualloc.ledger.store import LedgerStore
store = LedgerStore(open_state_directory(Path(sys.argv[1])), host=HOST)
print("ready", flush=True)
while True:
    with store.transaction() as txn:
        churn = [lease for lease in txn.ledger.leases if lease.name == "churn"]
        if churn:
            txn.remove(churn[0].id)
        else:
            txn.add(held_lease(7, name="churn", command=("x" * 20000,)))
"""


def test_killing_a_writer_at_random_points_loses_no_live_lease(tmp_path):
    """A process rewriting the ledger in a loop is killed with SIGKILL at random moments; every
    time, the lock is free again, the ledger loads and the long-lived lease is still there.
    Most kills land outside the short write itself; the deaths inside each write step are
    injected deterministically by the next test."""
    store = _store(tmp_path)
    keep = held_lease(0, 1, 2, name="keep", command=("y" * 50000,))
    with store.transaction() as txn:
        txn.add(keep)
    rng = random.Random(7)
    root = Path(__file__).resolve().parent.parent
    for _ in range(12):
        writer = subprocess.Popen(
            [sys.executable, "-c", _CHURN, str(tmp_path)],
            cwd=root,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert writer.stdout.readline().strip() == "ready"
            time.sleep(rng.uniform(0.0, 0.15))
        finally:
            end(writer)  # SIGKILL
        leases = store.read().ledger.leases
        assert keep in leases
        assert all(lease.name in ("keep", "churn") for lease in leases)


_DIE_MID_WRITE = """
import os, sys
from pathlib import Path
import gpualloc.ledger.store as store_module
from gpualloc.ledger.statedir import open_state_directory
from tests.leases import HOST, held_lease

def die_half_way(path, data, *_):
    descriptor = os.open(path, os.O_WRONLY)
    os.pwrite(descriptor, data[: len(data) // 2], 0)
    os._exit(9)  # the process dies with ledger.json half rewritten, in place

def die_half_way_truncated(path, data, *_):
    descriptor = os.open(path, os.O_WRONLY)
    os.ftruncate(descriptor, 0)
    os.write(descriptor, data[: len(data) // 2])
    os._exit(9)  # the same over a file it truncated first (one of an older gpualloc)

def die_before_writing(path, data, *_):
    os._exit(9)  # the good copy is written, ledger.json not touched yet

store_module.overwrite_in_place = {
    "half": die_half_way, "truncated": die_half_way_truncated, "before": die_before_writing
}[sys.argv[2]]
store = store_module.LedgerStore(open_state_directory(Path(sys.argv[1])), host=HOST)
with store.transaction() as txn:
    txn.add(held_lease(4, name="new"))
"""


@pytest.mark.parametrize(
    ("point", "expect_new"),
    [("half", True), ("truncated", True), ("before", False)],
    ids=["dies-mid-rewrite", "dies-mid-rewrite-truncated-first", "dies-before-rewrite"],
)
def test_a_writer_killed_inside_a_write_leaves_a_loadable_ledger(tmp_path, point, expect_new):
    """Deterministic fault injection at the two steps of a write: dying half way through the
    in-place rewrite leaves a torn ledger.json (the start of the new text over the old one, or
    a strict prefix when truncated first), recovered from the writer's good copy (with the new
    lease); dying before it leaves the old ledger, which loads as it was."""
    store = _store(tmp_path)
    keep = held_lease(0, name="keep", command=("z" * 5000,))
    with store.transaction() as txn:
        txn.add(keep)
    if point == "half":
        # Another user wrote last: the dying writer's own good copy is the only newer one.
        store.directory.good_copy(os.geteuid()).rename(tmp_path / "ledger.4242.good.json")
    root = Path(__file__).resolve().parent.parent
    died = subprocess.run(
        [sys.executable, "-c", _DIE_MID_WRITE, str(tmp_path), point],
        cwd=root,
        check=False,
        timeout=120,
    )
    assert died.returncode == 9
    txn = store.read()
    names = sorted(lease.name for lease in txn.ledger.leases)
    assert names == (["keep", "new"] if expect_new else ["keep"])
    assert bool(txn.notes) == expect_new


def test_every_mixture_of_two_generations_is_rejected():
    """Why a torn rewrite in place is always detected: the start of a new
    text over the end of the one before, cut anywhere (a writer killed in the middle, or before
    it cut off the old text's rest), reads as damaged, or as exactly the old ledger where the
    two texts begin alike; a longer text over a shorter one and a shorter over a longer."""
    from gpualloc.ledger.document import written_ledger

    texts = [
        written_ledger(Ledger(host=HOST, generation=8 + i, leases=leases), 0)[0]
        for i, leases in enumerate(
            ([held_lease(0)], [held_lease(1, 2, name="x" * 40)], [held_lease(6)])
        )
    ]
    assert texts[1].endswith(',"generation_end":10}\n')
    for before, written in itertools.pairwise(texts):
        for cut in range(1, len(written) + 1):
            mixed = written[:cut] + before[cut:]
            if mixed.rstrip() in (written.rstrip(), before.rstrip()):
                continue  # all of one of them (its newline cut, or the same start)
            with pytest.raises(LedgerError):
                parse_ledger(mixed, "mixed")


def test_a_file_is_rewritten_in_place_only_over_an_earlier_generation(tmp_path):
    """In place over a file that ends with an earlier generation; truncated first (ledger.json)
    or replaced (the good copy) over one of an older gpualloc or of a later generation (a
    ledger started anew), where a mixture might not show."""
    store = _store(tmp_path)
    for gpu, name in enumerate(("a", "b")):
        with store.transaction() as txn:
            txn.add(held_lease(gpu, name=name))
    ledger_file, own = store.directory.ledger_file, store.directory.good_copy(os.geteuid())
    inodes = (ledger_file.stat().st_ino, own.stat().st_ino)
    with store.transaction() as txn:
        txn.add(held_lease(3, name="c"))
    assert (ledger_file.stat().st_ino, own.stat().st_ino) == inodes  # in place, both
    own.write_text(own.read_text().replace('"generation_end"', '"generation_gone"'))
    with store.transaction() as txn:
        txn.add(held_lease(4, name="d"))
    assert own.stat().st_ino != inodes[1]  # replaced: it did not end with a generation
    assert parse_ledger(own.read_text(), "own").generation == 4


def test_every_strict_prefix_of_a_ledger_is_rejected():
    """Why a torn rewrite over a file of an older gpualloc is always detected: ledger.json is
    truncated before it is written, so a crash leaves a strict prefix of the new text, and no
    such prefix parses."""
    ledger = Ledger(host=HOST, generation=3, leases=[held_lease(0), held_lease(1, 2, name="x")])
    text = json.dumps(to_builtins(ledger), indent=1, sort_keys=True) + "\n"
    assert parse_ledger(text, "full") == ledger
    for cut in range(len(text) - 1):
        with pytest.raises(LedgerError):
            parse_ledger(text[:cut], "prefix")


def test_two_unix_users_share_one_sticky_state_directory():
    """Two real users in a root-owned mode-1777 directory, as an administrator sets it up: each
    writes over the ledger the other created (a rename would be refused by the sticky bit),
    each keeps a good copy, and a damaged ledger is recovered from the other user's copy."""
    import tempfile

    (uid_a, gid_a), (uid_b, gid_b) = two_test_users()
    path = Path(tempfile.mkdtemp(prefix="gpualloc-shared-", dir="/tmp"))
    try:
        path.chmod(0o1777)

        def add(name: str, gpu: int):
            def action() -> None:
                store = LedgerStore(open_state_directory(path), host=HOST)
                with store.transaction() as txn:
                    txn.add(held_lease(gpu, name=name, uid=os.geteuid()))

            return action

        as_user(uid_a, gid_a, add("a", 0))
        as_user(uid_b, gid_b, add("b", 1))
        as_user(uid_a, gid_a, add("a2", 2))
        ledger_file = path / "ledger.json"
        assert ledger_file.stat().st_uid == uid_a  # rewritten in place, never replaced

        def rename_is_refused() -> None:
            mine = path / "b-temporary"
            mine.write_text("{}")
            with pytest.raises(PermissionError):
                mine.replace(ledger_file)
            mine.unlink()

        as_user(uid_b, gid_b, rename_is_refused)  # why temp file + rename cannot work here
        assert (path / f"ledger.{uid_b}.good.json").stat().st_uid == uid_b
        leases = LedgerStore(open_state_directory(path), host=HOST).read().ledger.leases
        assert [(lease.name, lease.uid) for lease in leases] == [
            ("a", uid_a),
            ("b", uid_b),
            ("a2", uid_a),
        ]

        # B's write was the last one before this damage: A recovers from B's good copy.
        as_user(uid_b, gid_b, add("b2", 3))
        ledger_file.write_text("{")

        def recover() -> None:
            txn = LedgerStore(open_state_directory(path), host=HOST).read()
            assert [lease.name for lease in txn.ledger.leases] == ["a", "b", "a2", "b2"]
            assert "recovered" in txn.notes[0]

        as_user(uid_a, gid_a, recover)
    finally:
        import shutil

        shutil.rmtree(path)


def test_nothing_survives_a_reboot_not_even_a_held_lease(tmp_path):
    """A lease made in an earlier boot is dead: a Slurm job's lease on a node that crashed
    before its Epilog, or an 'alloc --hold' somebody forgot, does not block the GPUs forever."""
    from gpualloc.boot import boot_id

    now = boot_id()
    if now is None:
        pytest.skip("this kernel offers no boot id")
    store = _store(tmp_path / "state")
    this_boot = held_lease(0, boot_id=now)
    last_boot = held_lease(1, boot_id="00000000-0000-0000-0000-000000000000")
    unknown = held_lease(2)  # written where no boot id was known: the old rule stands
    with store.transaction() as txn:
        txn.add(this_boot)
        txn.add(last_boot)
        txn.add(unknown)
    txn = store.read()
    assert [lease.id for lease in txn.reaped] == [last_boot.id]
    assert [lease.id for lease in txn.ledger.leases] == [this_boot.id, unknown.id]
