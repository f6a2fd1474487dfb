"""Running a shared job: how it shares its GPU, and how it is evicted.

- **MPS or time slices.** When a CUDA MPS control daemon runs (its ``control`` pipe exists in
  ``CUDA_MPS_PIPE_DIRECTORY``, default ``/tmp/nvidia-mps``), the job's CUDA contexts become MPS
  clients and run side by side with the others; ``--sm-share P`` exports
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=P``, which caps the job's streaming multiprocessors (NVIDIA
  MPS documentation, section 2.3.5.2). Without the daemon the driver time-slices the GPU between
  the jobs' contexts and does not hold a job to its ``--sm-share`` (said as a warning); the
  share still counts against the GPU's capacity when gpualloc places shared jobs. gpualloc never
  starts the daemon: that is the host's administrator's decision (it needs the GPU in
  exclusive-process mode to be safe, which needs root).
- **Eviction across users.** The owner of a ``--shareable`` lease may ask for the shared jobs on
  its GPUs to leave (``release --evict-shared``), but may not signal another user's processes.
  So every shared job gets a *watcher*: a small process of the job's own user, started before
  the exec, outside the job's process group (so that it never keeps the lease alive), holding no
  descriptor of the job's. It polls the ledger; when the job's lease is marked for eviction it
  sends SIGTERM to the job (its process group when the job leads one), then SIGKILL after the
  grace period, and it exits as soon as the job has ended.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Mapping
from pathlib import Path

from gpualloc.model.share import LeasedShare, ShareMode

MPS_PIPE_VARIABLE = "CUDA_MPS_PIPE_DIRECTORY"
DEFAULT_MPS_PIPE_DIRECTORY = Path("/tmp/nvidia-mps")
SHARE_VARIABLE = "GPUALLOC_SHARE"
MPS_PERCENTAGE_VARIABLE = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
BACKGROUND_NICENESS = 10
"""How much lower a background job's CPU priority is (its GPU priority is the driver's)."""
WATCH_INTERVAL_S = 0.25
EVICTION_GRACE_S = 10.0


def mps_control_pipe(env: Mapping[str, str]) -> Path | None:
    """The MPS control daemon's pipe, when a daemon runs for this pipe directory."""
    directory = Path(env.get(MPS_PIPE_VARIABLE) or DEFAULT_MPS_PIPE_DIRECTORY)
    pipe = directory / "control"
    try:
        return pipe if stat.S_ISFIFO(pipe.stat().st_mode) else None
    except OSError:
        return None


def share_mode(env: Mapping[str, str]) -> ShareMode:
    return "mps" if mps_control_pipe(env) is not None else "time-sliced"


def share_variables(share: LeasedShare) -> dict[str, str]:
    """What a shared job's environment gets beside its GPU variables."""
    variables: dict[str, str] = {SHARE_VARIABLE: share.mode}
    if share.mode == "mps" and share.sm_percent is not None:
        variables[MPS_PERCENTAGE_VARIABLE] = str(share.sm_percent)
    return variables


def share_notes(mode: str, sm_percent: int | None, env: Mapping[str, str]) -> list[str]:
    """Warnings for a shared job about to start, shared by ``mode`` with ``--sm-share``
    ``sm_percent``."""
    if sm_percent is not None and mode != "mps":
        directory = env.get(MPS_PIPE_VARIABLE) or DEFAULT_MPS_PIPE_DIRECTORY
        return [
            f"no CUDA MPS daemon runs (no control pipe in {directory}): the GPU is "
            "time-sliced between its jobs and the driver does not cap this one at its "
            "--sm-share (placement still counted it)"
        ]
    return []


# ---- the eviction watcher ------------------------------------------------------------------


def start_eviction_watcher(ledger_file: Path, lease_id: str) -> None:
    """Fork the watcher of this process (about to become the shared job) and return (see
    :mod:`gpualloc.launcher.watcher`)."""
    from gpualloc.launcher.watcher import fork_detached

    job = os.getpid()
    leads_group = os.getpgrp() == job
    fork_detached(lambda: watch(ledger_file, lease_id, job, leads_group=leads_group))


def watch(ledger_file: Path, lease_id: str, job: int, *, leads_group: bool) -> str:
    """Watch the ledger until the job ends (``"ended"``), its lease goes (``"released"``) or
    its eviction is asked for, which ends it (``"evicted"``)."""
    from gpualloc.launcher.watcher import end_job
    from gpualloc.ledger.liveness import process_alive, process_start_time

    started = process_start_time(job)
    seen: float | None = None
    while process_alive(job, started):
        try:
            changed = ledger_file.stat().st_mtime
        except OSError:
            changed = None
        if changed != seen:
            verdict, grace_s = _lease_verdict(ledger_file, lease_id)
            if verdict is not None:
                seen = changed
                if verdict == "evict":
                    end_job(job, leads_group, started, grace_s)
                    return "evicted"
                if verdict == "gone":
                    return "released"
        time.sleep(WATCH_INTERVAL_S)
    return "ended"


def _lease_verdict(ledger_file: Path, lease_id: str) -> tuple[str | None, float]:
    """``evict`` (with the grace period), ``gone`` or ``keep`` for the lease; None when the
    ledger cannot be read now (a writer is mid-write: look again next time)."""
    from gpualloc.errors import GpuallocError
    from gpualloc.ledger.store import parse_ledger

    try:
        ledger = parse_ledger(ledger_file.read_text(encoding="utf-8"), str(ledger_file))
    except (OSError, GpuallocError, ValueError):
        return None, EVICTION_GRACE_S
    lease = ledger.find(lease_id)
    if lease is None:
        return "gone", EVICTION_GRACE_S
    share = lease.share
    if share is not None and share.evict_by is not None:
        grace = share.evict_grace_s if share.evict_grace_s is not None else EVICTION_GRACE_S
        return "evict", grace
    return "keep", EVICTION_GRACE_S
