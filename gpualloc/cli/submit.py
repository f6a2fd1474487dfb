"""``gpualloc submit``, declared: its options and help (:mod:`gpualloc.batch` does the work)."""

from __future__ import annotations

from typing import Any

from gpualloc.cli.declare import Arg, Command, flag, job_options, json_flag, value


def submit_command(**values: Any) -> None:
    """Submit a job: it waits in the host's queue and runs when its turn comes, after you log out.

    Returns at once with the job's id. The job is run by a supervisor, a process of yours
    detached from the terminal (its own session; SIGHUP ignored): it waits in the queue as
    run --wait does, starts the job with run's environment, binding and checks, writes its
    stdout and stderr to its log and records how it ended. 'gpualloc jobs' lists your jobs,
    'gpualloc log ID' shows a log, 'gpualloc cancel ID' ends a job, 'gpualloc show ID' says
    everything about one. A job survives the end of your session and a restart of the
    host's broker; not a reboot ('jobs' then says lost).

    SCRIPT may be a batch script: its #SBATCH lines of the options that mean something on
    one host (--job-name, --time, --output, --error, --signal, --dependency, --array,
    --chdir, and the GPU count of --gpus, --gres=gpu:N) are read, so the same script runs
    under sbatch; #GPUALLOC lines take submit's own options. Options given here win. A
    batch script is copied when submitted, as sbatch copies it.

    The job gets GPUALLOC_JOB_ID, GPUALLOC_JOB_NAME and, in an array, GPUALLOC_ARRAY_JOB_ID
    and GPUALLOC_ARRAY_TASK_ID (never SLURM_* variables).

    Example: `gpualloc submit -n 2 --time 4h -- python train.py`
    """
    from gpualloc.cli.batch_jobs import submitted

    submitted(values)


SUBMIT = Command(
    "submit",
    submit_command,
    options=(
        *job_options("submit"),
        value(
            "--output",
            "-o",
            metavar="PATTERN",
            help="The job's log (stdout, and stderr unless --error): %j is the job's id, %x "
            "its name, %u your user, %A and %a the array's id and task. Relative to the "
            "job's directory of work. Default: output.log in the job's own directory "
            "($XDG_STATE_HOME/gpualloc/jobs/ID).",
        ),
        value("--error", "-e", metavar="PATTERN", help="The job's stderr, apart (as --output)."),
        value(
            "--dependency",
            "-d",
            metavar="LIST",
            help="Start only after other jobs of yours, as Slurm writes it: after:ID[:ID] "
            "(started), afterany:ID (ended), afterok:ID (completed, exit 0), afternotok:ID "
            "(ended otherwise), singleton (no earlier job of this name still pending or "
            "running); joined by ',' (all) or '?' (any). A dependency that can never be met "
            "cancels the job.",
        ),
        value(
            "--array",
            "-a",
            metavar="SPEC",
            help="Submit one job per task id: 0-15, 1,3,5-7, 0-10:2; %4 runs at most 4 at "
            "once. Each task gets GPUALLOC_ARRAY_TASK_ID.",
        ),
        value("--chdir", "-D", metavar="DIR", help="The job's directory of work (default: here)."),
        value(
            "--numa",
            metavar="MODE",
            completion="numa_modes",
            help="auto, bind or none, as for run (default: auto).",
        ),
        flag("--parsable", help="Print only the job's id (arrays: the array's id)."),
        json_flag("Print the submitted jobs as JSON."),
    ),
    argument=Arg("command", "SCRIPT [ARGS]... | -- COMMAND [ARGS]...", required=True),
    job_argv=True,
)
