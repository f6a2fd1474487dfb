"""What ``run``, ``alloc`` and ``release`` do, on whichever host :func:`.open_ledger.
open_host_ledger` opens: each builds the job's options and the lease's terms and asks the
:class:`~gpualloc.host.protocol.Host` (``start``, ``release_leases``); the host places and
records, and :func:`gpualloc.host.launching.launch_granted` execs the job. Through the broker
no topology, no placement engine and no msgspec is loaded (``tests/test_startup_imports.py``).

:mod:`gpualloc.cli.run` and :mod:`gpualloc.cli.leases` declare these commands and hand
:func:`call` every parameter's value, as the parser read it; the options that describe the job
arrive as one :class:`~gpualloc.model.job_fields.JobFields` (the fields of
:class:`~gpualloc.model.job.JobOptions`, which the host makes of them), the command's own by
name, with no default of their own here: the declarations hold them (tests/test_cli.py checks
that each work function takes exactly its command's parameters).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from gpualloc.cli.open_ledger import (
    alloc_owner,
    open_host_ledger,
    print_allocation,
    say,
    start,
    wait_options,
    warn,
)
from gpualloc.cli.state import STATE
from gpualloc.errors import ExitCode, FileAccessError, RequestError
from gpualloc.model.job_fields import JobFields, declared_memory_bytes, pick_fields

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any

    from gpualloc.errors import GpuallocError
    from gpualloc.host.protocol import Host
    from gpualloc.launcher.binding import Binding, NumaMode
    from gpualloc.launcher.verify_terms import VerifyTerms
    from gpualloc.model.request import Placement
    from gpualloc.model.share import LeasedShare, ShareMode
    from gpualloc.model.topology import GpuProcess
    from gpualloc.placement.want import Want

WORK = ("run_job", "alloc_gpus", "release_gpus")
"""The functions :func:`call` runs; the first two take the job's :class:`JobFields`."""


def call(work: str, values: Mapping[str, Any]) -> None:
    """Run the function named ``work`` with a command's parameters: the job's options bundled
    into its JobFields."""
    function = globals()[work]  # looked up now: tests stand in for the functions
    if work == "release_gpus":
        function(**values)
        return
    job, own = pick_fields(values)
    function(job, **own)


# ---- run -------------------------------------------------------------------------------------


def run_job(
    job: JobFields,
    *,
    command: list[str],
    numa: str | None,
    name: str | None,
    time: str | None,
    signal: str | None,
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
    from gpualloc.host.lease_terms import LeaseTerms
    from gpualloc.launcher.command import resolve_program

    mode = numa_mode(numa)
    if as_json and not dry_run:
        raise RequestError("--json applies to --dry-run", hint="add --dry-run")
    job = with_policy(job)
    waiting = wait_options(wait=wait, timeout=timeout, priority=priority, max_bypass=max_bypass)
    resolve_program(command[0], os.environ)  # 127/126 before any GPU is taken
    host = open_host_ledger(
        ignore_foreign=STATE.setting("ignore_foreign", ignore_foreign),
        create=not dry_run,
        allow_unhealthy=allow_unhealthy,
        full=dry_run,
    )
    if dry_run:
        from gpualloc.host.launching import check_before_placing
        from gpualloc.model.job import JobOptions
        from gpualloc.placement.options import want_of

        want = want_of(JobOptions(**job), STATE.config())
        check_before_placing(host.topology, want, declared_memory_bytes(job), uuid=False)
        _dry_run(host, want, command, mode, uuid, as_json)
        return
    sharing: ShareMode = "time-sliced"
    if job.get("share"):
        from gpualloc.launcher.sharing import share_mode

        sharing = share_mode(os.environ)
    terms = LeaseTerms(
        source="run",
        pid=os.getpid(),
        lock=True,
        command=tuple(command),
        name=name,
        process_group=os.getpid() if os.getpgrp() == os.getpid() else None,
        shareable=bool(job.get("shareable")),
        memory_bytes=declared_memory_bytes(job),
        share_mode=sharing,
        time_limit_s=asked_time_limit(time),
        signal=asked_signal(signal),
    )
    grant = start(host, job, terms, waiting, uuid=uuid)
    warn(grant.notes)
    from gpualloc.host.launching import launch_granted

    verify, look = job_verifier(host, grant.this_host)
    launch_granted(
        host, grant, command, mode, quiet=quiet, verify=verify, look=look, say=say, warn=warn
    )


def numa_mode(text: str | None) -> NumaMode:
    """``--numa`` (else the ``numa`` setting) read; exit 2 naming the modes."""
    from gpualloc.launcher.binding import NumaMode

    try:
        return NumaMode(STATE.setting("numa", text))
    except ValueError:
        from gpualloc.model.option_values import unknown_choice

        raise unknown_choice("--numa", text, [mode.value for mode in NumaMode]) from None


def with_policy(job: JobFields) -> JobFields:
    """``job`` with its policy resolved as this user's settings say (``--policy``, else the
    configured one): the host places with it, the broker with the client's own."""
    return {**job, "policy": STATE.setting("policy", job.get("policy"))}


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


def job_verifier(
    host: Host, this_host: bool
) -> tuple[VerifyTerms | None, Callable[[], list[GpuProcess]] | None]:
    """The terms of the verifier that checks for ``verify.grace`` that the job runs on its
    lease's GPUs (tests/test_verified_launch.py), and where it looks; no terms when
    ``verify.grace`` is 0 or, on the embedded ledger, nothing it looks at can change."""
    grace = STATE.setting("verify.grace")
    if grace <= 0:
        return None, None
    look = None
    if host.broker_socket is None:  # the broker's verifier asks the broker where jobs run
        look = _process_lister(host, this_host)
        if look is None:
            return None, None  # a bundled host: its processes never change
    from gpualloc.launcher.verify_terms import VerifyTerms

    return VerifyTerms(grace_s=grace, action=STATE.setting("verify.action")), look


def _process_lister(host: Host, this_host: bool) -> Callable[[], list[GpuProcess]] | None:
    """Where the verifier looks for the job's processes: NVML on this host, the topology file
    read again on a recorded one; None for a bundled topology (its processes never change)."""
    if this_host:
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
    import shlex

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
    job: JobFields,
    *,
    pid: int | None,
    hold: bool,
    output_format: str,
    name: str | None,
    time: str | None,
    signal: str | None,
    uuid: bool,
    ignore_foreign: bool | None,
    wait: bool,
    timeout: str | None,
    priority: str | None,
    max_bypass: int | None,
    allow_unhealthy: bool,
) -> None:
    """``gpualloc alloc``: allocate GPUs without running anything (see its ``--help``)."""
    from gpualloc.host.lease_terms import LeaseTerms

    owner = alloc_owner(output_format, pid, hold)
    job = with_policy(job)
    waiting = wait_options(wait=wait, timeout=timeout, priority=priority, max_bypass=max_bypass)
    host = open_host_ledger(
        ignore_foreign=STATE.setting("ignore_foreign", ignore_foreign),
        allow_unhealthy=allow_unhealthy,
        full=False,
    )
    terms = LeaseTerms(
        source="alloc",
        pid=owner,
        hold=hold,
        command=_command_of(owner),
        name=name,
        announce=True,
        shareable=bool(job.get("shareable")),
        memory_bytes=declared_memory_bytes(job),
        time_limit_s=asked_time_limit(time),
        signal=asked_signal(signal),
    )
    grant = start(host, job, terms, waiting, uuid=uuid)
    warn(grant.notes)
    host.start_time_limit_watch(grant)  # alloc --pid's process, on the file ledger
    try:
        print_allocation(output_format, grant.variables, grant.views)
        sys.stdout.flush()  # the id has reached the reader: only now is the lease confirmed
    except FileAccessError:  # stdout closed or full: nobody has the id, so nobody holds it
        host.release(grant.lease_id)
        raise
    host.confirm(grant.lease_id)


def _command_of(pid: int | None) -> tuple[str, ...]:
    from gpualloc.ledger.liveness import command_line

    return () if pid is None else command_line(pid)


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

    check_release(leases or [], mine=mine, include_running=include_running)
    if grace is not None and not evict_shared:
        raise RequestError("--grace applies to --evict-shared", hint="add --evict-shared")
    if include_running and evict_shared:
        raise RequestError("--include-running applies to releasing, not to --evict-shared")
    host = open_host_ledger(ignore_foreign=True, full=False)
    if evict_shared:
        _evict_shared(host, leases or [], mine, grace, as_json)
        return
    receipt = host.release_receipt(leases or [], mine=mine, include_running=include_running)
    report_release(receipt, mine=mine, as_json=as_json)
    _report_problems(receipt.problems)


def _report_problems(problems: Sequence[GpuallocError]) -> None:
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


def asked_time_limit(text: str | None) -> float | None:
    """``--time`` as a lease's terms carry it: None when not given (the host's default
    applies), 0 for no limit, else seconds; exit 2 naming the forms for anything else."""
    if text is None:
        return None
    from gpualloc.time_limits import parse_time_limit

    try:
        return parse_time_limit(text) or 0.0
    except ValueError as bad:
        raise RequestError(f"--time: {bad}", hint="see --help for the forms") from None


def asked_signal(text: str | None) -> tuple[int, float, bool] | None:
    """``--signal`` as a lease's terms carry it (:func:`gpualloc.time_limits.parse_signal`);
    exit 2 naming the forms for anything else."""
    if text is None:
        return None
    from gpualloc.time_limits import parse_signal

    try:
        return parse_signal(text)
    except ValueError as bad:
        raise RequestError(f"--signal: {bad}", hint="see --help for the forms") from None
