"""Verified launch: after ``run`` execs a job, check that it really runs on
the GPUs its lease holds.

A *verifier* (a detached process of the job's user, see :mod:`gpualloc.launcher.watcher`)
looks at the GPUs' running-process lists every ``poll_s`` seconds
(:class:`~gpualloc.launcher.verify_terms.VerifyTerms`) for the grace period
(``verify.grace`` of the configuration, default 60 s; a job starts CUDA only after its imports
and data loading, and data-parallel jobs start their workers later still). When a process of
the job (see :mod:`gpualloc.ledger.attribution`) shows up on a GPU the lease does not hold, or
a process of nobody's job on one it holds, it says so on the job's standard error; with
``verify.action = "kill"`` it also ends a misplaced job (SIGTERM, then SIGKILL). After the
grace period ``status`` and ``doctor`` keep checking whenever they are run.

On this host the process lists come from NVML (else nvidia-smi); on a recorded topology read
from a file, from the processes the file declares, read again at every look, so that a test
(or a demonstration) can declare where the job runs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from gpualloc.launcher.verify_terms import VerifyTerms
from gpualloc.ledger.attribution import Attribution, attribute
from gpualloc.ledger.schema import Lease
from gpualloc.model.topology import GpuProcess

KILL_GRACE_S = 10.0
Verdict = Literal["verified", "unseen", "misplaced", "ended"]


def start_verifier(
    lease: Lease, ledger_file: Path, look: Callable[[], list[GpuProcess]], terms: VerifyTerms
) -> None:
    """Fork the verifier of this process (about to become the job) and return.

    The verifier opens the job's standard error only to write a warning, so that a caller
    reading the job's output to its end never waits for the verifier; where that cannot be done
    (a pipe root made, a socket) it keeps a copy of the descriptor for the grace period."""
    from gpualloc.launcher.watcher import fork_detached, job_speaker

    job = os.getpid()
    leads_group = os.getpgrp() == job
    say, kept = job_speaker()

    def leases() -> list[Lease]:
        return _leases_in(ledger_file, lease)

    fork_detached(
        lambda: verify(lease, job, look, terms, say=say, leads_group=leads_group, leases=leases),
        keep=kept,
    )


def verify(
    lease: Lease,
    job: int,
    look: Callable[[], list[GpuProcess]],
    terms: VerifyTerms,
    *,
    say: Callable[[str], None],
    leads_group: bool,
    leases: Callable[[], list[Lease]] | None = None,
) -> Verdict:
    """Watch ``job`` for the grace period: ``misplaced`` as soon as a process of it runs on a
    GPU the lease does not hold, ``verified`` when its processes ran only on the lease's GPUs,
    ``unseen`` when none ran on a GPU, ``ended`` when the job ended first. Every mismatch is
    said once (through ``say``). ``leases`` gives the ledger's leases now (the shared jobs on
    a shareable lease's GPUs are not intruders); without it only ``lease`` is known."""
    from gpualloc.launcher.watcher import end_job
    from gpualloc.ledger.liveness import process_alive, process_start_time

    started = process_start_time(job)
    deadline = time.monotonic() + terms.grace_s
    said: set[str] = set()
    seen = False
    while True:
        if not process_alive(job, started):
            return "ended"
        found = _mismatches(lease, leases() if leases else [lease], _looked(look))
        seen = seen or any(owner.id == lease.id for owner in found.owners.values())
        for line in found.lines():
            if line not in said:
                said.add(line)
                say(line)
        if found.misplaced:
            say(
                "the job does not keep to CUDA_VISIBLE_DEVICES (a hard-coded device, or a "
                "launcher that resets it); "
                + (
                    "ending it (verify.action = kill)"
                    if terms.action == "kill"
                    else 'set verify.action = "kill" to end such jobs'
                )
            )
            if terms.action == "kill":
                end_job(job, leads_group, started, KILL_GRACE_S)
            return "misplaced"
        if time.monotonic() >= deadline:
            return "verified" if seen else "unseen"
        time.sleep(min(terms.poll_s, max(0.0, deadline - time.monotonic())))


def _looked(look: Callable[[], list[GpuProcess]]) -> list[GpuProcess]:
    """The processes now; none when they cannot be read this time (NVML busy or failing, a
    topology file caught mid-write): the verifier looks again, it does not die."""
    from gpualloc.errors import GpuallocError

    try:
        return look()
    except (GpuallocError, OSError, ValueError):
        return []


def _mismatches(lease: Lease, leases: list[Lease], processes: list[GpuProcess]) -> Attribution:
    """The mismatches that concern ``lease``: its processes elsewhere, others' on its GPUs."""
    found = attribute(leases, processes)
    return Attribution(
        found.owners,
        tuple(m for m in found.misplaced if m.lease.id == lease.id),
        tuple(i for i in found.intruders if lease.id in {h.id for h in i.holders}),
    )


def _leases_in(ledger_file: Path, lease: Lease) -> list[Lease]:
    """The ledger's leases (``lease`` among them even when the file cannot be read now)."""
    from gpualloc.errors import GpuallocError
    from gpualloc.ledger.store import parse_ledger

    try:
        ledger = parse_ledger(ledger_file.read_text(encoding="utf-8"), str(ledger_file))
    except (OSError, GpuallocError, ValueError):
        return [lease]
    others = [x for x in ledger.leases if x.id != lease.id]
    return [lease, *others]
