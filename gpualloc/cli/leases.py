"""``gpualloc alloc``, ``release`` and ``gc``: leases without exec, for scripts and prologs."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from gpualloc.cli import complete
from gpualloc.cli.host import allocate, open_host_ledger, warn
from gpualloc.cli.request_options import (
    DrbWeightsOption,
    ExcludeOption,
    ExplicitGpusOption,
    IgnoreForeignOption,
    MaxBypassOption,
    MinBandwidthOption,
    MinUtilityOption,
    NameOption,
    PatternOption,
    PolicyOption,
    PriorityOption,
    RequireOption,
    ScoreOption,
    SensitiveOption,
    TimeoutOption,
    UuidOption,
    WaitOption,
    build_want,
    wait_options,
)
from gpualloc.cli.state import STATE
from gpualloc.errors import RequestError

if TYPE_CHECKING:
    from gpualloc.launcher.allocate import Allocation, HostLedger, Want
    from gpualloc.ledger.schema import Lease

FORMATS = ("ids", "env", "json")
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead.")]


def alloc_command(
    count: Annotated[
        Optional[int],  # noqa: UP045 - typer needs Optional on Python 3.10
        typer.Option("-n", "--num-gpus", min=1, help="Number of GPUs (default 1)."),
    ] = None,
    pattern: PatternOption = "ring",
    sensitive: SensitiveOption = None,
    exclude: ExcludeOption = None,
    require: RequireOption = None,
    policy: PolicyOption = None,
    score: ScoreOption = "auto",
    drb_weights: DrbWeightsOption = None,
    gpus: ExplicitGpusOption = None,
    pid: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(
            min=1,
            help="The lease lives as long as this process (default: the shell that ran "
            "gpualloc, i.e. its parent process).",
        ),
    ] = None,
    hold: Annotated[
        bool,
        typer.Option("--hold", help="Keep the GPUs until 'gpualloc release', whatever exits."),
    ] = False,
    output_format: Annotated[
        str,
        typer.Option(
            "--format",
            help="ids: '0,1'; env: export lines for eval; json: the lease and placement.",
        ),
    ] = "ids",
    name: NameOption = None,
    uuid: UuidOption = False,
    ignore_foreign: IgnoreForeignOption = None,
    wait: WaitOption = False,
    timeout: TimeoutOption = None,
    priority: PriorityOption = None,
    max_bypass: MaxBypassOption = None,
    min_utility: MinUtilityOption = None,
    min_bandwidth: MinBandwidthOption = None,
) -> None:
    """Allocate GPUs without running anything: for scripts, notebooks and prologs.

    The lease lives as long as the process given with --pid (by default the shell that ran
    gpualloc), or until released with --hold. In a shell:

    `eval "$(gpualloc alloc -n 2 --format env)"` exports CUDA_VISIBLE_DEVICES,
    CUDA_DEVICE_ORDER, GPUALLOC_LEASE_ID and GPUALLOC_GPUS into it; the GPUs come back when the
    shell exits or on `gpualloc release $GPUALLOC_LEASE_ID`.

    Inside a pipeline or a subshell the parent is not your shell: pass --pid $$ there.
    """
    from gpualloc.launcher.allocate import LeaseTerms

    if output_format not in FORMATS:
        raise RequestError(f"unknown --format {output_format!r}", hint="choose ids, env or json")
    if pid is not None and hold:
        raise RequestError("--pid and --hold both say how long the lease lives", hint="give one")
    owner = None if hold else (pid or os.getppid())
    if owner == 1:
        raise RequestError(
            "gpualloc's parent is init, so the lease would end at once",
            hint="give --pid of the process that uses the GPUs, or --hold",
        )
    want = build_want(
        count=count,
        pattern=pattern,
        sensitive=sensitive,
        exclude=exclude,
        require=require,
        policy=policy,
        score=score,
        drb_weights=drb_weights,
        explicit=gpus,
        min_utility=min_utility,
        min_bandwidth=min_bandwidth,
    )
    waiting = wait_options(wait=wait, timeout=timeout, priority=priority, max_bypass=max_bypass)
    host = open_host_ledger(ignore_foreign=STATE.setting("ignore_foreign", ignore_foreign))
    terms = LeaseTerms(
        source="alloc", pid=owner, hold=hold, command=_command_of(owner), name=name, announce=True
    )
    allocation = allocate(host, want, terms, waiting)
    warn(allocation.notes)
    _print_allocation(host, want, allocation, output_format, uuid)
    sys.stdout.flush()  # the id has reached the reader: only now is the lease confirmed
    host.confirm(allocation.lease.id)


def _command_of(pid: int | None) -> tuple[str, ...]:
    from gpualloc.ledger.liveness import command_line

    return () if pid is None else command_line(pid)


def _print_allocation(
    host: HostLedger, want: Want, allocation: Allocation, output_format: str, uuid: bool
) -> None:
    from gpualloc.cli.output import print_json, write_stdout
    from gpualloc.cli.plan import placement_json
    from gpualloc.launcher.environment import gpu_variables, shell_exports

    lease = allocation.lease
    chosen = [host.topology.gpu(g) for g in lease.indices]
    variables = gpu_variables(chosen, lease_id=lease.id, use_uuid=uuid)
    if output_format == "ids":
        write_stdout(variables["CUDA_VISIBLE_DEVICES"] + "\n")
    elif output_format == "env":
        write_stdout(shell_exports(variables))
    else:
        print_json(
            {
                "lease": lease_json(lease),
                "placement": placement_json(host.topology, want.request, allocation.placement),
                "environment": variables,
            }
        )


def lease_json(lease: Lease) -> dict[str, Any]:
    """A lease as ``status --json`` and ``alloc --format json`` print it, with ``orphaned``:
    its id never reached anyone (see :func:`gpualloc.ledger.occupancy.orphaned`)."""
    from gpualloc.ledger.occupancy import orphaned

    return {**lease.model_dump(mode="json"), "orphaned": orphaned(lease)}


def release_command(
    leases: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Argument(
            metavar="[LEASE]...",
            help="Lease ids (or unique prefixes of 4+ characters).",
            autocompletion=complete.lease_ids,
        ),
    ] = None,
    mine: Annotated[bool, typer.Option("--mine", help="Release every lease of yours.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Give GPUs back: the leases named, or all of yours with --mine.

    Only a lease's owner (or root) may release it: exit 12 otherwise, 13 for an unknown id. A
    job still running on released GPUs keeps running; the GPUs just stop being reserved for it.
    """
    from gpualloc.cli.output import print_json, write_stdout
    from gpualloc.ledger.occupancy import describe_lease

    if not leases and not mine:
        raise RequestError("nothing to release", hint="give lease ids, or --mine for all yours")
    host = open_host_ledger(ignore_foreign=True)
    result = host.release_leases(leases or [], mine=mine)
    if as_json:
        print_json(
            {
                "released": [lease_json(lease) for lease in result.released],
                "errors": [problem.message for problem in result.problems],
            }
        )
    else:
        lines = [f"released {describe_lease(lease)}" for lease in result.released]
        if mine and not result.released and not result.problems:
            lines.append("you hold no lease")
        write_stdout("".join(line + "\n" for line in lines))
    for problem in result.problems:
        sys.stderr.write(f"error: {problem.message}\n")
        if problem.hint:
            sys.stderr.write(f"hint: {problem.hint}\n")
    if result.problems:
        raise typer.Exit(int(result.problems[0].exit_code))


def gc_command(as_json: JsonOption = False) -> None:
    """Free the GPUs of leases whose jobs are gone, now, and say which.

    Every gpualloc command does this as it goes; gc does it explicitly (for cron or an epilog)
    and also removes lease lock files left behind by other users' jobs.
    """
    from gpualloc.cli.output import print_json, write_stdout
    from gpualloc.ledger.occupancy import describe_lease

    host = open_host_ledger(ignore_foreign=True)
    report = host.collect_garbage()
    warn(report.notes)
    if as_json:
        print_json(
            {
                "reaped": [lease_json(lease) for lease in report.reaped],
                "dropped_waiters": [w.model_dump(mode="json") for w in report.dropped_waiters],
                "removed_lock_files": report.removed_lock_files,
            }
        )
        return
    lines = [f"freed {describe_lease(lease)} (its job is gone)" for lease in report.reaped]
    lines += [
        f"dropped {w.user}'s waiting {w.request.gpus}-GPU job from the queue (pid {w.pid} is gone)"
        for w in report.dropped_waiters
    ]
    if report.removed_lock_files:
        lines.append(f"removed {len(report.removed_lock_files)} stale lease lock file(s)")
    write_stdout("\n".join(lines or ["nothing to collect: every lease is alive"]) + "\n")
