"""``gpualloc run``: place a job, record its lease, and exec it on its GPUs."""

from __future__ import annotations

import os
import shlex
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from gpualloc.cli import complete
from gpualloc.cli.host import allocate, open_host_ledger, say, warn
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
    from gpualloc.launcher.allocate import HostLedger, Want
    from gpualloc.launcher.binding import Binding, NumaMode
    from gpualloc.launcher.wait import WaitOptions
    from gpualloc.model.request import Placement

NumaOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--numa",
        help="auto: bind the job to its GPUs' NUMA nodes with numactl (CPU affinity when "
        "numactl is missing) when the topology is this host's; bind: the same, and fail if "
        "it cannot; none: never bind. Default: auto (GPUALLOC_NUMA, numa in config.toml).",
        show_default=False,
        autocompletion=complete.numa_modes,
    ),
]


def run_command(
    command: Annotated[
        list[str],
        typer.Argument(
            metavar="-- COMMAND [ARGS]...", help="The job, after -- (options after it are its own)."
        ),
    ],
    count: Annotated[
        Optional[int],  # noqa: UP045 - typer needs Optional on Python 3.10
        typer.Option("-n", "--num-gpus", min=1, help="Number of GPUs the job needs (default 1)."),
    ] = None,
    pattern: PatternOption = "ring",
    sensitive: SensitiveOption = None,
    exclude: ExcludeOption = None,
    require: RequireOption = None,
    policy: PolicyOption = None,
    score: ScoreOption = "auto",
    drb_weights: DrbWeightsOption = None,
    gpus: ExplicitGpusOption = None,
    numa: NumaOption = None,
    name: NameOption = None,
    uuid: UuidOption = False,
    ignore_foreign: IgnoreForeignOption = None,
    wait: WaitOption = False,
    timeout: TimeoutOption = None,
    priority: PriorityOption = None,
    max_bypass: MaxBypassOption = None,
    min_utility: MinUtilityOption = None,
    min_bandwidth: MinBandwidthOption = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run", help="Show the GPUs, environment, binding and argv; allocate nothing."
        ),
    ] = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="Do not print the lease line on stderr.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="With --dry-run: print JSON.")] = False,
) -> None:
    """Run a job on the best free GPUs: place it, record the lease, exec it.

    The job replaces gpualloc (same pid; signals and the exit status are the job's) with
    CUDA_VISIBLE_DEVICES in rank order, CUDA_DEVICE_ORDER=PCI_BUS_ID, GPUALLOC_LEASE_ID and
    GPUALLOC_GPUS set, under numactl bound to the GPUs' NUMA nodes. Its GPUs are free again as
    soon as it and every process it started have exited, however they end.

    Inside a Slurm job it places only on the job's GPUs (SLURM_STEP_GPUS, matched by device
    number) and keeps a ledger of the job's own, so one allocation can run a sweep of
    topology-placed sub-jobs; GPUALLOC_NO_SLURM=1 uses the host's ledger instead.

    With --wait it queues when the GPUs are taken and starts within half a second of its turn
    (first come, first served; a later job may start first only while an earlier one cannot;
    --priority classes). --min-bandwidth / --min-utility keep it waiting for a good placement
    even when enough GPUs are free.

    Exit codes: the job's own; 10 when the GPUs it needs are held (the message says by whom);
    124 when --wait reached --timeout; 9 when the request cannot fit this host at all; 127/126
    when the command is not found or not executable.

    Example: `gpualloc run -n 2 --sensitive -- python train.py`
    """
    from gpualloc.launcher.binding import NumaMode
    from gpualloc.launcher.command import resolve_program

    try:
        mode = NumaMode(STATE.setting("numa", numa))
    except ValueError:
        raise RequestError(f"unknown --numa {numa!r}", hint="choose auto, bind or none") from None
    if as_json and not dry_run:
        raise RequestError("--json applies to --dry-run", hint="add --dry-run")
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
    resolve_program(command[0], os.environ)  # 127/126 before any GPU is taken
    host = open_host_ledger(
        ignore_foreign=STATE.setting("ignore_foreign", ignore_foreign), create=not dry_run
    )
    if dry_run:
        _dry_run(host, want, command, mode, uuid, as_json)
        return
    _launch(host, want, command, mode, uuid=uuid, name=name, quiet=quiet, waiting=waiting)


def _binding(host: HostLedger, placement: Placement, mode: NumaMode) -> Binding:
    from gpualloc.launcher.binding import HostNuma, NumaMode, plan_binding

    nodes = [host.topology.gpu(g).numa_node for g in placement.gpus]
    numa_view = HostNuma.read() if host.this_host and mode is not NumaMode.NONE else None
    return plan_binding(nodes, mode, this_host=host.this_host, host=numa_view)


def _launch(
    host: HostLedger,
    want: Want,
    command: list[str],
    mode: NumaMode,
    *,
    uuid: bool,
    name: str | None,
    quiet: bool,
    waiting: WaitOptions | None,
) -> None:
    from gpualloc.launcher.allocate import LeaseTerms
    from gpualloc.launcher.command import job_argv
    from gpualloc.launcher.environment import gpu_variables, job_environment
    from gpualloc.launcher.exec import exec_job

    terms = LeaseTerms(
        source="run",
        pid=os.getpid(),
        lock=True,
        command=tuple(command),
        name=name,
        process_group=os.getpid() if os.getpgrp() == os.getpid() else None,
    )
    allocation = allocate(host, want, terms, waiting)
    warn(allocation.notes)
    lease = allocation.lease
    try:
        binding = _binding(host, allocation.placement, mode)
        chosen = [host.topology.gpu(g) for g in allocation.placement.gpus]
        variables = gpu_variables(chosen, lease_id=lease.id, use_uuid=uuid)
        if binding.method == "affinity":
            warn([binding.reason])
        if not quiet:
            where = binding.describe() if binding.method == "numactl" else "not NUMA-bound"
            say(
                f"lease {lease.id}: GPU {','.join(map(str, lease.indices))} "
                f"({where}) for {shlex.join(command)}"
            )
        exec_job(job_argv(command, binding), job_environment(os.environ, variables), binding)
    except BaseException:
        if allocation.lock_fd is not None:
            os.close(allocation.lock_fd)
        host.release(lease.id)
        raise


def _dry_run(
    host: HostLedger,
    want: Want,
    command: list[str],
    mode: NumaMode,
    uuid: bool,
    as_json: bool,
) -> None:
    from gpualloc.cli.output import print_json, write_stdout
    from gpualloc.cli.plan import placement_json
    from gpualloc.launcher.allocate import choose
    from gpualloc.launcher.command import job_argv
    from gpualloc.launcher.environment import LEASE_ID_VARIABLE, gpu_variables

    txn = host.snapshot()
    warn(txn.notes)
    placement = choose(host.topology, host.occupancy(txn.ledger), want)
    binding = _binding(host, placement, mode)
    chosen = [host.topology.gpu(g) for g in placement.gpus]
    variables = gpu_variables(chosen, lease_id="(new lease id)", use_uuid=uuid)
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
    lines = [
        f"would run on GPU {','.join(map(str, placement.gpus))} "
        f"(policy {placement.policy}: {placement.objective})",
        f"  scores: effective {s.effective_gbps} GB/s, aggregated {s.aggregated_gbps} GB/s, "
        f"utility {s.utility:.3f}",
        f"  NUMA: {binding.describe()}",
    ]
    if binding.method == "none" and binding.nodes and host.this_host is False:
        lines.append(f"        on its own host: {shlex.join(binding.as_if_bound())}")
    lines.append("  environment (the rest is passed unchanged):")
    lines += [f"    {key}={value}" for key, value in variables.items()]
    lines.append(f"  argv: {shlex.join(argv)}")
    lines.append("nothing was allocated (--dry-run)")
    write_stdout("\n".join(lines) + "\n")
