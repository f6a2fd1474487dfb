"""``gpualloc alloc``, ``release`` and ``gc``: leases without exec, for scripts and prologs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpualloc.cli.declare import Arg, Command, flag, job_options, json_flag, value
from gpualloc.cli.run import work
from gpualloc.model.printable import count_of

if TYPE_CHECKING:
    from gpualloc.ledger.idle import Expiry
    from gpualloc.ledger.schema import Lease


def alloc_command(**values: Any) -> None:
    """Allocate GPUs without running anything: for scripts, notebooks and prologs.

    The lease lives as long as the process given with --pid (by default the shell that ran
    gpualloc), or until released with --hold. In a shell:

    `eval "$(gpualloc alloc -n 2 --format env)"` exports CUDA_VISIBLE_DEVICES,
    CUDA_DEVICE_ORDER, GPUALLOC_LEASE_ID and GPUALLOC_GPUS into it; the GPUs come back when the
    shell exits or on `gpualloc release $GPUALLOC_LEASE_ID`.

    Inside a pipeline or a subshell the parent is not your shell: pass --pid $$ there. A
    subshell whose output the shell reads (X=$(gpualloc alloc ... 2>&1), where bash forks one)
    ends as soon as alloc does, so alloc refuses it as the lease's process.
    """
    work("alloc_gpus", values)


def release_command(**values: Any) -> None:
    """Give GPUs back: the leases named (ids, unique prefixes of 4+ characters, or names given
    with --name), or all of yours with --mine.

    A name several of your leases share is refused, with their ids. Only a lease's owner (or
    root) may release it: exit 12 otherwise, 13 for an unknown or ambiguous lease. A job
    still running on released GPUs keeps running; the GPUs just stop being reserved for it,
    so --mine leaves running jobs' leases unless --include-running is given. A refused
    release changes nothing.

    With --evict-shared the leases stay and the shared jobs beside them leave: the owner of a
    --shareable lease may evict other users' shared jobs (their own gpualloc watcher ends them,
    since nobody but root may signal another user's processes).
    """
    work("release_gpus", values)


def gc_command(as_json: bool) -> None:
    """Free the GPUs of leases whose jobs are gone, now, and say which; record how long each
    lease's GPUs have been idle; under the system configuration's idle.expire_holds, give idle
    --hold leases notice and release those whose notice ran out.

    Every gpualloc command reaps as it goes; gc does it explicitly (for cron, a systemd timer
    or an epilog), removes lease lock files left behind by other users' jobs and temporary
    files left by killed writes, and is what tracks idle leases: run it every few minutes.
    """
    from gpualloc.cli.open_ledger import open_host_ledger, warn
    from gpualloc.cli.output import print_json, write_stdout
    from gpualloc.cli.state import STATE
    from gpualloc.json_views import lease_json
    from gpualloc.ledger.idle import IdlePolicy
    from gpualloc.ledger.occupancy import describe_lease
    from gpualloc.model.validation import to_builtins

    host = open_host_ledger(check_health=False)
    policy = IdlePolicy.from_config(STATE.config())
    report = host.collect_garbage(policy)
    warn(report.notes)
    warn(_notify(policy.notify, report.expiries))
    if as_json:
        print_json(
            {
                "reaped": [lease_json(lease) for lease in report.reaped],
                "dropped_waiters": [to_builtins(w) for w in report.dropped_waiters],
                "removed_lock_files": report.removed_lock_files,
                "removed_temporary_files": report.removed_temporary_files,
                "idle": [
                    {
                        "event": e.event,
                        "idle_seconds": int(e.idle.total_seconds()),
                        "lease": lease_json(e.lease),
                    }
                    for e in report.expiries
                ],
            }
        )
        return
    lines = [f"freed {describe_lease(lease)} ({_why_freed(lease)})" for lease in report.reaped]
    lines += [
        f"dropped {w.user}'s waiting {w.request.gpus}-GPU job from the queue (pid {w.pid} is gone)"
        for w in report.dropped_waiters
    ]
    lines += [_expiry_line(e) for e in report.expiries]
    if report.removed_lock_files:
        lines.append(f"removed {count_of(len(report.removed_lock_files), 'stale lease lock file')}")
    if report.removed_temporary_files:
        count = len(report.removed_temporary_files)
        lines.append(f"removed {count_of(count, 'temporary file')} left by killed writes")
    write_stdout("\n".join(lines or ["nothing to collect: every lease is alive"]) + "\n")


def _expiry_line(expiry: Expiry) -> str:
    from gpualloc.ledger.occupancy import describe_lease, format_age

    idle = format_age(expiry.idle)
    if expiry.event == "expired":
        return f"released {describe_lease(expiry.lease)} (idle {idle}, its notice ran out)"
    activity = expiry.lease.activity
    assert activity is not None and activity.expires_at is not None
    when = activity.expires_at.astimezone().strftime("%Y-%m-%d %H:%M")
    return (
        f"notice: {describe_lease(expiry.lease)} has been idle {idle}; it is released at "
        f"{when} unless its GPUs are used"
    )


NOTIFY_TIMEOUT_S = 5.0
"""How long ``gc`` lets one ``idle.notify`` command run before it kills it (and everything it
started): gc runs from cron or a timer and must not hang on a mailer that never returns."""


def _notify(command: str | None, expiries: list[Expiry]) -> list[str]:
    """Run the system configuration's idle.notify for every notice and expiry, each for at most
    :data:`NOTIFY_TIMEOUT_S` seconds; what failed, a line each."""
    import os

    from gpualloc.ledger.idle import notify_environment

    problems = []
    for expiry in expiries if command else []:
        assert command is not None
        env = {**os.environ, **notify_environment(expiry)}
        problem = _run_notify(command, env)
        if problem:
            problems.append(f"idle.notify for lease {expiry.lease.id} {problem}")
    return problems


def _run_notify(command: str, env: dict[str, str]) -> str | None:
    """Run ``command`` in a session of its own, no stdin, for at most NOTIFY_TIMEOUT_S; on
    timeout kill its whole process group. What went wrong, or None."""
    import contextlib
    import os
    import signal
    import subprocess

    try:
        process = subprocess.Popen(
            ["/bin/sh", "-c", command],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        return f"could not start: {exc.strerror or exc}"
    try:
        _, err = process.communicate(timeout=NOTIFY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):  # gone between the timeout and the kill
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        if process.stderr is not None:
            process.stderr.close()  # a child that left the group may hold it open: no read
        return f"ran longer than {NOTIFY_TIMEOUT_S:g}s: killed it"
    if process.returncode != 0:
        said = err.decode(errors="replace").strip()[:200]
        return f"exited {process.returncode}" + (f": {said}" if said else "")
    return None


ALLOC = Command(
    "alloc",
    alloc_command,
    options=(
        *job_options("alloc"),
        value(
            "--pid",
            kind="int",
            minimum=1,
            metavar="PID",
            help="The lease lives as long as this process (default: the shell that ran "
            "gpualloc, i.e. its parent process).",
        ),
        flag("--hold", help="Keep the GPUs until 'gpualloc release', whatever exits."),
        value(
            "--format",
            dest="output_format",
            metavar="FORMAT",
            default="ids",
            completion="alloc_formats",
            help="ids: '0,1'; env: export lines for eval; json: the lease and placement.",
        ),
    ),
)
RELEASE = Command(
    "release",
    release_command,
    options=(
        flag(
            "--mine",
            help="Release every lease of yours but your running jobs' (run, a Slurm job's), "
            "which it names.",
        ),
        flag(
            "--include-running",
            help="With --mine: release your running jobs' leases too. Each job keeps running, "
            "on GPUs the next job may be given.",
        ),
        flag(
            "--evict-shared",
            help="Do not release: end the shared jobs (run --share) on the GPUs of the "
            "--shareable leases named (or of all yours with --mine), or the shared job named. "
            "Each gets SIGTERM, then SIGKILL after --grace; waits until they are gone.",
        ),
        value(
            "--grace",
            metavar="DURATION",
            help="With --evict-shared: how long a job has between SIGTERM and SIGKILL "
            "(default 10s).",
        ),
        json_flag(),
    ),
    argument=Arg("leases", "[LEASE]...", many=True, completion="lease_ids"),
)
GC = Command("gc", gc_command, options=(json_flag(),))


def _why_freed(lease: Lease) -> str:
    """Why ``gc`` found ``lease`` ended: its time limit, or its job gone."""
    from datetime import datetime, timezone

    ends = lease.ends
    if lease.hold and ends is not None and ends <= datetime.now(timezone.utc):
        return "its time limit ran out"
    return "its job is gone"
