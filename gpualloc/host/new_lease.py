"""The lease a placement and its terms make, as both ledgers record it (the embedded one
and the broker's, which is an embedded ledger of root's)."""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

from gpualloc.boot import boot_id
from gpualloc.host.lease_terms import LeaseTerms, no_such_process
from gpualloc.ledger.schema import Lease, LeasedGpu, LeasedMig, LeaseSignal
from gpualloc.ledger.shared_files import owner_name

if TYPE_CHECKING:
    from gpualloc.host.view import HostView
    from gpualloc.model.request import Placement
    from gpualloc.placement.want import Want


def new_lease(
    host: HostView,
    lease_id: str,
    placement: Placement,
    want: Want,
    terms: LeaseTerms,
    *,
    waited_s: float = 0.0,
) -> Lease:
    """The lease ``terms`` ask for on ``placement``'s GPUs: its process checked alive (a start
    time the caller read may belong to one that ended since, in the queue), its owner and
    creator named, its time limit as granted (:mod:`gpualloc.host.time_rules`); ``waited_s``:
    how long its job waited in the queue."""
    from gpualloc.ledger.liveness import process_alive, process_start_time

    start_time = terms.pid_start_time
    if terms.pid is not None:
        # A start time the caller read (the broker, when the request came) may belong to
        # a process that ended since, in the queue: a lease of it would be dead at once.
        if start_time is None:
            start_time = process_start_time(terms.pid)
        if start_time is None or not process_alive(terms.pid, start_time):
            raise no_such_process(terms.pid)
    uid = os.geteuid() if terms.uid is None else terms.uid
    creator_pid, creator_start = terms.creator or (os.getpid(), None)
    if terms.announce and creator_start is None:
        creator_start = process_start_time(creator_pid)
    mig = [host.topology.mig_device(*key) for key in placement.mig_devices]
    now = datetime.now(timezone.utc)
    return Lease(
        id=lease_id,
        gpus=tuple(LeasedGpu(index=g, uuid=host.topology.gpu(g).uuid) for g in placement.gpus),
        mig=tuple(
            LeasedMig(gpu=m.gpu, device=m.device, uuid=m.uuid, profile=m.profile) for m in mig
        ),
        uid=uid,
        user=owner_name(uid),
        pid=terms.pid,
        pid_start_time=start_time,
        lock=terms.lock,
        hold=terms.hold,
        command=terms.command,
        name=terms.name,
        policy=placement.policy,
        sensitive=want.request.sensitive,
        scores=placement.score_values(),
        created=now,
        queued=now - timedelta(seconds=waited_s) if waited_s > 0 else None,
        source=terms.source,
        boot_id=boot_id(),
        process_group=terms.process_group,
        announced=not terms.announce,
        creator_pid=creator_pid if terms.announce else None,
        creator_start_time=creator_start if terms.announce else None,
        shareable=terms.shareable,
        memory_bytes=want.share.memory_bytes if want.share else terms.memory_bytes,
        share=(
            host.leased_share(want.share, placement.gpus[0], terms.share_mode)
            if want.share is not None
            else None
        ),
        time_limit_s=terms.time_limit_s,
        signal=None
        if terms.signal is None
        else LeaseSignal(
            number=terms.signal[0], before_s=terms.signal[1], leader_only=terms.signal[2]
        ),
    )
