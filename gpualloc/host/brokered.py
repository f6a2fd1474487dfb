"""The brokered ledger's :class:`~gpualloc.host.protocol.Host`: every change made by the host's
broker (``gpualloc serve``), over its socket.

:func:`gpualloc.host.open.open_host` gives a command this host when the host has a broker; its
topology, processes and ledger are the broker's view, and ``run``, ``alloc``, ``release``, ``gc``
and the queue behave as with the embedded ledger: the same results, errors and exit codes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpualloc.discovery.processes import ProcessReport
from gpualloc.host.terms import Allocation, GarbageReport, LeaseTerms, ReleaseResult
from gpualloc.host.view import HostView
from gpualloc.ledger.store import LedgerTransaction, new_lease_id
from gpualloc.model.topology import GpuFault, Topology
from gpualloc.model.validation import from_builtins, to_builtins
from gpualloc.wire.client import BrokerClient

if TYPE_CHECKING:
    from gpualloc.host.queue import WaitOptions
    from gpualloc.host.terms import WaitStatus
    from gpualloc.launcher.verify import VerifyTerms
    from gpualloc.ledger.idle import IdlePolicy
    from gpualloc.ledger.schema import Lease
    from gpualloc.ledger.trust import Trust
    from gpualloc.placement.want import Want


class BrokeredHost(HostView, kw_only=True):
    """The host as the broker at ``socket`` sees it, calling it on one connection."""

    socket: Path
    client: BrokerClient
    served: LedgerTransaction | None = None
    """The ledger as the broker's snapshot showed it when the host was opened (``full``),
    until this host asks the broker for a change: :meth:`snapshot` then asks again."""
    _ledger_file: Path | None = None

    @classmethod
    def open(
        cls, socket: Path, *, full: bool = True, answer_s: float | None = None
    ) -> BrokeredHost:
        """The host as the broker at ``socket`` sees it (``full``: with its ledger, processes
        and faults; else the topology alone, for ``run`` and ``alloc``); ``answer_s``: how long
        to wait for the broker to say anything (``host.broker_timeout``)."""
        client = BrokerClient(socket, answer_s=answer_s)
        view = _view(client, full=full)
        host = cls(
            topology=from_builtins(view["topology"], Topology),
            processes=from_builtins(view.get("processes") or {}, ProcessReport),
            this_host=bool(view["this_host"]),
            socket=socket,
            client=client,
        )
        if full:
            host.served = served_snapshot(view)
            host.faults = from_builtins(view["faults"], list[GpuFault])
            host.health_notes = list(view["health_notes"])
        return host

    @property
    def broker_socket(self) -> Path:
        return self.socket

    def snapshot(self) -> LedgerTransaction:
        if self.served is not None:
            return self.served
        return served_snapshot(_view(self.client, full=True))

    def _call(self, command: str, args: dict[str, Any], **options: Any) -> Any:
        """A request that may change the ledger: the snapshot served at opening is stale
        after it (``tests/test_host_contract.py``)."""
        self.served = None
        return self.client.call(command, args, **options)

    def start_verifier(self, lease: Lease, terms: VerifyTerms, look: object = None) -> None:
        """Fork the verifier of this process, about to exec the job; it asks the broker where
        processes run (:mod:`gpualloc.launcher.verify_brokered`), so ``look`` is not used."""
        from gpualloc.launcher.verify_brokered import start_verifier

        start_verifier(self.socket, to_builtins(lease), terms.grace_s, terms.action)

    def ledger_file(self) -> Path:
        """The broker's ledger file, which every user may read (the shared jobs' watchers
        do)."""
        if self._ledger_file is None:
            self._ledger_file = Path(self.client.call("hello")["ledger"])
        return self._ledger_file

    def ledger_place(self) -> str:
        return f"the broker's ledger ({self.socket})"

    def trust(self, *, detailed: bool = False) -> Trust:
        from gpualloc.ledger.trust import broker_trust

        return broker_trust(self.socket, self.client.call("hello") if detailed else None)

    def allocate(
        self,
        want: Want,
        terms: LeaseTerms,
        *,
        wait: WaitOptions | None = None,
        report: Callable[[WaitStatus], None] | None = None,
        allow_unhealthy: bool | None = None,
    ) -> Allocation:
        from gpualloc.ledger.schema import Lease
        from gpualloc.model.request import Placement

        if allow_unhealthy is None:
            allow_unhealthy = self.allow_unhealthy
        args: dict[str, Any] = {
            "lease_id": terms.lease_id or new_lease_id(),
            "options": sent_options(want),
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
        if wait is not None:
            args["wait"] = {
                "timeout_s": wait.timeout_s,
                "priority": wait.priority,
                "max_bypass": wait.max_bypass,
            }
            if report is not None:
                on_event = _reporter(report)
        result = self._call("alloc", args, on_event=on_event)
        return Allocation(
            from_builtins(result["lease"], Lease),
            from_builtins(result["placement"], Placement),
            None,
            list(result.get("notes", [])),
        )

    def confirm(self, lease_id: str) -> None:
        self._call("confirm", {"lease": lease_id})

    def release(self, lease_id: str) -> None:
        self.release_leases([lease_id])

    def release_leases(
        self, selectors: Iterable[str], *, mine: bool = False, include_running: bool = False
    ) -> ReleaseResult:
        args = {"leases": list(selectors), "mine": mine, "include_running": include_running}
        return _release_result(self._call("release", args))

    def evict(
        self, selectors: Iterable[str], *, mine: bool = False, grace_s: float | None = None
    ) -> ReleaseResult:
        """``release --evict-shared``: the shared jobs marked (their watchers end them)."""
        args = {"leases": list(selectors), "mine": mine, "grace_s": grace_s}
        return _release_result(self._call("evict", args))

    def collect_garbage(self, idle: IdlePolicy | None = None) -> GarbageReport:
        """The broker's own idle policy applies (``idle`` is the embedded ledger's)."""
        from gpualloc.ledger.idle import Expiry
        from gpualloc.ledger.schema import Lease, Waiter

        report = self._call("gc", {})
        return GarbageReport(
            reaped=from_builtins(report["reaped"], list[Lease]),
            dropped_waiters=from_builtins(report["dropped_waiters"], list[Waiter]),
            removed_lock_files=list(report["removed_lock_files"]),
            # A broker older than the field sends none.
            removed_temporary_files=list(report.get("removed_temporary_files", [])),
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


def sent_options(want: Want) -> dict[str, Any]:
    """The job as a broker client sends it: the options ``want`` was made from, its policy
    resolved (the broker makes the same Want of them); a pattern read from a file goes as its
    name and edges, for the broker opens no file a client names."""
    from gpualloc.job_options import PATTERN_NAMES

    if want.options is None:
        raise ValueError("a Want for the broker is made by gpualloc.placement.options.want_of")
    sent: dict[str, Any] = to_builtins(want.options)
    if want.options.pattern not in PATTERN_NAMES:
        sent["pattern"] = want.request.pattern.name
        sent["edges"] = to_builtins(want.request.pattern.edges)
    return sent


def _view(client: BrokerClient, *, full: bool) -> dict[str, Any]:
    """The broker's snapshot: topology, and with ``full`` the ledger, processes, faults."""
    return client.call("snapshot", {"full": full})


def _release_result(result: dict[str, Any]) -> ReleaseResult:
    from gpualloc.ledger.schema import Lease
    from gpualloc.wire.protocol import error_from

    return ReleaseResult(
        released=[from_builtins(lease, Lease) for lease in result["released"]],
        problems=[error_from({"error": problem}) for problem in result["problems"]],  # type: ignore[misc]
        kept=[from_builtins(lease, Lease) for lease in result.get("kept", [])],  # older: none
    )


def served_snapshot(view: dict[str, Any]) -> LedgerTransaction:
    """The ledger of a broker's snapshot, as :meth:`BrokeredHost.snapshot` returns it."""
    from gpualloc.ledger.schema import Ledger

    return LedgerTransaction(from_builtins(view["ledger"], Ledger), notes=list(view["notes"]))


def _reporter(report: Callable[[WaitStatus], None]) -> Callable[[dict[str, Any]], None]:
    def event(status: dict[str, Any]) -> None:
        from gpualloc.host.terms import WaitStatus

        with contextlib.suppress(Exception):  # a courtesy: never the end of the wait
            report(from_builtins(status, WaitStatus))

    return event
