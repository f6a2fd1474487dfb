"""``gpualloc run``, declared: its options and help (:mod:`.jobs` does the work)."""

from __future__ import annotations

from typing import Any

from gpualloc.cli.declare import Arg, Command, flag, job_options, value


def run_command(**values: Any) -> None:
    """Run a job on the best free GPUs: place it, record the lease, exec it.

    The job is the command after -- (options after it are its own).

    The job replaces gpualloc (same pid; signals and the exit status are the job's) with
    CUDA_VISIBLE_DEVICES in rank order, CUDA_DEVICE_ORDER=PCI_BUS_ID, GPUALLOC_LEASE_ID and
    GPUALLOC_GPUS set, under numactl bound to the GPUs' NUMA nodes. Its GPUs are free again as
    soon as it and every process it started have exited, however they end.

    Inside a Slurm job it places only on the job's GPUs (SLURM_STEP_GPUS, matched by device
    number) and keeps a ledger of the job's own, so one allocation can run a sweep of
    topology-placed sub-jobs; GPUALLOC_NO_SLURM=1 uses the host's ledger instead.

    With --share it runs beside other jobs on one GPU (--shareable leases, or GPUs only shared
    jobs use, else a free one); the owner of the lease it shares may evict it (release
    --evict-shared), and then it gets SIGTERM, and SIGKILL 10 s later.

    With --wait it queues when the GPUs are taken and starts within half a second of its turn
    (first come, first served; a later job may start first only while an earlier one cannot;
    --priority classes). --min-bandwidth / --min-utility keep it waiting for a good placement
    even when enough GPUs are free.

    Exit codes: the job's own; 10 when the GPUs it needs are held (the message says by whom);
    124 when --wait reached --timeout; 9 when the request cannot fit this host at all; 127/126
    when the command is not found or not executable.

    Example: `gpualloc run -n 2 --sensitive -- python train.py`
    """
    work("run_job", values)


def work(name: str, values: dict[str, Any]) -> None:
    """Do ``name`` (a :data:`gpualloc.cli.jobs.WORK` function) on this command's host."""
    from gpualloc.cli import jobs

    jobs.call(name, values)


RUN = Command(
    "run",
    run_command,
    options=(
        *job_options("run"),
        value(
            "--numa",
            metavar="MODE",
            completion="numa_modes",
            help="auto: bind the job to its GPUs' NUMA nodes with numactl (CPU affinity when "
            "numactl is missing) when the topology is this host's; bind: the same, and fail if "
            "it cannot; none: never bind. Default: auto (GPUALLOC_NUMA, numa in config.toml).",
        ),
        flag("--dry-run", help="Show the GPUs, environment, binding and argv; allocate nothing."),
        flag("--quiet", "-q", help="Do not print the lease line on stderr."),
        flag("--json", dest="as_json", help="With --dry-run: print JSON."),
    ),
    argument=Arg("command", "-- COMMAND [ARGS]...", required=True),
    job_argv=True,
)
