"""``gpualloc slurm ...``: the node hooks that make gpualloc Slurm's per-node placement brain."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from gpualloc.cli.declare import Command, Group, value
from gpualloc.cli.state import STATE
from gpualloc.errors import GpuallocError

if TYPE_CHECKING:
    from gpualloc.host.local import LocalHost

HOOK_LOG = "slurm-hooks.log"


def gres_conf_command(
    node: str | None,
    threads_per_core: int | None,
    device_dir: str,
    mig_minors: Path | None,
    gpu_type: str | None,
) -> None:
    """Print gres.conf lines for this host: File=/dev/nvidiaN (device minor numbers, PCI bus
    order), Cores= (the GPUs' local cores, Slurm numbering), Links= (NVLink counts).

    A GPU with MIG enabled gets one line per MIG device instead, as AutoDetect=nvml makes them:
    Type=<gpu type>_<profile> and MultipleFiles= the parent's /dev/nvidiaN plus the
    /dev/nvidia-caps files of its GPU and compute instance.

    Why: Debian's Slurm has no NVML plugin in main, so slurmd cannot see GPUs, NVLinks or MIG
    devices by itself. Limits: Slurm 22.05 uses Links= only to prefer GPUs linked to the first
    free one, never to find the best-linked set (the taskprolog reorders within what Slurm
    gave); Cores= matters only with a task plugin that binds cores; a host with MIG gets no
    Links= (Slurm counts them per GRES record).
    """
    from gpualloc.cli.output import write_stdout
    from gpualloc.discovery.recorded import read_text
    from gpualloc.discovery.this_host import describes_this_host
    from gpualloc.slurm.gres import (
        MIG_MINORS,
        enumerated_core_numbers,
        gres_conf,
        parse_mig_minors,
        sysfs_core_numbers,
    )

    topology = STATE.load_topology()
    here = describes_this_host(topology)
    if threads_per_core is not None:
        cores = enumerated_core_numbers(topology, threads_per_core)
    elif here:
        cores = sysfs_core_numbers()
    else:
        cores = None
    minors_file = mig_minors or (MIG_MINORS if here and MIG_MINORS.exists() else None)
    minors = parse_mig_minors(read_text(minors_file, "MIG minors file")) if minors_file else None
    write_stdout(
        gres_conf(
            topology,
            node=node,
            core_numbers=cores,
            device_dir=device_dir,
            mig_minors=minors,
            gpu_type=gpu_type,
        )
    )


def prolog_command() -> None:
    """For Prolog= (runs as root before each job): record the job's GPUs (SLURM_JOB_GPUS) as a
    lease of the job's user, so that 'gpualloc run' outside Slurm avoids them.

    Always exits 0, since a failing Prolog drains the node and holds the job; problems go to
    stderr and to slurm-hooks.log in the state directory.
    """
    from gpualloc.host.slurm_hooks import prolog

    _node_hook("prolog", prolog, create=True)


def epilog_command() -> None:
    """For Epilog= (runs as root after each job, also when the Prolog never ran): release the
    job's leases. Idempotent; always exits 0 (a failing Epilog drains the node)."""
    from gpualloc.host.slurm_hooks import epilog

    _node_hook("epilog", epilog, create=False)


def taskprolog_command() -> None:
    """For TaskProlog= (runs as the job's user for every task; slurmstepd reads its output):
    print export lines for CUDA_DEVICE_ORDER=PCI_BUS_ID and CUDA_VISIBLE_DEVICES in the order
    of the best ring through the step's GPUs. Never fails the task: on a problem it prints
    only the first line and says why on stderr."""
    from gpualloc.cli.output import write_stdout
    from gpualloc.host.slurm_hooks import task_prolog

    env = dict(os.environ)
    try:
        lines = task_prolog(STATE.load_topology(), env)
    except Exception as exc:  # never fail the task
        sys.stderr.write(f"gpualloc taskprolog: {exc}\n")
        lines = ["export CUDA_DEVICE_ORDER=PCI_BUS_ID"]
    write_stdout("".join(line + "\n" for line in lines))


def _node_hook(
    kind: str, hook: Callable[[LocalHost, dict[str, str]], list[str]], *, create: bool
) -> None:
    from gpualloc.host.local import LocalHost

    env = dict(os.environ)
    host = None
    through = _through_broker(kind, env)
    if through is not None:
        _log(None, kind, through)
        return
    try:
        host = LocalHost.open(
            STATE.load_topology(),
            ignore_foreign=True,
            create=create,
            state_dir=STATE.setting("state_dir"),
            lock_timeout_s=STATE.setting("lock_timeout"),
        )
        lines = hook(host, env)
    except Exception as exc:  # never drain the node
        lines = [f"job {env.get('SLURM_JOB_ID', '?')}: {kind} failed: {exc}"]
    _log(host, kind, lines)


def _through_broker(kind: str, env: dict[str, str]) -> list[str] | None:
    """The hook's log lines when the host's broker made the change; None when there is no
    broker. A broker that is configured but does not answer: root's hook takes the broker's
    ledger itself (the broker's lock is free when no broker runs), and says so."""
    from gpualloc.broker.slurm_requests import SLURM_VARIABLES
    from gpualloc.host.open import broker_for
    from gpualloc.wire.client import BrokerClient

    socket = broker_for(STATE.setting("host.broker"), env, node_hook=True)
    if socket is None:
        return None
    sent = {name: env[name] for name in SLURM_VARIABLES if name in env}
    try:
        answer_s = STATE.setting("host.broker_timeout")
        with BrokerClient(socket, reconnect_s=3.0, answer_s=answer_s) as client:
            return list(client.call("slurm", {"hook": kind, "env": sent})["lines"])
    except GpuallocError as problem:
        lines = [
            f"job {env.get('SLURM_JOB_ID', '?')}: {problem.message}; writing the ledger directly"
        ]
    try:
        host = _broker_ledger()
        from gpualloc.host.slurm_hooks import epilog, prolog

        return lines + (prolog if kind == "prolog" else epilog)(host, env)
    except Exception as exc:  # never drain the node
        return [*lines, f"job {env.get('SLURM_JOB_ID', '?')}: {kind} failed: {exc}"]


def _broker_ledger() -> LocalHost:
    """The broker's ledger, opened by root itself (no broker answers)."""
    from gpualloc.host.local import LocalHost

    return LocalHost.open(
        STATE.load_topology(),
        ignore_foreign=True,
        state_dir=STATE.config().system_value("broker.state_dir"),
        lock_timeout_s=STATE.setting("lock_timeout"),
        owner=True,
    )


def _log(host: LocalHost | None, kind: str, lines: list[str]) -> None:
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    text = "".join(f"{stamp} {kind}: {line}\n" for line in lines)
    sys.stderr.write(text)
    if host is None or host.store is None:
        return
    path = host.store.directory.path / HOOK_LOG
    try:
        descriptor = _open_log(path)
        with os.fdopen(descriptor, "a", encoding="utf-8") as handle:
            handle.write(text)
    except (OSError, GpuallocError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else str(exc)
        sys.stderr.write(f"{stamp} {kind}: cannot append to {path}: {why}\n")


def _open_log(path: Path) -> int:
    """The hooks' log, opened to append: never through a symlink, never blocking on a FIFO,
    and, for root, only a file of root's (anything a user planted there is replaced)."""
    from gpualloc.ledger.shared_files import open_shared, replace_planted

    flags = os.O_WRONLY | os.O_APPEND
    descriptor, info = open_shared(path, flags, create_mode=0o644, replace_as_root=True)
    if os.geteuid() == 0 and info.st_uid != 0:  # a user's file: root's log must be root's
        os.close(descriptor)
        replace_planted(path)
        descriptor, info = open_shared(path, flags, create_mode=0o644)
    return descriptor


SLURM = Group(
    "slurm",
    "Slurm node hooks: Prolog/Epilog record the job's GPUs in the host ledger, TaskProlog sets "
    "CUDA_DEVICE_ORDER and a ring order. Give the wrappers GPUALLOC_TOPOLOGY and "
    "GPUALLOC_STATE_DIR: slurmd runs them with no PATH and a bare environment.",
    (
        Command(
            "gres-conf",
            gres_conf_command,
            (
                value(
                    "--node",
                    metavar="NAME",
                    help="NodeName= for each line (for a gres.conf shared by several nodes).",
                ),
                value(
                    "--threads-per-core",
                    kind="int",
                    minimum=1,
                    metavar="N",
                    help="For a recorded topology: hardware threads per core, to derive Cores= "
                    "(this host's come from sysfs).",
                ),
                value(
                    "--device-dir",
                    metavar="DIR",
                    default="/dev",
                    help="Where the GPU device files are (File=DIR/nvidiaN).",
                ),
                value(
                    "--mig-minors",
                    kind="path",
                    metavar="FILE",
                    help="The driver's MIG capability table (a copy of "
                    "/proc/driver/nvidia-caps/mig-minors), for a recorded topology; this host's "
                    "is read when present, else the minors are computed from the driver's "
                    "layout.",
                ),
                value(
                    "--gpu-type",
                    metavar="TYPE",
                    help="GPU type name for Type= on a host with MIG (default: the NVML name in "
                    "lower case with underscores, as Slurm's NVML plugin derives it); it must "
                    "match Gres=gpu:<type>:N in slurm.conf.",
                ),
            ),
            summary="Print gres.conf lines for this host.",
        ),
        Command("prolog", prolog_command, summary="Prolog=: record the job's GPUs (as root)."),
        Command("epilog", epilog_command, summary="Epilog=: free the job's GPUs (as root)."),
        Command(
            "taskprolog",
            taskprolog_command,
            summary="TaskProlog=: export each task's GPUs in ring order.",
        ),
    ),
)
