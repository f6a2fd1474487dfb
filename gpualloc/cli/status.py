"""``gpualloc status``: every GPU of the host, free, held (by whom, doing what) or busy."""

from __future__ import annotations

import sys
import time
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from gpualloc import boot
from gpualloc.cli.declare import Command, flag, json_flag, value
from gpualloc.cli.open_ledger import open_host_ledger
from gpualloc.cli.queue_view import (
    expected_starts_of,
    pending_reasons_of,
    queue_table,
    start_json,
)
from gpualloc.json_views import lease_json
from gpualloc.model.printable import count_of, printable, shown_name

if TYPE_CHECKING:
    from gpualloc.cli.output import Table
    from gpualloc.host.backfill import Expected
    from gpualloc.host.protocol import Host
    from gpualloc.ledger.attribution import Attribution
    from gpualloc.ledger.idle import LeaseUse
    from gpualloc.ledger.occupancy import Occupancy
    from gpualloc.ledger.schema import Lease
    from gpualloc.ledger.store import LedgerTransaction
    from gpualloc.model.topology import GpuProcess

STATE_STYLE = {
    "free": "green",
    "held": "yellow",
    "foreign": "red",
    "lost": "red",
    "outside": "dim",
    "mig": "cyan",
    "shared": "magenta",
    "unhealthy": "red",
}


def status_command(as_json: bool, watch: bool, interval: float, idle: str | None) -> None:
    """Show every GPU: free, held by a lease (user, pid, name, command, since, lease id), busy
    with processes that did not come through gpualloc, or lost. Inside a Slurm job: the job's
    own ledger, and the GPUs that are not the job's as outside.

    Per GPU its utilisation and memory in use (NVML), per lease how long its GPUs have been
    idle: as 'gpualloc gc' recorded it (run it every few minutes) and this look extends it.
    A lease's processes on GPUs it does not hold, and others' processes on leased GPUs, are
    listed as MISMATCH.

    Reads the ledger without changing it: leases whose jobs are gone are left out (and freed by
    the next command that writes, or by 'gpualloc gc').
    """
    idle_at_least = _idle_threshold(idle)
    host = open_host_ledger(create=False)
    if not watch:
        _show(host, as_json, idle_at_least)
        return
    try:
        while True:
            if as_json:  # JSON Lines: one document a line, each whole as it comes
                _show(host, as_json, idle_at_least, json_line=True)
            else:
                if sys.stdout.isatty():
                    sys.stdout.write("\x1b[H\x1b[2J")
                _show(host, as_json, idle_at_least)
                if not sys.stdout.isatty():
                    sys.stdout.write("\n")
            time.sleep(interval)
            host = open_host_ledger(create=False)
    except KeyboardInterrupt:
        return


def _idle_threshold(text: str | None) -> timedelta | None:
    if text is None:
        return None
    from gpualloc.durations import parse_duration_text
    from gpualloc.errors import RequestError
    from gpualloc.model.option_values import DURATION_HINT
    from gpualloc.user_files import shown_value

    try:
        return timedelta(seconds=parse_duration_text(text))
    except ValueError as exc:  # its words when too long, already quoting the value cut
        said = f"--idle {exc}" if "year" in str(exc) else f"--idle {shown_value(text)}"
        raise RequestError(
            said if "year" in str(exc) else f"{said} is not a duration",
            hint=DURATION_HINT,
        ) from None


def slurm_conflicts(leases: list[Lease]) -> list[str]:
    """One line per lease that holds GPUs Slurm gave a job (tests/test_slurm_hooks.py)."""
    from gpualloc.ledger.occupancy import held_devices

    return [
        f"lease {x.id} of {x.user} holds {held_devices(x)}, which Slurm gave to job "
        f"{x.slurm_conflict}: they stay the job's until it ends (release it: gpualloc release "
        f"{x.id})"
        for x in leases
        if x.slurm_conflict is not None
    ]


def lease_uses(host: Host, leases: list[Lease]) -> dict[str, LeaseUse]:
    """Lease id -> its use now (see :func:`gpualloc.ledger.idle.lease_uses`)."""
    from gpualloc.cli.state import STATE
    from gpualloc.ledger.idle import IdlePolicy
    from gpualloc.ledger.idle import lease_uses as uses_of

    policy = IdlePolicy.from_config(STATE.config())
    return uses_of(leases, host.processes.utilization, policy, datetime.now(timezone.utc))


def _show(
    host: Host, as_json: bool, idle_at_least: timedelta | None = None, *, json_line: bool = False
) -> None:
    from gpualloc.cli.open_ledger import warn
    from gpualloc.cli.output import print_json, print_json_line, print_tables
    from gpualloc.cli.topology_view import mig_changes
    from gpualloc.ledger.attribution import attribute

    txn = host.snapshot()
    warn(txn.notes)
    occupancy = host.occupancy(txn.ledger)
    attribution = attribute(txn.ledger.leases, host.processes.processes)
    uses = lease_uses(host, txn.ledger.leases)
    shown = None
    if idle_at_least is not None:
        shown = {
            lease_id
            for lease_id, use in uses.items()
            if use.idle is not None and use.idle >= idle_at_least
        }
    reasons = pending_reasons_of(host, txn.ledger.queue, occupancy)
    starts = expected_starts_of(host, txn.ledger.queue, occupancy)
    if as_json:
        data = status_json(host, txn, occupancy, attribution, uses, shown, reasons, starts)
        if json_line:
            print_json_line(data)
        else:
            print_json(data)
        return
    free = sorted(occupancy.free)
    ledger = ledger_place(host)
    footer = [
        f"{len(free)} of {count_of(host.topology.gpu_count, 'GPU')} free; "
        f"{count_of(len(txn.ledger.leases), 'lease')}, {len(txn.ledger.queue)} waiting, in "
        f"{ledger}",
    ]
    trust = host.trust()
    if trust.mode == "cooperative" and trust.several_writers:
        footer.append(f"  warning: {trust.detail}")
    if host.slurm_job is not None:
        footer.append(
            f"  inside {host.slurm_job.describe()}: the job's own ledger; the host's GPUs that "
            "are not the job's show as outside (GPUALLOC_NO_SLURM=1 shows the host's ledger)"
        )
    if not host.this_host:
        footer.append(
            f"  topology {host.topology.name or '(unnamed)'} is not this host: its leases are "
            "kept apart from the host's, and its processes are the ones its file declares"
        )
    footer += [f"  {note}" for note in host.health_notes]
    footer += [f"  {change}" for change in mig_changes(host.topology)]
    footer += [f"  MISMATCH: {line}" for line in attribution.lines()]
    footer += [f"  CONFLICT: {line}" for line in slurm_conflicts(txn.ledger.leases)]
    footer += _notice_lines(txn.ledger.leases, uses)
    if host.topology.mig_instances:
        devices = host.topology.mig_instances
        free_mig = [m for m in devices if (m.gpu, m.device) not in occupancy.mig_leases]
        footer[0] += f"; {len(free_mig)} of {len(devices)} MIG devices free"
    tables = [_gpu_table(host, occupancy, attribution, uses, shown)]
    if host.topology.mig_instances:
        tables.append(_mig_table(host, occupancy))
    shares = [lease for found in occupancy.shares.values() for lease in found]
    if shares:
        footer[0] += f"; {count_of(len(shares), 'shared job')}"
        tables.append(_share_table(host, occupancy))
    if txn.ledger.queue:
        tables.append(queue_table(txn.ledger.queue, reasons, starts))
    if shown is not None and idle_at_least is not None:
        from gpualloc.ledger.occupancy import format_age

        idle_for = f"idle for {format_age(idle_at_least)} or longer"
        footer.insert(
            0, f"{count_of(len(shown), 'lease')} {idle_for}" if shown else f"no lease {idle_for}"
        )
        if not shown:  # a table of headers only reads as a broken command
            tables = []
    print_tables(tables, footer=footer)


def _gpu_table(
    host: Host,
    occupancy: Occupancy,
    attribution: Attribution,
    uses: dict[str, LeaseUse],
    shown: set[str] | None,
) -> Table:
    from gpualloc.cli.output import Table
    from gpualloc.ledger.occupancy import describe_processes

    now = datetime.now(timezone.utc)
    faults = occupancy.unhealthy  # status never places, so never --allow-unhealthy
    rows, styles = [], []
    for gpu in host.topology.gpus:
        state = occupancy.state(gpu.index)
        lease = occupancy.leases.get(gpu.index)
        shares = occupancy.shares.get(gpu.index, ())
        if shown is not None and (lease is None or lease.id not in shown):
            continue
        if lease is not None:
            row = [str(gpu.index), state, *_lease_cells(lease, now)]
            if lease.shareable:
                note = f"[shareable: {_shared_cell(occupancy, gpu.index)}]"
                row[-1] = note if row[-1] == "-" else f"{row[-1]} {note}"
        elif shares:
            users = ",".join(sorted({x.user for x in shares}))
            row = [str(gpu.index), state, users, "-", "-", "-", _shared_cell(occupancy, gpu.index)]
        else:
            foreign = occupancy.foreign(gpu.index)
            owners = ",".join(sorted({p.user for p in foreign if p.user}))
            job = "; ".join(_process_cell(p, attribution) for p in foreign)
            if foreign and occupancy.ignore_foreign:
                job += " (ignored)"
            row = [str(gpu.index), state, owners or "-", "-", "-", "-", job or "-"]
        intruders = attribution.intruders_on(gpu.index) if lease or shares else []
        if intruders:
            row[-1] += f" (ALSO USED BY {describe_processes(intruders)}, not the lease's job)"
        fault = faults.get(gpu.index)
        if fault:
            row[-1] = f"UNHEALTHY: {fault}" if row[-1] == "-" else f"{row[-1]} (UNHEALTHY: {fault})"
        holder = lease or (shares[0] if shares else None)
        use = uses.get(holder.id) if holder is not None else None
        row[5:5] = [_use_cell(host, occupancy, gpu.index), _idle_cell(use)]
        rows.append(row)
        styles.append([None, STATE_STYLE.get(state), None, None, None, None, None, None, None])
    from gpualloc.cli.topology_view import mixed_models

    models = mixed_models(host.topology)
    return Table(
        f"GPUs of {host.topology.name or boot.hostname()}" + (f" ({models})" if models else ""),
        ["GPU", "State", "User", "Lease", "Since", "Use", "Idle", "PID", "Job"],
        rows,
        styles=styles,
        wrap=(8,),
    )


def _use_cell(host: Host, occupancy: Occupancy, gpu: int) -> str:
    """``87% 31.5 GiB``: utilisation and memory in use, where known."""
    from gpualloc.model.mig import format_size

    parts = []
    percent = host.processes.utilization.get(gpu)
    if percent is not None:
        parts.append(f"{percent}%")
    memory = occupancy.memory_used.get(gpu)
    if memory is not None:
        parts.append(format_size(memory))
    return " ".join(parts) or "-"


def _idle_cell(use: LeaseUse | None) -> str:
    from gpualloc.ledger.occupancy import format_age

    if use is None or use.busy is None:
        return "-"
    if use.idle is None:
        return "busy"
    text = format_age(use.idle)
    if use.activity is not None and use.activity.expires_at is not None:
        text += " (notice)"
    return text


def _notice_lines(leases: list[Lease], uses: dict[str, LeaseUse]) -> list[str]:
    """A line per idle --hold lease that was given notice (``idle.expire_holds``)."""
    from gpualloc.ledger.occupancy import format_age

    lines = []
    for lease in leases:
        activity = lease.activity
        use = uses.get(lease.id)
        if activity is None or activity.expires_at is None or use is None or use.idle is None:
            continue
        when = activity.expires_at.astimezone().strftime("%Y-%m-%d %H:%M")
        lines.append(
            f"  NOTICE: lease {lease.id} ({lease.user}) has been idle {format_age(use.idle)}: "
            f"'gpualloc gc' releases it at {when} unless its GPUs are used"
        )
    return lines


def _process_cell(process: GpuProcess, attribution: Attribution) -> str:
    """A foreign process, and the lease whose job it is when it is one's (a lease's process on
    a GPU the lease does not hold)."""
    from gpualloc.ledger.occupancy import describe_processes

    owner = attribution.owners.get(process.pid)
    text = describe_processes([process])
    return f"{text} of lease {owner.id}, which does not hold this GPU" if owner else text


def _seconds(delta: timedelta | None) -> int | None:
    return int(delta.total_seconds()) if delta is not None else None


def _lease_id(lease: Lease | None) -> str | None:
    return lease.id if lease is not None else None


def _lease_cells(lease: Lease, now: datetime) -> list[str]:
    """User, lease id, age, pid and job of a lease, as the status tables show them."""
    from gpualloc.ledger.occupancy import ORPHANED, format_age, orphaned

    command = printable(" ".join(lease.command), 40)
    job = ": ".join(part for part in (shown_name(lease.name), command) if part) or "-"
    if orphaned(lease):
        job = f"ORPHANED, {ORPHANED} ({job})"
    since = format_age(now - lease.created)
    ends = lease.ends
    if ends is not None:  # the time its limit leaves it, as squeue's TIME_LEFT
        since += f", {format_age(ends - now)} left" if ends > now else ", over its limit"
    return [lease.user, lease.id, since, "hold" if lease.hold else str(lease.pid or "-"), job]


def _mig_table(host: Host, occupancy: Occupancy) -> Table:
    """One row per MIG device: free, or who holds it."""
    from gpualloc.cli.output import Table
    from gpualloc.ledger.occupancy import describe_processes

    now = datetime.now(timezone.utc)
    rows, styles = [], []
    for instance in host.topology.mig_instances:
        key = (instance.gpu, instance.device)
        lease = occupancy.mig_leases.get(key)
        foreign = occupancy.mig_foreign.get(key, ())
        parent = occupancy.state(instance.gpu)
        state = "held" if lease else (parent if parent in ("lost", "unhealthy") else "free")
        cells = _lease_cells(lease, now) if lease else ["-"] * 5
        if not lease and foreign:
            state = "free" if occupancy.ignore_foreign else "foreign"
            users = ",".join(sorted({p.user for p in foreign if p.user})) or "-"
            cells = [users, "-", "-", "-", describe_processes(foreign)]
        rows.append([instance.label, instance.profile, state, *cells])
        styles.append([None, None, STATE_STYLE.get(state), None, None, None, None, None])
    return Table(
        "MIG devices",
        ["Device", "Profile", "State", "User", "Lease", "Since", "PID", "Job"],
        rows,
        styles=styles,
        wrap=(7,),
    )


def _shared_cell(occupancy: Occupancy, gpu: int) -> str:
    """``2 shared jobs, 75% of it``: how many, and how much of the GPU they hold."""
    count = len(occupancy.shares.get(gpu, ()))
    text = count_of(count, "shared job")
    return f"{text}, {occupancy.shared_fraction(gpu):.0%} of it" if count else text


def _share_table(host: Host, occupancy: Occupancy) -> Table:
    """One row per shared job: where, whose, how big a part, how it shares."""
    from gpualloc.cli.output import Table
    from gpualloc.model.mig import format_size

    now = datetime.now(timezone.utc)
    rows = []
    for gpu, found in sorted(occupancy.shares.items()):
        for lease in found:
            share = lease.share
            assert share is not None
            how = [f"{share.fraction:.0%}", share.mode]
            if lease.memory_bytes is not None:
                how.insert(1, format_size(lease.memory_bytes))
            if share.background:
                how.append("background")
            if share.evict_by is not None:
                how.append(f"evicted by {share.evict_by}")
            user, lease_id, since, pid, job = _lease_cells(lease, now)
            rows.append([str(gpu), user, lease_id, since, pid, ", ".join(how), job])
    columns = ["GPU", "User", "Lease", "Since", "PID", "Share", "Job"]
    return Table("Shared jobs", columns, rows, wrap=(5, 6))


def status_json(
    host: Host,
    txn: LedgerTransaction,
    occupancy: Occupancy,
    attribution: Attribution,
    uses: dict[str, LeaseUse],
    shown: set[str] | None = None,
    reasons: dict[str, str] | None = None,
    starts: dict[str, Expected] | None = None,
) -> dict[str, Any]:
    from gpualloc.host.queue import turn_order
    from gpualloc.model.validation import to_builtins
    from gpualloc.placement.sharing.fit import free_memory

    gpus = []
    for gpu in host.topology.gpus:
        lease = occupancy.leases.get(gpu.index)
        gpus.append(
            {
                "index": gpu.index,
                "uuid": gpu.uuid,
                "name": gpu.name,
                "pci_bus_id": gpu.pci_bus_id,
                "serial": gpu.serial,
                "mig_enabled": gpu.mig_enabled,
                "mig_pending": gpu.mig_pending,
                "state": occupancy.state(gpu.index),
                "lease": lease.id if lease else None,
                "shareable": bool(lease and lease.shareable),
                "shared_jobs": [x.id for x in occupancy.shares.get(gpu.index, ())],
                "shared_fraction": occupancy.shared_fraction(gpu.index),
                "memory_free_bytes": free_memory(host.topology, occupancy, gpu.index),
                "faults": [to_builtins(f) for f in host.faults if f.gpu == gpu.index],
                "processes": [to_builtins(p) for p in occupancy.processes.get(gpu.index, ())],
                "intruders": [to_builtins(p) for p in attribution.intruders_on(gpu.index)],
                "utilization_percent": host.processes.utilization.get(gpu.index),
                "memory_used_bytes": occupancy.memory_used.get(gpu.index),
            }
        )
    return {
        "host": boot.hostname(),
        "topology": host.topology.name,
        "this_host": host.this_host,
        "ledger": _ledger_file(host),
        "broker": str(host.broker_socket) if host.broker_socket else None,
        "trust": _trust_json(host),
        "slurm_job": (
            {"id": host.slurm_job.job_id, "gpus": sorted(host.slurm_job.gpus)}
            if host.slurm_job
            else None
        ),
        "processes_source": host.processes.source,
        "free": sorted(occupancy.free),
        "gpus": gpus,
        "mig_devices": [
            {
                "device": m.label,
                "gpu": m.gpu,
                "index": m.device,
                "profile": m.profile,
                "uuid": m.uuid,
                "lease": _lease_id(occupancy.mig_leases.get((m.gpu, m.device))),
                "processes": [
                    to_builtins(p) for p in occupancy.mig_foreign.get((m.gpu, m.device), ())
                ],
            }
            for m in host.topology.mig_instances
        ],
        "leases": [
            {
                **lease_json(lease),
                "misplaced": [to_builtins(p) for p in attribution.misplaced_of(lease.id)],
                "busy": uses[lease.id].busy,
                "idle_seconds": _seconds(uses[lease.id].idle),
            }
            for lease in txn.ledger.leases
            if shown is None or lease.id in shown
        ],
        "queue": [
            {
                "position": position,
                **to_builtins(waiter),
                "reason": (reasons or {}).get(waiter.id),
                **start_json((starts or {}).get(waiter.id)),
            }
            for position, waiter in enumerate(turn_order(txn.ledger.queue), start=1)
        ],
        "notes": [*host.processes.notes, *host.health_notes, *txn.notes],
    }


def ledger_place(host: Host) -> str:
    """Where the ledger is, for the footer: the broker that keeps it, or its file."""
    return host.ledger_place()


def _trust_json(host: Host) -> dict[str, str]:
    trust = host.trust()
    return {"mode": trust.mode, "detail": trust.detail}


def _ledger_file(host: Host) -> str | None:
    """The ledger's file for ``--json`` (None before there is one)."""
    path = host.ledger_file()
    return None if path is None else str(path)


STATUS = Command(
    "status",
    status_command,
    options=(
        json_flag(),
        flag("--watch", "-w", help="Redraw every --interval seconds until Ctrl-C."),
        value(
            "--interval",
            kind="float",
            minimum=0.2,
            metavar="SECONDS",
            default=2.0,
            help="Seconds between redraws with --watch.",
        ),
        value(
            "--idle",
            metavar="DURATION",
            help="Only the leases whose GPUs have been idle at least this long (2h, 90m).",
        ),
    ),
)
