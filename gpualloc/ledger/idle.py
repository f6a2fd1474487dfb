"""Idle holders: leases whose GPUs nobody uses, and how long for.

A lease is *busy* at a look when a kernel ran on any of its GPUs for at least
``idle.busy_percent`` of NVML's last sample period (``nvmlDeviceGetUtilizationRates``; a
recorded topology declares ``utilization``). Memory in use does not make it busy: a notebook
that holds 70 GB and computes nothing is the idle holder people ask about.

One look says nothing about the hours before it, so idleness is a *stretch of looks*: the
lease's ``activity`` records when the current idle stretch began and when it was last looked at,
and a stretch survives only while looks are at most ``idle.max_gap`` apart (a longer gap starts
a new one: nobody saw what happened in it). ``gpualloc gc`` looks and records (run it every few
minutes from cron or a systemd timer); ``status`` extends the record with its own look without
writing it. A lease that was never looked at before is idle since it was made, when that was
within ``max_gap`` of the look.

With ``idle.expire_holds`` in the system configuration, ``gc`` gives a ``--hold`` lease idle
for that long (less ``idle.notice``) notice: ``expires_at``, shown by ``status``, and the
``idle.notify`` command, run with the lease in its environment; when its GPUs are still idle
at ``expires_at``, ``gc`` releases it. Any use of its GPUs withdraws the notice.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, NamedTuple

from msgspec import Struct
from msgspec.structs import replace

from gpualloc.config import DEFAULT_BUSY_PERCENT, DEFAULT_MAX_GAP_S, DEFAULT_NOTICE_S

if TYPE_CHECKING:  # status and metrics load this module: keep the ledger schema out of it
    from gpualloc.config import Config
    from gpualloc.ledger.schema import Lease, LeaseActivity
    from gpualloc.ledger.store import LedgerTransaction


class IdlePolicy(Struct, frozen=True):
    """The system configuration's ``[idle]`` table."""

    busy_percent: int = DEFAULT_BUSY_PERCENT
    max_gap_s: float = DEFAULT_MAX_GAP_S
    expire_holds_s: float | None = None
    """Release ``--hold`` leases idle this long (None: never)."""
    notice_s: float = DEFAULT_NOTICE_S
    notify: str | None = None
    """A shell command run for each notice and expiry (see :func:`notify_environment`)."""

    @classmethod
    def from_config(cls, config: Config) -> IdlePolicy:
        """The ``[idle]`` table of the system file: only the administrator sets it."""
        return cls(
            busy_percent=config.system_value("idle.busy_percent"),
            max_gap_s=config.system_value("idle.max_gap"),
            expire_holds_s=config.system_value("idle.expire_holds"),
            notice_s=config.system_value("idle.notice"),
            notify=config.system_value("idle.notify"),
        )


def lease_busy(lease: Lease, utilization: Mapping[int, int], busy_percent: int) -> bool | None:
    """Whether any of the lease's whole GPUs is busy now; None when none has a figure (MIG
    devices have none, and a host without NVML gives none)."""
    figures = [utilization[g] for g in lease.indices if g in utilization]
    if not figures:
        return None
    return max(figures) >= max(1, busy_percent)


def observe(
    lease: Lease, busy: bool | None, now: datetime, policy: IdlePolicy
) -> LeaseActivity | None:
    """The lease's activity after a look at ``now`` that found it ``busy`` (None: could not
    tell, so nothing changes)."""
    from gpualloc.ledger.schema import LeaseActivity

    previous = lease.activity
    if busy is None:
        return previous
    if busy:
        return LeaseActivity(observed_at=now)
    gap = timedelta(seconds=policy.max_gap_s)
    if (
        previous is not None
        and previous.idle_since is not None
        and now - previous.observed_at <= gap
    ):
        return replace(previous, observed_at=now)  # the stretch goes on
    if previous is None and now - lease.created <= gap:
        return LeaseActivity(observed_at=now, idle_since=lease.created)
    return LeaseActivity(observed_at=now, idle_since=now)


def idle_for(activity: LeaseActivity | None, now: datetime) -> timedelta | None:
    """How long the GPUs have been idle (None: busy, or never looked at)."""
    if activity is None or activity.idle_since is None:
        return None
    return max(timedelta(0), now - activity.idle_since)


class LeaseUse(NamedTuple):
    """How a lease uses its GPUs at one look."""

    busy: bool | None
    idle: timedelta | None
    activity: LeaseActivity | None
    """The recorded activity extended by this look."""


def lease_uses(
    leases: Iterable[Lease], utilization: Mapping[int, int], policy: IdlePolicy, now: datetime
) -> dict[str, LeaseUse]:
    """Lease id -> its use at a look at ``now`` that is not recorded (``status``, ``metrics``)."""
    uses = {}
    for lease in leases:
        busy = lease_busy(lease, utilization, policy.busy_percent)
        activity = observe(lease, busy, now, policy)
        uses[lease.id] = LeaseUse(busy, idle_for(activity, now), activity)
    return uses


class Expiry(Struct, frozen=True):
    """What a look did to a ``--hold`` lease under ``idle.expire_holds``."""

    lease: Lease
    event: str
    """``notice`` (``expires_at`` set) or ``expired`` (released)."""
    idle: timedelta


def judge(
    lease: Lease, activity: LeaseActivity | None, now: datetime, policy: IdlePolicy
) -> tuple[LeaseActivity | None, Expiry | None]:
    """The activity to record, and a notice or an expiry, for a look at ``now``."""
    idle = idle_for(activity, now)
    if policy.expire_holds_s is None or not lease.hold or activity is None or idle is None:
        return activity, None
    limit = timedelta(seconds=policy.expire_holds_s)
    notice = timedelta(seconds=policy.notice_s)
    if activity.expires_at is not None:
        if now >= activity.expires_at:
            return activity, Expiry(lease, "expired", idle)
        return activity, None
    if idle < limit - notice:
        return activity, None
    assert activity.idle_since is not None
    expires = max(now + notice, activity.idle_since + limit)
    noticed = replace(activity, expires_at=expires)
    return noticed, Expiry(replace(lease, activity=noticed), "notice", idle)


def record_look(
    txn: LedgerTransaction, utilization: Mapping[int, int], policy: IdlePolicy, now: datetime
) -> list[Expiry]:
    """Record a look at ``now`` in every lease of ``txn`` (``gc``): extend or end its idle
    stretch, give notice, release a ``--hold`` whose notice ran out; the notices and expiries.
    A lease with no utilisation figure is left as it was: no news, and never an expiry."""
    expiries = []
    for lease in list(txn.ledger.leases):
        busy = lease_busy(lease, utilization, policy.busy_percent)
        if busy is None:
            continue
        activity, expiry = judge(lease, observe(lease, busy, now, policy), now, policy)
        if expiry is not None:
            expiries.append(expiry)
            if expiry.event == "expired":
                txn.remove(lease.id)
                continue
        if activity != lease.activity:
            txn.replace(replace(lease, activity=activity))
    return expiries


def notify_environment(expiry: Expiry) -> dict[str, str]:
    """What ``idle.notify`` finds in its environment."""
    from gpualloc.ledger.occupancy import held_devices

    lease = expiry.lease
    activity = lease.activity
    variables = {
        "GPUALLOC_EVENT": expiry.event,
        "GPUALLOC_LEASE_ID": lease.id,
        "GPUALLOC_USER": lease.user,
        "GPUALLOC_GPUS": held_devices(lease),
        "GPUALLOC_IDLE_SECONDS": str(int(expiry.idle.total_seconds())),
    }
    if activity is not None and activity.expires_at is not None:
        variables["GPUALLOC_EXPIRES_AT"] = activity.expires_at.isoformat(timespec="seconds")
    return variables
