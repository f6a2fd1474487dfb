"""What each broker request does to the ledger, for the user the kernel named.

The broker keeps the host's :class:`~gpualloc.host.local.LocalHost` open, with a store
it owns (:mod:`gpualloc.ledger.store`, ``owner=True``), so every request runs the same
transactions as the embedded ledger, placement inside the lock included. What differs is who
the lease belongs to and what it lives with: the peer's uid, and a pid the kernel says is
theirs (:mod:`.peers`), watched by the broker (:mod:`.watch`).

Every argument from a client is checked as if hostile: the request is decoded into the
ledger's own validated :class:`~gpualloc.ledger.schema.QueuedRequest`, strings are bounded,
and a client may only name its own processes and release its own leases (root any).

``alloc`` is idempotent on its lease id: a client whose connection broke (a broker restart)
sends the request again and gets the lease the first one made, never a second lease.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from msgspec import Struct

from gpualloc.broker import requests as wire
from gpualloc.broker.answers import placement_of, release_answer
from gpualloc.broker.fair_share import FairShare
from gpualloc.broker.overdue import Overdue
from gpualloc.broker.peers import Peer, check_owned
from gpualloc.broker.watch import ProcessWatch
from gpualloc.config import Config
from gpualloc.durations import seconds_given
from gpualloc.errors import GpuallocError, NoSuchLease, NotPermitted, RequestError
from gpualloc.host.backfill import Backfill
from gpualloc.host.ending import adopted
from gpualloc.host.grant import grant_answer, grant_of
from gpualloc.host.launching import check_before_placing
from gpualloc.host.lease_terms import LeaseTerms
from gpualloc.host.local import LocalHost, taken_id
from gpualloc.host.queue import (
    Attempt,
    AttemptMemo,
    attempts,
    backfill_of,
    blocked_by_own,
    new_waiter,
    next_start,
    walk,
)
from gpualloc.host.queue_policy import QueuePolicy
from gpualloc.host.terms import Allocation
from gpualloc.ledger.occupancy import Occupancy
from gpualloc.ledger.owned_store import OwnedLedgerStore
from gpualloc.ledger.schema import Waiter
from gpualloc.ledger.statedir import StateDirectory
from gpualloc.ledger.store import LedgerTransaction, lease_alive
from gpualloc.model.validation import to_builtins
from gpualloc.placement.want import Want
from gpualloc.user_files import shown_repr

FAIR_SHARE_FILE = "fair-share.json"
RECONNECT_GRACE_S = 15.0
"""How long the queue entries of waiting clients outlive a broker restart, for the clients to
come back to (they keep their place); then they are dropped."""

MAX_REMEMBERED_PLACEMENTS = 4096
"""Remembered waiter placements (:attr:`LedgerService.placements`) before they are forgotten
all at once: each is a request and a host state, a few KB."""


class Pending(Struct):
    """A waiting client's request, while its waiter is in the ledger's queue."""

    want: Want
    terms: LeaseTerms
    deadline: float | None
    started: float
    views: dict[str, Any] | None = None
    allow_unhealthy: bool = False
    """The client asked for unhealthy GPUs too (``--allow-unhealthy``): its turn is placed so."""


class Started(Struct):
    """A waiter's turn: its allocation and answer, or the error that ended its wait (a failed
    turn drops and tells only its own waiter, never the queue behind it)."""

    waiter_id: str
    allocation: Allocation | None
    answer: dict[str, Any]
    error: GpuallocError | None = None


class LedgerService:
    """The broker's ledger: one host, its watch and its users' fair share."""

    def __init__(
        self, host: LocalHost, policy: QueuePolicy, fair: FairShare, config: Config
    ) -> None:
        self.host = host
        host.placement_memo = {}  # one search per request and host state, for every user
        self.config = config
        """The broker's configuration (the system file): clients' job options are read with
        it, their own settings (the policy) already applied."""
        self.policy = policy
        self.fair = fair
        self.watch = ProcessWatch()
        self.pending: dict[str, Pending] = {}
        self.overdue = Overdue()
        self.placements = AttemptMemo()
        """Where each waiting request would start, by request and host state: a turn places
        a waiter again only when the host has changed, so a long queue costs one search a
        change, not one a turn."""
        self.new_fds: list[tuple[int, str]] = []
        """pidfds of leases made since the loop last looked, for it to register."""
        self.old_fds: list[int] = []
        """pidfds of leases gone, for the loop to unregister and close."""
        self.topology_file: Path | None = None
        """The recorded topology file the broker serves, when it is one (not this host)."""
        self.orphans_until = time.monotonic() + RECONNECT_GRACE_S
        self._topology_builtins: Any = None
        store = host.ledger_store()
        assert isinstance(store, OwnedLedgerStore), "the broker's ledger is its own"
        self.store = store
        store.alive = self._alive
        store.gpu_processes = lambda: self.host.processes.processes

    def _follow(self, allocation: Allocation) -> Allocation:
        """Watch the new lease's process (its pidfd goes to :attr:`new_fds`)."""
        lease = allocation.lease
        if lease.pid is not None:
            fd = self.watch.watch(lease.id, lease.pid, lease.pid_start_time)
            if fd is not None:
                self.new_fds.append((fd, lease.id))
        if lease.process_group is not None:
            self.watch.watch_group(lease.id, lease.process_group)
            if lease.process_group_start is not None:  # a job its holder forked: a member
                fd = self.watch.watch(lease.id, lease.process_group, lease.process_group_start)
                if fd is not None:
                    self.new_fds.append((fd, lease.id))
        return allocation

    def _alive(self, lease: Any, directory: StateDirectory) -> bool:
        return lease_alive(lease, directory, self.watch.group_member) or self.watch.alive(lease.id)

    # ---- start-up ------------------------------------------------------------------------

    def adopt(self) -> list[str]:
        """After a (re)start: follow every live lease's process again, as the ledger records
        it; dead ones are released by this first transaction (their ids are returned). The
        users' fair share is read back (:meth:`.fair_share.FairShare.load`)."""
        self.fair.load(self.fair_share_file)
        with self.store.transaction(reap=True) as txn:
            for lease in txn.ledger.leases:
                self._follow(Allocation(lease, placement_of(lease)))
            self.fair.account(txn.ledger.leases)
        return [lease.id for lease in txn.reaped]

    def end_overdue(self) -> list[str]:
        """Signal the jobs past their time limits (:mod:`.overdue`); the log's lines."""
        leases = self.host.snapshot().ledger.leases
        members = lambda lease_id: self.watch.members.get(lease_id, ())  # noqa: E731
        return self.overdue.look(leases, self.host.time_rules.kill_wait_s, members)

    # ---- requests ------------------------------------------------------------------------

    def alloc(self, peer: Peer, args: dict[str, Any]) -> tuple[Allocation, dict[str, Any]] | str:
        """Allocate now, or queue (``args["wait"]``): the allocation and its answer, or the
        waiter's id. The job is ``args["options"]``, its one encoding: the JobOptions a client's
        Want is made of (:class:`gpualloc.host.brokered.BrokeredHost`); with ``args["views"]``
        the answer carries its :class:`~gpualloc.host.grant.Grant`, what the client prints and
        execs with."""
        lease_id = wire.lease_id(args.get("lease_id"))
        want = wire.options_want(args.get("options"), self.config)
        terms = self._terms(peer, args.get("terms"), lease_id)
        wait, views = args.get("wait"), wire.views_asked(args.get("views"))
        uuid = views is not None and bool(views.get("uuid"))
        check_before_placing(self.host.topology, want, terms.memory_bytes, uuid=uuid)
        if args.get("retry"):
            with self.host.transaction() as txn:
                found = self._repeat(peer, txn, lease_id)
            if isinstance(found, Allocation):
                return found, self.answer(found, want, views)
            if found is not None and wait is not None:
                self.pending[found] = self._pending(want, terms, wait, views, args)
                return found
        if wait is None:
            lenient = bool(args.get("allow_unhealthy"))
            made = self._follow(self.host.allocate(want, terms, allow_unhealthy=lenient))
            return made, self.answer(made, want, views)
        return self._enqueue(peer, want, terms, wait, views, args)

    def answer(
        self, allocation: Allocation, want: Want, views: dict[str, Any] | None
    ) -> dict[str, Any]:
        """What the client gets for an allocation (with ``views``: its grant, computed here so
        that the client needs neither the topology nor the models)."""
        found: dict[str, Any] = {
            "lease": to_builtins(allocation.lease),
            "placement": to_builtins(allocation.placement),
            "notes": list(allocation.notes),
        }
        if views is None:
            return found
        grant = grant_of(
            self.host.topology, allocation, want, uuid=bool(views.get("uuid")),
            this_host=self.host.this_host,
        )  # fmt: skip
        return found | grant_answer(grant)

    def _repeat(self, peer: Peer, txn: LedgerTransaction, lease_id: str) -> Allocation | str | None:
        """What a request with this id made before (a client sending it again)."""
        lease = txn.ledger.find(lease_id)
        if lease is not None:
            if lease.uid != peer.uid:
                raise NotPermitted(
                    f"lease id {lease_id} is another user's", hint="let gpualloc choose ids"
                )
            return Allocation(lease, placement_of(lease))
        waiter = txn.ledger.waiter(lease_id)
        if waiter is not None:
            if waiter.uid != peer.uid:
                raise NotPermitted(f"waiter id {lease_id} is another user's")
            return waiter.id
        return None

    def _enqueue(
        self,
        peer: Peer,
        want: Want,
        terms: LeaseTerms,
        wait: Any,
        views: dict[str, Any] | None,
        args: dict[str, Any],
    ) -> str:
        from gpualloc.host.wait import never_fits

        options = wire.wait_options(wait, self.policy)
        never_fits(self.host, want)
        assert terms.lease_id is not None
        with self.host.transaction() as txn:
            self.policy.admit(
                uid=peer.uid,
                priority=options.priority,
                max_bypass=options.max_bypass,
                queue=txn.ledger.queue,
            )
            taken_id(txn, terms.lease_id)
            started = check_owned(peer, peer.pid)
            waiter = new_waiter(
                terms.lease_id, want, terms, options, waiting=(peer.uid, peer.pid, started)
            )
            txn.enqueue(waiter)
        self.pending[waiter.id] = self._pending(want, terms, wait, views, args)
        return waiter.id

    def _pending(
        self,
        want: Want,
        terms: LeaseTerms,
        wait: Any,
        views: dict[str, Any] | None,
        args: dict[str, Any],
    ) -> Pending:
        timeout = (
            wire.duration(wait.get("timeout_s"), "timeout") if isinstance(wait, dict) else None
        )
        now = time.monotonic()
        deadline = now + timeout if timeout is not None else None
        return Pending(
            want, terms, deadline, now, views, allow_unhealthy=bool(args.get("allow_unhealthy"))
        )

    def _terms(self, peer: Peer, raw: Any, lease_id: str) -> LeaseTerms:
        if not isinstance(raw, dict):
            raise RequestError("the request has no lease terms", hint="see gpualloc.broker")
        source = raw.get("source", "alloc")
        if source not in ("run", "alloc", "submit") and not (source == "slurm" and peer.root):
            raise NotPermitted(f"a lease of source {shown_repr(source)} is root's to make")
        pid, hold = raw.get("pid"), bool(raw.get("hold"))
        started = None
        if pid is not None:
            if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
                raise RequestError(
                    f"pid {shown_repr(pid)} is not a process id", hint="give a positive pid"
                )
            started = check_owned(peer, pid)
        elif not hold:
            raise RequestError("a lease needs a pid or hold", hint="give --pid or --hold")
        group = raw.get("process_group")
        if group is not None and (group != pid or wire.group_of(pid) != pid):
            group = None  # only a process that leads its own group lends the lease its group
        try:
            terms = LeaseTerms(
                source=source,
                pid=pid,
                pid_start_time=started,
                hold=hold,
                command=wire.words(raw.get("command", ())),
                name=wire.text(raw.get("name"), "name"),
                process_group=group,
                announce=bool(raw.get("announce")),
                shareable=bool(raw.get("shareable")),
                memory_bytes=wire.positive(raw.get("memory_bytes")),
                share_mode="mps" if raw.get("share_mode") == "mps" else "time-sliced",
                uid=peer.uid,
                creator=(peer.pid, started if pid == peer.pid else check_owned(peer, peer.pid)),
                lease_id=lease_id,
                time_limit_s=seconds_given(raw.get("time_limit_s"), "time_limit_s"),
                signal=wire.lease_signal(raw.get("signal")),
            )
        except (TypeError, ValueError) as bad:
            raise RequestError(f"bad lease terms: {bad}", hint="see gpualloc.broker") from None
        self.host.time_rules.grant(terms)  # the broker's own system file: exit 12 at its door
        return terms

    def confirm(self, peer: Peer, args: dict[str, Any]) -> None:
        lease_id = wire.lease_id(args.get("lease"))
        with self.host.transaction() as txn:
            lease = txn.ledger.find(lease_id)
            if lease is None:
                return  # released already (as the embedded ledger's confirm, quietly)
            if lease.uid != peer.uid and not peer.root:
                raise NotPermitted(f"lease {lease_id} belongs to {lease.user}")
        self.host.confirm(lease_id)

    def release(self, peer: Peer, args: dict[str, Any]) -> dict[str, Any]:
        result = self.host.release_leases(
            wire.selectors(args),
            mine=bool(args.get("mine")),
            include_running=bool(args.get("include_running")),
            uid=peer.uid,
        )
        problems = result.problems
        if args.get("retry"):  # a repeat of a release that went through already
            problems = [p for p in problems if not isinstance(p, NoSuchLease)]
        for lease in result.released:
            self.forget(lease.id)
        return release_answer(result, problems)

    def adopt_job(self, peer: Peer, args: dict[str, Any]) -> str:
        """A lease's holder has forked its job (``pid``, leading a group of its own): the
        watch follows it now, not at its next pass, so the holder killed at once leaves the
        lease to its job (and its limit to the broker)."""
        lease_id = wire.lease_id(args.get("lease"))
        pid = args.get("pid")
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
            raise RequestError(f"pid {shown_repr(pid)} is not a process id")
        started = check_owned(peer, pid)
        with self.host.transaction() as txn:
            lease = adopted(txn.ledger.find(lease_id), lease_id, pid, uid=peer.uid)
            if lease is None:
                return f"lease {lease_id}: process {pid} not bound (ended, or bound already)"
            txn.replace(lease)
        fd = self.watch.watch(lease_id, pid, started)
        if fd is not None:
            self.new_fds.append((fd, lease_id))
        self.watch.watch_group(lease_id, pid)
        return f"lease {lease_id} lives with its job's process group {pid}"

    def exited(self, peer: Peer, args: dict[str, Any]) -> str:
        """A submitted job's supervisor says its job exited, with what status: the lease ends,
        and its history record keeps the status. Its owner's or root's word alone."""
        lease_id, status = wire.lease_id(args.get("lease")), wire.exit_status(args.get("status"))
        lease = self.host.snapshot().ledger.find(lease_id)
        if lease is None:
            return f"uid {peer.uid}: exited of lease {lease_id}, which has ended already"
        running = self.watch.alive(lease_id, but=lease.pid)  # a job's escaped descendants
        cancelled = args.get("cancelled") is True
        self.host.exited(lease_id, status, cancelled=cancelled, uid=peer.uid, running=running)
        if running:
            return f"lease {lease_id}: its job exited ({status}); it lives while its rest runs"
        self.forget(lease_id)
        return f"lease {lease_id} released: its job exited ({status})"

    def evict(self, peer: Peer, args: dict[str, Any]) -> dict[str, Any]:
        """``release --evict-shared``: mark the shared jobs for their watchers."""
        grace = wire.duration(args.get("grace_s"), "grace")
        result = self.host.evict(
            wire.selectors(args),
            mine=bool(args.get("mine")),
            grace_s=grace,
            uid=peer.uid,
        )
        return release_answer(result, None)

    def snapshot(self, args: dict[str, Any]) -> dict[str, Any]:
        """The host as the broker sees it; without ``full``, its topology alone."""
        host = self.host
        if not args.get("full", True):
            return {"topology": self._topology(), "this_host": host.this_host}
        txn = host.snapshot()
        return {
            "topology": self._topology(),
            "ledger": to_builtins(txn.ledger),
            "notes": txn.notes,
            "processes": to_builtins(host.processes),
            "faults": to_builtins(host.faults),
            "health_notes": host.health_notes,
            "this_host": host.this_host,
            "state_dir": str(host.ledger_store().directory.path),
            "fair_share": {str(uid): list(v) for uid, v in self.fair.standing().items()},
        }

    def _topology(self) -> Any:
        if self._topology_builtins is None:
            self._topology_builtins = to_builtins(self.host.topology)
        return self._topology_builtins

    def gc(self, idle: Any) -> dict[str, Any]:
        report = self.host.collect_garbage(idle)
        for lease in report.reaped:
            self.forget(lease.id)
        return {
            "reaped": to_builtins(report.reaped),
            "dropped_waiters": to_builtins(report.dropped_waiters),
            "removed_lock_files": report.removed_lock_files,
            "removed_temporary_files": report.removed_temporary_files,
            "notes": report.notes,
            "expiries": [
                {
                    "lease": to_builtins(e.lease),
                    "event": e.event,
                    "idle_s": e.idle.total_seconds(),
                }
                for e in report.expiries
            ],
        }

    # ---- what the loop does --------------------------------------------------------------

    def refresh_processes(self) -> None:
        """Where processes run now: NVML on this host; on a recorded topology file, what the
        file declares now (so a recorded host can be watched as a real one is)."""
        if self.topology_file is None:
            self.host.refresh_processes()
            return
        from gpualloc.discovery.processes import declared_processes
        from gpualloc.discovery.recorded import load_topology_file

        self.host.processes = declared_processes(load_topology_file(self.topology_file))

    def forget(self, lease_id: str) -> None:
        self.old_fds += self.watch.forget(lease_id)

    def reap(self) -> list[str]:
        """One transaction: dead leases released, dead waiters dropped (their ids)."""
        with self.store.transaction(reap=True) as txn:
            self.fair.account(txn.ledger.leases)
            orphans = [
                w.id
                for w in txn.ledger.queue
                if w.id not in self.pending and time.monotonic() > self.orphans_until
            ]
            for waiter_id in orphans:
                txn.dequeue(waiter_id)
        gone = [lease.id for lease in txn.reaped]
        for lease_id in gone:
            self.forget(lease_id)
        self.fair.save(self.fair_share_file)
        return gone

    @property
    def fair_share_file(self) -> Path:
        return self.store.directory.path / FAIR_SHARE_FILE

    def leave(self, waiter_id: str) -> None:
        """A waiting client went away, or its time ran out: out of the queue."""
        self.pending.pop(waiter_id, None)
        with self.host.transaction() as txn:
            txn.dequeue(waiter_id)

    def _attempts(
        self, txn: LedgerTransaction, occupancy: Occupancy
    ) -> Callable[[Waiter], Attempt]:
        """Where each waiter would start now: on healthy GPUs (``occupancy``), or on any for a
        client that asked for unhealthy ones too."""
        topology, budget = self.host.topology, self.host.placement_budget_s
        if len(self.placements) > MAX_REMEMBERED_PLACEMENTS:
            self.placements.clear()
        healthy = attempts(topology, occupancy, self.placements, budget_s=budget)
        if not any(pending.allow_unhealthy for pending in self.pending.values()):
            return healthy
        any_health = attempts(
            topology,
            self.host.occupancy(txn.ledger, allow_unhealthy=True),
            self.placements,
            budget_s=budget,
        )

        def attempt(waiter: Waiter) -> Attempt:
            pending = self.pending.get(waiter.id)
            lenient = pending is not None and pending.allow_unhealthy
            return (any_health if lenient else healthy)(waiter)

        return attempt

    def _backfill(self, occupancy: Occupancy, attempt: Callable[[Waiter], Attempt]) -> Backfill:
        topology, budget = self.host.topology, self.host.placement_budget_s
        return backfill_of(topology, occupancy, attempt, budget_s=budget)

    def turns(self) -> list[Started]:
        """Start every waiter whose turn it is, in one transaction (fair-share order)."""
        if not self.pending:
            return []
        started: list[Started] = []
        with self.host.transaction() as txn:
            self.fair.account(txn.ledger.leases)
            while True:
                queue = [w for w in txn.ledger.queue if w.id in self.pending]
                occupancy = self.host.occupancy(txn.ledger)  # once a turn, for both questions
                attempt = self._attempts(txn, occupancy)
                turn = next_start(
                    queue,
                    attempt,
                    order_of=self.fair.order,
                    self_blocked=blocked_by_own(occupancy),
                    backfill=self._backfill(occupancy, attempt),
                )
                if turn is None or turn.waiter is None or turn.placement is None:
                    break
                waiter = txn.dequeue(turn.waiter.id)
                txn.count_passed_over(turn.passed)
                pending = self.pending[turn.waiter.id]
                waited = (
                    (datetime.now(timezone.utc) - waiter.created).total_seconds() if waiter else 0
                )
                try:
                    allocation = self.host.record(
                        txn, turn.placement, pending.want, pending.terms, waited_s=waited
                    )
                except GpuallocError as problem:  # out of the queue, and only it is told
                    started.append(Started(turn.waiter.id, None, {}, error=problem))
                    continue
                answer = self.answer(allocation, pending.want, pending.views)
                started.append(Started(turn.waiter.id, allocation, answer))
                self.fair.account(txn.ledger.leases)  # who holds what now
        for start in started:
            self.pending.pop(start.waiter_id, None)
            if start.allocation is not None:
                self._follow(start.allocation)
        return started

    def positions(self) -> dict[str, dict[str, Any]]:
        """Where each waiting client stands, for its status line."""
        from gpualloc.host.terms import WaitStatus
        from gpualloc.host.wait import who_holds

        txn = self.host.snapshot()
        queue = [w for w in txn.ledger.queue if w.id in self.pending]
        occupancy = self.host.occupancy(txn.ledger)
        attempt = attempts(
            self.host.topology, occupancy, self.placements, budget_s=self.host.placement_budget_s
        )
        holders = who_holds(occupancy)
        blocked = blocked_by_own(occupancy)
        found = {}
        for turn in walk(
            self.fair.order(queue),
            attempt,
            self_blocked=blocked,
            backfill=self._backfill(occupancy, attempt),
        ):
            waiter = turn.waiter
            assert waiter is not None
            status = WaitStatus(
                position=turn.position,
                queue_length=len(queue),
                reason=turn.reason or "starting",
                holders=holders,
                waited_s=time.monotonic() - self.pending[waiter.id].started,
            )
            found[waiter.id] = {**to_builtins(status), "line": status.line()}
        return found

    def expired(self) -> list[tuple[str, float]]:
        """The waiters whose ``--timeout`` ran out, each with its timeout."""
        now = time.monotonic()
        return [
            (i, p.deadline - p.started)
            for i, p in self.pending.items()
            if p.deadline is not None and now >= p.deadline
        ]

    def next_deadline(self) -> float | None:
        """When the first waiter's ``--timeout`` runs out (the loop wakes for it)."""
        return min((p.deadline for p in self.pending.values() if p.deadline), default=None)
