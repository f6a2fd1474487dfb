"""The client side of a brokered ledger: :class:`~gpualloc.launcher.allocate.HostLedger`'s
changes, made by the broker instead of in a local transaction.

A command opens the host the same way in both modes (``cli.open_ledger.open_host_ledger``); in
broker mode it gets a host whose topology, processes and ledger are the broker's view, and
whose ``remote`` sends every change to the broker. ``run``, ``alloc``, ``release``, ``gc`` and
the queue then behave as with the embedded ledger: the same results, errors and exit codes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpualloc.broker.client import BrokerClient
from gpualloc.ledger.store import new_lease_id
from gpualloc.model.validation import from_builtins, to_builtins

if TYPE_CHECKING:
    from gpualloc.launcher.allocate import (
        Allocation,
        GarbageReport,
        HostLedger,
        LeaseTerms,
        ReleaseResult,
    )
    from gpualloc.launcher.queue import WaitOptions
    from gpualloc.launcher.wait import WaitStatus
    from gpualloc.ledger.store import LedgerTransaction
    from gpualloc.placement.want import Want


class RemoteLedger:
    """Calls to the broker at ``path`` on one connection."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.client = BrokerClient(path)
        self._ledger_file: Path | None = None

    def view(self, *, full: bool = True) -> dict[str, Any]:
        """The broker's snapshot: topology, and with ``full`` the ledger, processes, faults."""
        return self.client.call("snapshot", {"full": full})

    def snapshot(self) -> LedgerTransaction:
        return served_snapshot(self.view())

    @property
    def ledger_file(self) -> Path:
        """The broker's ledger file, which every user may read (the shared jobs' watchers
        do)."""
        if self._ledger_file is None:
            self._ledger_file = Path(self.client.call("hello")["ledger"])
        return self._ledger_file

    def allocate(
        self,
        want: Want,
        terms: LeaseTerms,
        *,
        waiting: WaitOptions | None = None,
        report: Callable[[WaitStatus], None] | None = None,
        allow_unhealthy: bool = False,
    ) -> Allocation:
        from gpualloc.launcher.allocate import Allocation
        from gpualloc.ledger.schema import Lease
        from gpualloc.model.request import Placement

        args: dict[str, Any] = {
            "lease_id": terms.lease_id or new_lease_id(),
            "request": to_builtins(want.queued()),
            "terms": {
                "source": terms.source,
                "pid": terms.pid,
                "hold": terms.hold,
                "command": list(terms.command),
                "name": terms.name,
                "process_group": terms.process_group,
                "announce": terms.announce,
                "shareable": terms.shareable,
                "memory_bytes": terms.memory_bytes,
                "share_mode": terms.share_mode,
            },
            "allow_unhealthy": allow_unhealthy,
            "wait": None,
        }
        on_event = None
        if waiting is not None:
            args["wait"] = {
                "timeout_s": waiting.timeout_s,
                "priority": waiting.priority,
                "max_bypass": waiting.max_bypass,
            }
            if report is not None:
                on_event = _reporter(report)
        result = self.client.call("alloc", args, on_event=on_event)
        return Allocation(
            from_builtins(result["lease"], Lease),
            from_builtins(result["placement"], Placement),
            None,
            list(result.get("notes", [])),
        )

    def confirm(self, lease_id: str) -> None:
        self.client.call("confirm", {"lease": lease_id})

    def release(self, lease_id: str) -> None:
        self.release_leases([lease_id])

    def release_leases(self, selectors: Iterable[str], *, mine: bool = False) -> ReleaseResult:
        result = self.client.call("release", {"leases": list(selectors), "mine": mine})
        return self._release_result(result)

    @staticmethod
    def _release_result(result: dict[str, Any]) -> ReleaseResult:
        from gpualloc.broker.protocol import error_from
        from gpualloc.launcher.allocate import ReleaseResult
        from gpualloc.ledger.schema import Lease

        return ReleaseResult(
            released=[from_builtins(lease, Lease) for lease in result["released"]],
            problems=[error_from({"error": problem}) for problem in result["problems"]],  # type: ignore[misc]
        )

    def evict(
        self, selectors: Iterable[str], *, mine: bool = False, grace_s: float | None = None
    ) -> ReleaseResult:
        """``release --evict-shared``: the shared jobs marked (their watchers end them)."""
        args = {"leases": list(selectors), "mine": mine, "grace_s": grace_s}
        return self._release_result(self.client.call("evict", args))

    def collect_garbage(self) -> GarbageReport:
        from gpualloc.launcher.allocate import GarbageReport
        from gpualloc.ledger.idle import Expiry
        from gpualloc.ledger.schema import Lease, Waiter

        report = self.client.call("gc", {})
        return GarbageReport(
            reaped=from_builtins(report["reaped"], list[Lease]),
            dropped_waiters=from_builtins(report["dropped_waiters"], list[Waiter]),
            removed_lock_files=list(report["removed_lock_files"]),
            notes=list(report["notes"]),
            expiries=[
                Expiry(
                    from_builtins(e["lease"], Lease),
                    e["event"],
                    timedelta(seconds=float(e["idle_s"])),
                )
                for e in report["expiries"]
            ],
        )


def brokered_host(socket: Path, *, full: bool = True) -> HostLedger:
    """The host as the broker at ``socket`` sees it (``full``: with its ledger, processes
    and faults; else the topology alone, for ``run`` and ``alloc``)."""
    from gpualloc.discovery.processes import ProcessReport
    from gpualloc.launcher.allocate import HostLedger
    from gpualloc.model.topology import GpuFault, Topology

    remote = RemoteLedger(socket)
    view = remote.view(full=full)
    host = HostLedger(
        from_builtins(view["topology"], Topology),
        None,
        from_builtins(view.get("processes") or {}, ProcessReport),
        bool(view["this_host"]),
    )
    host.remote = remote
    if full:
        host.served = served_snapshot(view)
        host.faults = from_builtins(view["faults"], list[GpuFault])
        host.health_notes = list(view["health_notes"])
    return host


def served_snapshot(view: dict[str, Any]) -> LedgerTransaction:
    """The ledger of a broker's snapshot, as :meth:`HostLedger.snapshot` returns it."""
    from gpualloc.ledger.schema import Ledger
    from gpualloc.ledger.store import LedgerTransaction

    return LedgerTransaction(from_builtins(view["ledger"], Ledger), notes=list(view["notes"]))


def _reporter(report: Callable[[WaitStatus], None]) -> Callable[[dict[str, Any]], None]:
    def event(status: dict[str, Any]) -> None:
        from gpualloc.launcher.wait import WaitStatus

        with contextlib.suppress(Exception):  # a courtesy: never the end of the wait
            report(from_builtins(status, WaitStatus))

    return event
