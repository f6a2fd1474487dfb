"""What ``run``, ``alloc`` and ``release`` do on the embedded ledger (or through the broker
for the command lines its lean client, :mod:`.brokered`, leaves to this module).

:mod:`gpualloc.cli.run` and :mod:`gpualloc.cli.leases` declare these commands and hand
:func:`call` every parameter's value, as the parser read it; the options that describe the job
arrive as one :class:`~gpualloc.model.job.JobOptions`, the command's own by name, with
no default of their own here: the declarations hold them (tests/test_cli.py checks that each
work function takes exactly its command's parameters).
"""

from __future__ import annotations

import os
import shlex
import sys
from typing import TYPE_CHECKING

from gpualloc.cli.open_ledger import (
    alloc_owner,
    allocate,
    open_host_ledger,
    print_allocation,
    say,
    wait_options,
    warn,
)
from gpualloc.cli.state import STATE
from gpualloc.errors import ExitCode, FileAccessError, RequestError
from gpualloc.model.job import JobOptions
from gpualloc.placement.options import want_of

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    from gpualloc.host.protocol import Host
    from gpualloc.host.queue import WaitOptions
    from gpualloc.host.terms import Allocation, LeaseTerms
    from gpualloc.launcher.binding import Binding, NumaMode
    from gpualloc.ledger.schema import Lease
    from gpualloc.model.request import Placement
    from gpualloc.model.share import LeasedShare
    from gpualloc.model.topology import Gpu, GpuProcess
    from gpualloc.placement.want import Want

WORK = ("run_job", "alloc_gpus", "release_gpus")
"""The functions :func:`call` runs; the first two take a :class:`JobOptions`."""


def call(work: str, values: Mapping[str, Any], *, broker_tried: bool = False) -> None:
    """Run the function named ``work`` with a command's parameters: the job's options bundled
    into one JobOptions. Through the broker's lean client first (:mod:`.brokered`), unless the
    caller tried it already."""
    from gpualloc.cli import brokered

    function = globals()[work]  # looked up now: tests stand in for the functions
    if not broker_tried and brokered.call(work, values):
        return
    if work == "release_gpus":
        function(**values)
        return
    job, own = JobOptions.pick(values)
    function(job, **own)


# ---- run -------------------------------------------------------------------------------------


def run_job(
    job: JobOptions,
    *,
    command: list[str],
    numa: str | None,
    name: str | None,
    uuid: bool,
    ignore_foreign: bool | None,
    wait: bool,
    timeout: str | None,
    priority: str | None,
    max_bypass: int | None,
    allow_unhealthy: bool,
    dry_run: bool,
    quiet: bool,
    as_json: bool,
) -> None:
    """``gpualloc run``: place ``job``, record its lease, exec it (see its ``--help``)."""
    from gpualloc.host.terms import LeaseTerms
    from gpualloc.launcher.binding import NumaMode
    from gpualloc.launcher.command import resolve_program
    from gpualloc.launcher.sharing import share_mode

    try:
        mode = NumaMode(STATE.setting("numa", numa))
    except ValueError:
        from gpualloc.model.option_values import unknown_choice

        raise unknown_choice("--numa", numa, [mode.value for mode in NumaMode]) from None
    if as_json and not dry_run:
        raise RequestError("--json applies to --dry-run", hint="add --dry-run")
    want = want_of(job, STATE.config())
    waiting = wait_options(wait=wait, timeout=timeout, priority=priority, max_bypass=max_bypass)
    resolve_program(command[0], os.environ)  # 127/126 before any GPU is taken
    host = open_host_ledger(
        ignore_foreign=STATE.setting("ignore_foreign", ignore_foreign),
        create=not dry_run,
        allow_unhealthy=allow_unhealthy,
        full=dry_run,
    )
    declared = _declared_memory(host, want, job)  # --dry-run too: a bad --mem is refused there
    if dry_run:
        _dry_run(host, want, command, mode, uuid, as_json)
        return
    _check_uuids(host, want, uuid)
    terms = LeaseTerms(
        source="run",
        pid=os.getpid(),
        lock=True,
        command=tuple(command),
        name=name,
        process_group=os.getpid() if os.getpgrp() == os.getpid() else None,
        shareable=job.shareable,
        memory_bytes=declared,
        share_mode=share_mode(os.environ) if job.share else "time-sliced",
    )
    _launch(host, want, terms, command, mode, uuid=uuid, quiet=quiet, waiting=waiting)


def _binding(host: Host, placement: Placement, mode: NumaMode) -> Binding:
    from gpualloc.launcher.binding import HostNuma, NumaMode, plan_binding

    nodes = [host.topology.gpu(g).numa_node for g in placement.parent_gpus]
    numa_view = HostNuma.read() if host.this_host and mode is not NumaMode.NONE else None
    return plan_binding(nodes, mode, this_host=host.this_host, host=numa_view)


def _variables(
    host: Host,
    gpus: tuple[int, ...],
    mig: tuple[tuple[int, int], ...],
    *,
    lease_id: str | None,
    uuid: bool,
    share: LeasedShare | None = None,
) -> dict[str, str]:
    from gpualloc.launcher.environment import job_variables

    return job_variables(host.topology, gpus, mig, lease_id=lease_id, uuid=uuid, share=share)


def _declared_memory(host: Host, want: Want, job: JobOptions) -> int | None:
    """The memory a ``--shareable`` job declares (``--mem``), refused (exit 9) when it is more
    than any GPU the job could be placed on has (:func:`~gpualloc.placement.want.
    check_declared_memory`)."""
    declared = job.declared_memory_bytes()
    if declared is not None:
        from gpualloc.placement.want import check_declared_memory

        check_declared_memory(_candidates(host, want), declared)
    return declared


def _candidates(host: Host, want: Want) -> list[Gpu]:
    """The GPUs a job could be placed on: those ``--gpus`` names, else all but ``--exclude``."""
    if want.explicit is not None:
        return [host.topology.gpu(g) for g in want.explicit]
    excluded = want.request.excluded
    return [g for g in host.topology.gpus if g.index not in excluded]


def _check_uuids(host: Host, want: Want, uuid: bool) -> None:
    """With ``--uuid``, refuse before any GPU is taken when a GPU the job could be placed on
    has no usable UUID: after the lease is written, a refusal changes the ledger."""
    if not uuid or want.mig is not None:
        return
    from gpualloc.launcher.environment import check_uuids

    check_uuids(_candidates(host, want))


def _launch(
    host: Host,
    want: Want,
    terms: LeaseTerms,
    command: list[str],
    mode: NumaMode,
    *,
    uuid: bool,
    quiet: bool,
    waiting: WaitOptions | None,
) -> None:
    from gpualloc.launcher.launch import JobLaunch, SharedJob, launch
    from gpualloc.launcher.sharing import share_notes
    from gpualloc.ledger.occupancy import held_devices

    allocation = allocate(host, want, terms, waiting)
    warn(allocation.notes)
    lease = allocation.lease
    try:
        shared = None
        if lease.share is not None:
            ledger_file = host.ledger_file()
            assert ledger_file is not None  # the lease was just written there
            notes = tuple(share_notes(lease.share, os.environ))
            shared = SharedJob(lease.share.mode, lease.share.background, ledger_file, notes)
        job = JobLaunch(
            command=command,
            lease_id=lease.id,
            held=held_devices(lease, ranked=True),
            numa_nodes=[host.topology.gpu(g).numa_node for g in allocation.placement.parent_gpus],
            this_host=host.this_host,
            variables=_variables(
                host, lease.indices, lease.mig_keys, lease_id=lease.id, uuid=uuid, share=lease.share
            ),
            shared=shared,
        )
        launch(job, mode, quiet=quiet, start_verifier=_verifier(host, lease), say=say, warn=warn)
    except BaseException:
        if allocation.lock_fd is not None:
            os.close(allocation.lock_fd)
        host.release(lease.id)
        raise


def _verifier(host: Host, lease: Lease) -> Callable[[], None] | None:
    """What checks for ``verify.grace`` that the job runs on its lease's GPUs
    (tests/test_verified_launch.py), or None when ``verify.grace`` is 0."""
    import functools

    grace = STATE.setting("verify.grace")
    if grace <= 0:
        return None
    look = _process_lister(host)
    if look is None and host.broker_socket is None:
        return None  # the embedded ledger verifies nothing that cannot change (a bundled host)
    from gpualloc.launcher.verify import VerifyTerms

    terms = VerifyTerms(grace_s=grace, action=STATE.setting("verify.action"))
    return functools.partial(host.start_verifier, lease, terms, look)


def _process_lister(host: Host) -> Callable[[], list[GpuProcess]] | None:
    """Where the verifier looks for the job's processes: NVML on this host, the topology file
    read again on a recorded one; None for a bundled topology (its processes never change)."""
    if host.this_host:
        from gpualloc.discovery.live import live_processes

        topology = host.topology
        return lambda: live_processes(topology).processes
    path = STATE.topology_file()
    if path is None:
        return None
    from gpualloc.discovery.recorded import load_topology_file

    return lambda: list(load_topology_file(path).processes)


def _dry_run(
    host: Host,
    want: Want,
    command: list[str],
    mode: NumaMode,
    uuid: bool,
    as_json: bool,
) -> None:
    from gpualloc.cli.output import figure, print_json, write_stdout
    from gpualloc.json_views import placement_json
    from gpualloc.launcher.command import job_argv
    from gpualloc.launcher.environment import LEASE_ID_VARIABLE
    from gpualloc.launcher.sharing import share_mode
    from gpualloc.placement.choose import choose

    txn = host.snapshot()
    warn(txn.notes)
    placement = choose(
        host.topology, host.occupancy(txn.ledger), want, budget_s=host.placement_budget_s
    )
    binding = _binding(host, placement, mode)
    share = (
        host.leased_share(want.share, placement.gpus[0], share_mode(os.environ))
        if want.share is not None
        else None
    )
    variables = _variables(
        host,
        placement.gpus,
        placement.mig_devices,
        lease_id="(new lease id)",
        uuid=uuid,
        share=share,
    )
    argv = job_argv(command, binding)
    if as_json:
        variables[LEASE_ID_VARIABLE] = None  # type: ignore[assignment]
        print_json(
            {
                "dry_run": True,
                "placement": placement_json(host.topology, want.request, placement),
                "environment": variables,
                "numa": binding.as_json(),
                "argv": argv,
            }
        )
        return
    s = placement.scores
    if placement.mig_devices:
        lines = [f"would run on {placement.objective}"]
    elif share is not None:
        lines = [f"would run shared ({share.mode}) on {placement.objective}"]
    else:
        lines = [
            f"would run on GPU {','.join(map(str, placement.gpus))} "
            f"(policy {placement.policy}: {placement.objective})",
            f"  scores: effective {figure(s.effective_gbps)}, "
            f"aggregated {figure(s.aggregated_gbps)}, "
            f"utility {s.utility:.3f}",
        ]
    lines.append(f"  NUMA: {binding.describe()}")
    if binding.method == "none" and binding.nodes and host.this_host is False:
        lines.append(f"        on its own host: {shlex.join(binding.as_if_bound())}")
    lines.append("  environment (the rest is passed unchanged):")
    lines += [f"    {key}={value}" for key, value in variables.items()]
    lines.append(f"  argv: {shlex.join(argv)}")
    lines.append("nothing was allocated (--dry-run)")
    write_stdout("\n".join(lines) + "\n")


# ---- alloc -----------------------------------------------------------------------------------


def alloc_gpus(
    job: JobOptions,
    *,
    pid: int | None,
    hold: bool,
    output_format: str,
    name: str | None,
    uuid: bool,
    ignore_foreign: bool | None,
    wait: bool,
    timeout: str | None,
    priority: str | None,
    max_bypass: int | None,
    allow_unhealthy: bool,
) -> None:
    """``gpualloc alloc``: allocate GPUs without running anything (see its ``--help``)."""
    from gpualloc.host.terms import LeaseTerms

    owner = alloc_owner(output_format, pid, hold)
    want = want_of(job, STATE.config())
    waiting = wait_options(wait=wait, timeout=timeout, priority=priority, max_bypass=max_bypass)
    host = open_host_ledger(
        ignore_foreign=STATE.setting("ignore_foreign", ignore_foreign),
        allow_unhealthy=allow_unhealthy,
        full=False,
    )
    _check_uuids(host, want, uuid)
    declared = _declared_memory(host, want, job)
    terms = LeaseTerms(
        source="alloc",
        pid=owner,
        hold=hold,
        command=_command_of(owner),
        name=name,
        announce=True,
        shareable=job.shareable,
        memory_bytes=declared,
    )
    allocation = allocate(host, want, terms, waiting)
    warn(allocation.notes)
    try:
        _print_allocation(host, want, allocation, output_format, uuid)
        sys.stdout.flush()  # the id has reached the reader: only now is the lease confirmed
    except FileAccessError:  # stdout closed or full: nobody has the id, so nobody holds it
        host.release(allocation.lease.id)
        raise
    host.confirm(allocation.lease.id)


def _command_of(pid: int | None) -> tuple[str, ...]:
    from gpualloc.ledger.liveness import command_line

    return () if pid is None else command_line(pid)


def _print_allocation(
    host: Host, want: Want, allocation: Allocation, output_format: str, uuid: bool
) -> None:
    from gpualloc.json_views import lease_json, placement_json

    lease = allocation.lease
    variables = _variables(host, lease.indices, lease.mig_keys, lease_id=lease.id, uuid=uuid)
    print_allocation(
        output_format,
        variables,
        lambda: (
            lease_json(lease),
            placement_json(host.topology, want.request, allocation.placement),
        ),
    )


# ---- release ---------------------------------------------------------------------------------


def release_gpus(
    *,
    leases: list[str] | None,
    mine: bool,
    include_running: bool,
    evict_shared: bool,
    grace: str | None,
    as_json: bool,
) -> None:
    """``gpualloc release``: give the leases named, or all of yours, back (see its ``--help``);
    with ``--evict-shared``, end the shared jobs beside them instead."""
    from gpualloc.cli.open_ledger import check_release, report_release
    from gpualloc.json_views import lease_json
    from gpualloc.ledger.occupancy import describe_lease

    check_release(leases or [], mine=mine, include_running=include_running)
    if grace is not None and not evict_shared:
        raise RequestError("--grace applies to --evict-shared", hint="add --evict-shared")
    if include_running and evict_shared:
        raise RequestError("--include-running applies to releasing, not to --evict-shared")
    host = open_host_ledger(ignore_foreign=True, full=False)
    if evict_shared:
        _evict_shared(host, leases or [], mine, grace, as_json)
        return
    result = host.release_leases(leases or [], mine=mine, include_running=include_running)
    report_release(
        mine=mine,
        as_json=as_json,
        released=(
            [describe_lease(lease) for lease in result.released],
            [lease_json(lease) for lease in result.released],
        ),
        kept=(
            [describe_lease(lease) for lease in result.kept],
            [lease_json(lease) for lease in result.kept],
        ),
        errors=[problem.message for problem in result.problems],
    )
    _report_problems(result.problems)


def _report_problems(problems: list) -> None:
    from gpualloc.cli.output import write_error

    for problem in problems:
        write_error(problem.message, problem.hint)
    if problems:
        sys.exit(int(problems[0].exit_code))


def _evict_shared(
    host: Host, leases: list[str], mine: bool, grace: str | None, as_json: bool
) -> None:
    """Mark the shared jobs for eviction, then wait (their watchers' SIGTERM, the grace, their
    SIGKILL, a margin) until their leases are gone."""
    import time

    from gpualloc.cli.output import print_json, write_stdout
    from gpualloc.json_views import lease_json
    from gpualloc.launcher.sharing import EVICTION_GRACE_S
    from gpualloc.ledger.occupancy import describe_lease
    from gpualloc.model.option_values import parse_duration

    grace_s = parse_duration(grace, "--grace") if grace is not None else EVICTION_GRACE_S
    result = host.evict(leases, mine=mine, grace_s=grace_s)
    marked = {lease.id: lease for lease in result.released}
    deadline = time.monotonic() + grace_s + 5.0
    remaining = set(marked)
    while remaining and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = {lease.id for lease in host.snapshot().ledger.leases}
        remaining &= alive
    if as_json:
        print_json(
            {
                "evicted": [lease_json(marked[i]) for i in marked if i not in remaining],
                "still_running": [lease_json(marked[i]) for i in sorted(remaining)],
                "errors": [problem.message for problem in result.problems],
            }
        )
    else:
        lines = [f"evicted {describe_lease(marked[i])}" for i in marked if i not in remaining]
        lines += [
            f"still running after {grace_s + 5:g}s: {describe_lease(marked[i])}"
            for i in sorted(remaining)
        ]
        if not marked and not result.problems:
            lines.append("no shared job runs beside " + ("your leases" if mine else "it"))
        write_stdout("".join(line + "\n" for line in lines))
    _report_problems(result.problems)
    if remaining:
        sys.exit(int(ExitCode.BUSY))
