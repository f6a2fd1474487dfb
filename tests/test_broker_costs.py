"""What the broker does not do again on every request (issue 43, point 4): search a placement
it found for the same request on the same free GPUs, or wait for ext4 to write out a ledger
it renames into place."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from gpualloc.atomic import write_text_atomic, write_user_output
from gpualloc.host import local
from gpualloc.host.local import LocalHost
from gpualloc.host.terms import LeaseTerms
from gpualloc.model.request import JobRequest
from gpualloc.placement.mapa.patterns import build_pattern
from gpualloc.placement.want import Want
from gpualloc.topologies import load_bundled


def _want(gpus: int, **fields: Any) -> Want:
    return Want(request=JobRequest(gpus, build_pattern("ring", gpus), True), **fields)


@pytest.fixture
def searches(monkeypatch: pytest.MonkeyPatch) -> list[Want]:
    """Every search the host runs, by request."""
    made: list[Want] = []

    def counting(function: Any) -> Any:
        def counted(topology: Any, occupancy: Any, want: Want, **kwargs: Any) -> Any:
            made.append(want)
            return function(topology, occupancy, want, **kwargs)

        return counted

    monkeypatch.setattr(local, "choose", counting(local.choose))
    monkeypatch.setattr(local, "searched", counting(local.searched))
    return made


def _host(tmp_path: Path, memo: bool) -> LocalHost:
    host = LocalHost.open(load_bundled("dgx1-v100"), state_dir=tmp_path / "state")
    host.placement_memo = {} if memo else None
    return host


def _cycle(host: LocalHost, want: Want) -> tuple[int, ...]:
    made = host.allocate(want, LeaseTerms(source="alloc", hold=True))
    host.release_leases([made.lease.id])
    return made.lease.indices


def test_the_same_request_on_the_same_free_gpus_is_searched_once(
    tmp_path: Path, searches: list[Want]
) -> None:
    host = _host(tmp_path, memo=True)
    two, three = _want(2), _want(3)
    first = [_cycle(host, two) for _ in range(5)]
    assert len(set(first)) == 1 and len(searches) == 1
    _cycle(host, three)
    assert len(searches) == 2  # another request: searched
    held = host.allocate(_want(1), LeaseTerms(source="alloc", hold=True))
    assert len(searches) == 3
    _cycle(host, two)  # another host state (one GPU held): searched again
    assert len(searches) == 4
    host.release_leases([held.lease.id])
    assert _cycle(host, two) == first[0] and len(searches) == 4  # the first state again


def test_answers_are_the_searchs_own(tmp_path: Path, searches: list[Want]) -> None:
    remembered, searched = _host(tmp_path / "a", memo=True), _host(tmp_path / "b", memo=False)
    for gpus in (1, 2, 3, 4, 2, 1, 3):
        assert _cycle(remembered, _want(gpus)) == _cycle(searched, _want(gpus))


def test_explicit_lists_are_not_remembered(tmp_path: Path, searches: list[Want]) -> None:
    host = _host(tmp_path, memo=True)
    for _ in range(3):
        _cycle(host, _want(2, explicit=(4, 5)))
    assert len(searches) == 3 and host.placement_memo == {}


def test_the_memo_is_forgotten_at_its_bound(
    tmp_path: Path, searches: list[Want], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local, "MAX_REMEMBERED_PLACEMENTS", 2)
    host = _host(tmp_path, memo=True)
    for gpus in (1, 2, 3):
        _cycle(host, _want(gpus))
    assert host.placement_memo is not None and len(host.placement_memo) == 1


@pytest.mark.parametrize("fallocate_works", [True, False])
def test_an_unsynced_atomic_write_holds_its_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fallocate_works: bool
) -> None:
    asked: list[int] = []

    def fallocate(descriptor: int, offset: int, length: int) -> None:
        asked.append(length)
        if not fallocate_works:
            raise OSError(95, "Operation not supported")

    monkeypatch.setattr(os, "posix_fallocate", fallocate)
    path = tmp_path / "ledger.json"
    path.write_text("an old and much longer text than the new one\n")
    write_text_atomic(path, "ünïcode\n", mode=0o644, sync=False)
    assert path.read_text(encoding="utf-8") == "ünïcode\n"
    assert asked == [len("ünïcode\n".encode())]  # its bytes, not its characters
    assert path.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["ledger.json"]  # no temporary left


def test_a_synced_write_is_not_preallocated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "posix_fallocate", lambda *args: pytest.fail("preallocated"))
    write_text_atomic(tmp_path / "x", "text", sync=True)
    assert (tmp_path / "x").read_text() == "text"


def test_a_users_output_path_never_replaces_a_device_a_fifo_or_a_directory(
    tmp_path: Path,
) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    write_user_output(Path("/dev/null"), "text\n")  # a device: written in place
    with pytest.raises(OSError) as unread:
        write_user_output(fifo, "text\n")  # nobody reads it: at once, not a wait
    assert unread.value.errno == errno.ENXIO
    with pytest.raises(IsADirectoryError):
        write_user_output(tmp_path, "text\n")
    assert Path("/dev/null").is_char_device() and fifo.is_fifo()
    assert [p.name for p in tmp_path.iterdir()] == ["pipe"]  # no temporary left either


def test_a_users_output_path_through_a_link_replaces_the_file_it_names(tmp_path: Path) -> None:
    real = tmp_path / "real.json"
    real.write_text("old\n")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    write_user_output(link, "new\n")
    assert link.is_symlink() and real.read_text() == "new\n"


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
