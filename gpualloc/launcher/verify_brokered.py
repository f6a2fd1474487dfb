"""Verified launch for a job ``run`` starts through the broker.

The verifier is the same (:func:`gpualloc.launcher.verify.verify`): a detached helper of the
job's own user that watches, for ``verify.grace``, that the job's processes run on its lease's
GPUs only, warns on the job's standard error and, with ``verify.action = "kill"``, ends a job
that does not keep to them. Through the broker it asks the broker where processes run and
which leases exist (the broker reads NVML every 2 s, or a recorded topology file's declared
processes), so the job's own process imports nothing more than the fork: the helper loads the
models after the fork, while the job starts.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any


def start_verifier(socket: Path, lease: dict[str, Any], grace_s: float, action: str) -> None:
    """Fork the verifier of this process (about to exec the job) and return at once."""
    from gpualloc.launcher.watcher import fork_detached, job_speaker

    job = os.getpid()
    leads_group = os.getpgrp() == job
    say, kept = job_speaker()

    def body() -> None:
        from gpualloc.discovery.processes import ProcessReport
        from gpualloc.errors import GpuallocError
        from gpualloc.launcher.verify import VerifyTerms, verify
        from gpualloc.ledger.schema import Lease, Ledger
        from gpualloc.model.validation import from_builtins
        from gpualloc.wire.client import BrokerClient

        client = BrokerClient(socket)
        seen: dict[str, Any] = {"view": None, "at": 0.0}

        def view() -> dict[str, Any]:
            """One snapshot per look, shared by its two questions."""
            if seen["view"] is None or time.monotonic() - seen["at"] > 0.5:
                seen.update(view=client.call("snapshot", {"full": True}), at=time.monotonic())
            return seen["view"]

        def look() -> list[Any]:
            return from_builtins(view()["processes"], ProcessReport).processes

        def leases() -> list[Lease]:
            try:
                return from_builtins(view()["ledger"], Ledger).leases
            except GpuallocError:  # the broker restarting: this look knows the job's own
                return [mine]

        mine = from_builtins(lease, Lease)
        terms = VerifyTerms(grace_s=grace_s, action=action)  # type: ignore[arg-type]
        verify(mine, job, look, terms, say=say, leads_group=leads_group, leases=leases)

    fork_detached(body, keep=kept)
