"""The brokered ledger's :class:`~gpualloc.host.protocol.Host`: every change made by the host's
broker (``gpualloc serve``), over its socket.

:func:`gpualloc.host.open.open_host` gives a command this host when the host has a broker; its
topology, processes and ledger are the broker's view, and ``run``, ``alloc``, ``release``, ``gc``
and the queue behave as with the embedded ledger: the same results, errors and exit codes
(``tests/test_host_contract.py``).

It is the one client of the broker, and a lean one: it asks for the broker's view only when a
caller reads it, so :meth:`BrokeredHost.start` (``run``, ``alloc``) decodes no topology and no
ledger models: the broker sends what the launch needs (:mod:`.grant`). This module imports
them only where they are read (``tests/test_startup_imports.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpualloc.host.grant import Grant, grant_from_answer
from gpualloc.wire.client import BrokerClient

if TYPE_CHECKING:
    from gpualloc.config import Config
    from gpualloc.discovery.processes import ProcessReport
    from gpualloc.host.lease_terms import LeaseTerms
    from gpualloc.host.queue_policy import WaitOptions
    from gpualloc.host.receipt import Receipt
    from gpualloc.host.terms import Allocation, GarbageReport, ReleaseResult, WaitStatus
    from gpualloc.host.view import HostView
    from gpualloc.launcher.verify_terms import VerifyTerms
    from gpualloc.ledger.idle import IdlePolicy
    from gpualloc.ledger.occupancy import Occupancy
    from gpualloc.ledger.schema import Ledger
    from gpualloc.ledger.store import LedgerTransaction
    from gpualloc.ledger.trust import Trust
    from gpualloc.model.job_fields import JobFields
    from gpualloc.model.share import LeasedShare, ShareMode, ShareRequest
    from gpualloc.model.topology import GpuFault, Topology
    from gpualloc.placement.want import Want
    from gpualloc.slurm.job import SlurmJob


class BrokeredHost:
    """The host as the broker at ``socket`` sees it, calling it on one connection."""

    def __init__(self, socket: Path, client: BrokerClient, *, full: bool = True) -> None:
        self.socket = socket
        self.client = client
        self.full = full
        """Whether the broker's view holds its ledger, processes and faults (else the
        topology alone: ``run`` and ``alloc`` need no more)."""
        self.allow_unhealthy = False
        self.ignore_foreign = False
        self.placement_budget_s: float | None = None
        """The broker's own budget applies (``broker.placement_budget``)."""
        self.slurm_job: SlurmJob | None = None
        self.served: LedgerTransaction | None = None
        """The ledger as the broker's view showed it, until this host asks the broker for a
        change: :meth:`snapshot` then asks again."""
        self._view: HostView | None = None
        self._ledger_file: Path | None = None

    @classmethod
    def open(
        cls,
        socket: Path,
        *,
        full: bool = True,
        answer_s: float | None = None,
        reconnect_s: float | None = None,
    ) -> BrokeredHost:
        """The host as the broker at ``socket`` sees it (``full``: with its ledger, processes
        and faults, asked for now; else the topology alone, asked for when it is read);
        ``answer_s``: how long to wait for the broker to say anything
        (``host.broker_timeout``); ``reconnect_s``: how long to try again for a broker that
        went away (None: :data:`gpualloc.wire.client.RECONNECT_S`)."""
        client = BrokerClient(socket, answer_s=answer_s, reconnect_s=reconnect_s)
        host = cls(socket, client, full=full)
        if full:
            host.view()
        return host

    def view(self) -> HostView:
        """The broker's view of the host (its topology; with :attr:`full`, its processes,
        faults and ledger too), asked for once."""
        if self._view is None:
            from gpualloc.discovery.processes import ProcessReport
            from gpualloc.host.view import HostView
            from gpualloc.model.topology import GpuFault, Topology
            from gpualloc.model.validation import from_builtins

            seen = _view(self.client, full=self.full)
            view = HostView(
                topology=from_builtins(seen["topology"], Topology),
                processes=from_builtins(seen.get("processes") or {}, ProcessReport),
                this_host=bool(seen["this_host"]),
            )
            if self.full:
                self.served = served_snapshot(seen)
                view.faults = from_builtins(seen["faults"], list[GpuFault])
                view.health_notes = list(seen["health_notes"])
            self._view = view
        return self._view

    @property
    def topology(self) -> Topology:
        return self.view().topology

    @property
    def processes(self) -> ProcessReport:
        return self.view().processes

    @property
    def this_host(self) -> bool:
        return self.view().this_host

    @property
    def faults(self) -> list[GpuFault]:
        return self.view().faults

    @property
    def health_notes(self) -> list[str]:
        return self.view().health_notes

    @property
    def opening_notes(self) -> list[str]:
        """The notes of the processes' discovery, which the broker's view holds when
        :attr:`full` (none are asked for otherwise)."""
        return list(self.processes.notes) if self.full else []

    def occupancy(
        self,
        ledger: Ledger,
        *,
        allow_unhealthy: bool | None = None,
        ignore_foreign: bool | None = None,
    ) -> Occupancy:
        if allow_unhealthy is None:
            allow_unhealthy = self.allow_unhealthy
        if ignore_foreign is None:
            ignore_foreign = self.ignore_foreign
        return self.view().occupancy(
            ledger, allow_unhealthy=allow_unhealthy, ignore_foreign=ignore_foreign
        )

    def leased_share(self, request: ShareRequest, gpu: int, mode: ShareMode) -> LeasedShare:
        return self.view().leased_share(request, gpu, mode)

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

    def start_time_limit_watch(self, grant: Grant, *, here: bool = False) -> None:
        """Nothing: the broker keeps every lease's time limit itself, as root
        (:mod:`gpualloc.broker.overdue`)."""

    def start_verifier(self, grant: Grant, terms: VerifyTerms, look: object = None) -> None:
        """Fork the verifier of this process, about to exec the job; it asks the broker where
        processes run (:mod:`gpualloc.launcher.verify_brokered`), so ``look`` is not used."""
        from gpualloc.launcher.verify_brokered import start_verifier

        record = grant.record
        if not isinstance(record, dict):  # a Lease (a grant of the embedded ledger's making)
            from gpualloc.model.validation import to_builtins

            record = to_builtins(record)
        start_verifier(self.socket, record, terms.grace_s, terms.action)

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
        from gpualloc.host.terms import Allocation
        from gpualloc.ledger.schema import Lease
        from gpualloc.model.request import Placement
        from gpualloc.model.validation import from_builtins

        result = self._alloc(sent_options(want), terms, wait, report, allow_unhealthy, None)
        return Allocation(
            from_builtins(result["lease"], Lease),
            from_builtins(result["placement"], Placement),
            None,
            list(result.get("notes", [])),
        )

    def start(
        self,
        job: JobFields,
        terms: LeaseTerms,
        *,
        config: Config,
        wait: WaitOptions | None = None,
        report: Callable[[WaitStatus], None] | None = None,
        uuid: bool = False,
    ) -> Grant:
        """The broker places, records and answers with what the launch needs: no topology is
        read here. A ``--pattern`` file is read here, with this user's rights, and sent as its
        edges (the broker opens no file a client names)."""
        from gpualloc.job_options import PATTERN_NAMES

        if job.get("pattern", "ring") in PATTERN_NAMES:
            options: dict[str, Any] = {k: v for k, v in job.items() if v is not None}
        else:
            from gpualloc.model.job import JobOptions
            from gpualloc.placement.options import want_of

            options = sent_options(want_of(JobOptions(**job), config))
        views = {"uuid": uuid}
        return grant_from_answer(self._alloc(options, terms, wait, report, None, views))

    def _alloc(
        self,
        options: dict[str, Any],
        terms: LeaseTerms,
        wait: WaitOptions | None,
        report: Callable[[WaitStatus], None] | None,
        allow_unhealthy: bool | None,
        views: dict[str, Any] | None,
    ) -> dict[str, Any]:
        """One ``alloc`` request: the job's one encoding (``options``), the lease's terms, the
        wait, and the ``views`` a :class:`Grant` is made of."""
        if terms.lease_id is not None:
            lease_id = terms.lease_id
        else:
            import os

            lease_id = os.urandom(6).hex()  # as gpualloc.ledger.store.new_lease_id
        args: dict[str, Any] = {
            "lease_id": lease_id,
            "options": options,
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
                "time_limit_s": terms.time_limit_s,
                "signal": None if terms.signal is None else list(terms.signal),
            },
            "allow_unhealthy": self.allow_unhealthy if allow_unhealthy is None else allow_unhealthy,
            "wait": None,
        }
        if views is not None:
            args["views"] = views
        on_event = None
        if wait is not None:
            args["wait"] = {
                "timeout_s": wait.timeout_s,
                "priority": wait.priority,
                "max_bypass": wait.max_bypass,
            }
            if report is not None:
                on_event = _reporter(report)
        result: dict[str, Any] = self._call("alloc", args, on_event=on_event)
        return result

    def hang_up(self) -> None:
        """Close the connection (a later request opens another): the broker watches the
        job's process, and the verifier about to be forked makes its own."""
        self.client.close()

    def confirm(self, lease_id: str) -> None:
        self._call("confirm", {"lease": lease_id})

    def release(self, lease_id: str) -> None:
        """Quietly: what the broker answers is not read (a job that could not start gives
        its lease back on the way out, decoding nothing)."""
        self._call("release", {"leases": [lease_id]})

    def adopt(self, lease_id: str, pid: int) -> None:
        self._call("adopt", {"lease": lease_id, "pid": pid})

    def exited(self, lease_id: str, status: int, *, cancelled: bool = False) -> None:
        self._call("exited", {"lease": lease_id, "status": status, "cancelled": cancelled})

    def release_leases(
        self, selectors: Iterable[str], *, mine: bool = False, include_running: bool = False
    ) -> ReleaseResult:
        args = {"leases": list(selectors), "mine": mine, "include_running": include_running}
        return _release_result(self._call("release", args))

    def release_receipt(
        self, selectors: Iterable[str], *, mine: bool = False, include_running: bool = False
    ) -> Receipt:
        """The broker's words and views of what it released: no lease is decoded here."""
        from gpualloc.host.receipt import receipt_from_answer

        args = {"leases": list(selectors), "mine": mine, "include_running": include_running}
        return receipt_from_answer(self._call("release", args))

    def evict(
        self, selectors: Iterable[str], *, mine: bool = False, grace_s: float | None = None
    ) -> ReleaseResult:
        """``release --evict-shared``: the shared jobs marked (their watchers end them)."""
        args = {"leases": list(selectors), "mine": mine, "grace_s": grace_s}
        return _release_result(self._call("evict", args))

    def collect_garbage(self, idle: IdlePolicy | None = None) -> GarbageReport:
        """The broker's own idle policy applies (``idle`` is the embedded ledger's)."""
        from datetime import timedelta

        from gpualloc.host.terms import GarbageReport
        from gpualloc.ledger.idle import Expiry
        from gpualloc.ledger.schema import Lease, Waiter
        from gpualloc.model.validation import from_builtins

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
    from gpualloc.model.validation import to_builtins

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
    from gpualloc.host.terms import ReleaseResult
    from gpualloc.ledger.schema import Lease
    from gpualloc.model.validation import from_builtins
    from gpualloc.wire.protocol import error_from

    return ReleaseResult(
        released=[from_builtins(lease, Lease) for lease in result["released"]],
        problems=[error_from({"error": problem}) for problem in result["problems"]],  # type: ignore[misc]
        kept=[from_builtins(lease, Lease) for lease in result.get("kept", [])],  # older: none
    )


def served_snapshot(view: dict[str, Any]) -> LedgerTransaction:
    """The ledger of a broker's snapshot, as :meth:`BrokeredHost.snapshot` returns it."""
    from gpualloc.ledger.schema import Ledger
    from gpualloc.ledger.store import LedgerTransaction
    from gpualloc.model.validation import from_builtins

    return LedgerTransaction(from_builtins(view["ledger"], Ledger), notes=list(view["notes"]))


def _reporter(report: Callable[[WaitStatus], None]) -> Callable[[dict[str, Any]], None]:
    def event(status: dict[str, Any]) -> None:
        from gpualloc.host.terms import WaitStatus
        from gpualloc.model.validation import from_builtins

        with contextlib.suppress(Exception):  # a courtesy: never the end of the wait
            report(from_builtins(status, WaitStatus))

    return event
