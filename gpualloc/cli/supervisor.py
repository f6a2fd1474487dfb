"""A submitted job's supervisor: ``python -m gpualloc.cli.supervisor JOB_DIRECTORY``.

Started detached by :func:`gpualloc.batch.spawn.start_supervisor`, as the submitting user, in
the submitting shell's environment and directory, its output the job's log. In turn it:

1. waits for the job's dependencies (``--dependency``; :mod:`.dependency`), ``pending`` with
   reason ``Dependency``; one that can never be met cancels the job
   (``DependencyNeverSatisfied``, as Slurm says it);
2. waits in the host's queue as ``run --wait`` does (the embedded ledger or the broker, as
   :func:`gpualloc.host.open.open_host` decides for ``run``), under the job's id as its lease
   id: through a broker that is restarted or killed meanwhile it connects again and sends the
   same request, and the broker gives it back its place (:meth:`gpualloc.broker.service.
   LedgerService.alloc`, ``retry``);
3. forks the job, which leads a process group of its own and is launched exactly as ``run``
   launches (:func:`gpualloc.host.launching.launch_granted`: binding, environment, verifier,
   the file ledger's time-limit watch), and waits for it, the lease its own (its pid is the
   lease's; the job inherits the lease lock);
4. once the job's process has exited, stays ``completing`` until the last process of its
   group has gone, then records the final state and the exit status and exits, and with it
   the lease ends.

``gpualloc cancel`` sends the supervisor SIGTERM: a pending job leaves the queue; a running
job's process group gets SIGTERM, then SIGKILL ``limits.kill_wait`` later, as Slurm's scancel
does. At a time limit the ledger's keeper ends the job (the broker as root, else the job's
time-limit watch); the supervisor, signalled by the broker too, leaves the job to it and
records ``timeout``.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from gpualloc.batch.record import POLL_S, JobRecord, cancel_asked, read_record, write_record
from gpualloc.errors import GpuallocError, Interrupted

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from gpualloc.host.grant import Grant
    from gpualloc.host.protocol import Host
    from gpualloc.host.terms import WaitStatus
    from gpualloc.launcher.binding import NumaMode
    from gpualloc.launcher.verify_terms import VerifyTerms
    from gpualloc.model.topology import GpuProcess

TIMEOUT_TOLERANCE_S = 2.0
"""A job that ended this close to its time limit, or after it, ended at the limit."""
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 30.0
"""A refusal that may pass later (:attr:`GpuallocError.transient`: the broker over this user's
budget, the user's queue full) is asked again after a pause that doubles from the first to
the most, spread by up to as much again so that an array's tasks do not come back at once;
the job stays pending, with the refusal's reason."""
RECONNECT_S = 300.0
"""How long a supervisor tries to reach a broker that went away (a restart by systemd takes
seconds; a broker down longer leaves the job ``failed`` with the reason)."""


class Cancelled(Exception):
    """SIGTERM or SIGINT reached a supervisor whose job has not started."""


class Supervisor:
    """One job's supervisor: its record, and the state of its job's end."""

    def __init__(self, directory: Path, record: JobRecord) -> None:
        self.directory = directory
        self.record = record
        self.job_pid: int | None = None
        self.cancelled = False
        self.kill_wait_s = 30.0
        self.ends: float | None = None
        """When the lease's time limit runs out (epoch seconds), once the job has started."""
        self.said: tuple[str, str] | None = None
        self.slot: int | None = None
        """The array slot's lock (:meth:`take_array_slot`), held for the supervisor's life."""

    # ---- the record ----------------------------------------------------------------------

    def save(self, **changes: object) -> None:
        for key, value in changes.items():
            setattr(self.record, key, value)
        write_record(self.record, self.directory)

    def say(self, line: str) -> None:
        sys.stderr.write(f"gpualloc: {line}\n")
        sys.stderr.flush()

    # ---- signals -------------------------------------------------------------------------

    def on_cancel_while_pending(self, signum: int, frame: object) -> None:
        raise Cancelled(signal.Signals(signum).name)

    def on_cancel_while_running(self, signum: int, frame: object) -> None:
        if self.job_pid is None or self.cancelled:
            return
        if self.ends is not None and time.time() >= self.ends - TIMEOUT_TOLERANCE_S:
            return  # the broker ends the job at its limit: it signals every process itself
        self.cancelled = True
        self.say(f"cancelled: SIGTERM to the job, SIGKILL in {self.kill_wait_s:g} s")
        self._signal_job(signal.SIGTERM)
        signal.setitimer(signal.ITIMER_REAL, max(self.kill_wait_s, 0.01), 1.0)

    def on_kill_wait_over(self, signum: int, frame: object) -> None:
        self._signal_job(signal.SIGKILL)  # again every second until the group has gone

    def _signal_job(self, sig: int) -> None:
        if self.job_pid is None:
            return
        with contextlib.suppress(OSError):
            os.killpg(self.job_pid, sig)

    # ---- the job's life ------------------------------------------------------------------

    def run(self) -> int:
        """The job from its dependencies to its end; the supervisor's exit status."""
        from gpualloc.batch.dependency import NeverSatisfied, wait_for_dependencies

        record = self.record
        try:
            if cancel_asked(self.directory):  # cancelled before its pid was recorded
                raise Cancelled("cancel")
            if record.dependency:
                wait_for_dependencies(record, self.save)
            if record.array_limit is not None:
                self.take_array_slot()
            grant, host = self.place()
        except (Cancelled, Interrupted):
            self.say("cancelled before it started")
            self.finish("cancelled", reason="Cancelled", detail="cancelled before it started")
            return 0
        except NeverSatisfied as never:
            self.say(f"cancelled: {never}")
            self.finish("cancelled", reason="DependencyNeverSatisfied", detail=str(never))
            return 0
        return self.launch(grant, host)

    def take_array_slot(self) -> None:
        """One of the ``%N`` places of the job's array (``--array ...%N``): an exclusive
        ``flock`` on one of N slot files, held until this supervisor exits, so that however
        the tasks' supervisors race, at most N tasks are past this point at once, and a slot
        whose holder died is free again."""
        import fcntl

        from gpualloc.batch.record import jobs_directory

        record = self.record
        assert record.array_limit is not None and record.array_id is not None
        slots = [
            jobs_directory() / f".array-{record.array_id}.slot{k}"
            for k in range(record.array_limit)
        ]
        said = False
        while True:
            for path in slots:
                descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                try:
                    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(descriptor)
                    continue
                if not _still_named(descriptor, path):  # removed as spent meanwhile
                    os.close(descriptor)
                    continue
                self.slot = descriptor
                return
            if not said:
                limit = record.array_limit
                self.save(reason="JobArrayTaskLimit", detail=f"{limit} of its array run already")
                said = True
            time.sleep(POLL_S)

    def place(self) -> tuple[Grant, Host]:
        """The job's lease, after its wait in the host's queue."""
        from gpualloc.cli.batch_options import lease_terms, wait_of
        from gpualloc.cli.jobs import with_policy
        from gpualloc.cli.open_ledger import open_host_ledger, warn
        from gpualloc.cli.state import STATE
        from gpualloc.host.time_rules import TimeRules
        from gpualloc.model.job_fields import pick_fields

        record = self.record
        job, own = pick_fields(record.options)
        job = with_policy(job)
        host = open_host_ledger(
            ignore_foreign=STATE.setting("ignore_foreign", own.get("ignore_foreign")),
            allow_unhealthy=bool(own.get("allow_unhealthy")),
            full=False,
            reconnect_s=RECONNECT_S,  # the request keeps its id, and the broker its place
        )
        self.kill_wait_s = TimeRules.from_config(STATE.config()).kill_wait_s
        terms = lease_terms(record, pid=os.getpid())
        self.save(reason="Priority", detail=None)
        pause = RETRY_FIRST_S
        while True:
            try:
                grant = host.start(
                    job,
                    terms,
                    config=STATE.config(),
                    wait=wait_of(own),
                    report=self.report,
                    uuid=bool(own.get("uuid")),
                )
            except GpuallocError as refusal:
                if refusal.transient is None:
                    raise
                self.save(reason=refusal.transient, detail=refusal.message)
                time.sleep(pause * random.uniform(1.0, 2.0))
                pause = min(pause * 2, RETRY_MAX_S)
                terms = lease_terms(record, pid=os.getpid())  # granted afresh by the next try
                continue
            warn(grant.notes)
            return grant, host

    def report(self, status: WaitStatus) -> None:
        """The queue's word on the wait: the record's reason (squeue's ``Resources`` for the
        job at the head of the queue, ``Priority`` behind others) and a line in the log."""
        reason = "Resources" if status.position <= 1 else "Priority"
        said = (reason, status.reason)
        if said == self.said:
            return
        self.said = said
        self.save(reason=reason, detail=status.line())
        self.say(status.line())

    def launch(self, grant: Grant, host: Host) -> int:
        from gpualloc.boot import boot_id as this_boot
        from gpualloc.cli.jobs import job_verifier, numa_mode
        from gpualloc.cli.open_ledger import say, warn
        from gpualloc.ledger.liveness import process_start_time

        record = self.record
        lease_view, _ = grant.views()
        ends = lease_view.get("ends")
        if ends is not None:
            self.ends = datetime.fromisoformat(ends).timestamp()
        verify, look = job_verifier(host, grant.this_host)
        mode = numa_mode(record.options.get("numa"))
        stops = {signal.SIGTERM, signal.SIGINT}
        signal.pthread_sigmask(signal.SIG_BLOCK, stops)  # a cancel now waits for job_pid
        for sig in stops:  # blocked first: none is dropped between the two handlers
            signal.signal(sig, self.on_cancel_while_running)
        signal.signal(signal.SIGALRM, self.on_kill_wait_over)
        gate, opener = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(opener)
            self._become_job(host, grant, verify, look, mode, say, warn, gate=gate)
        os.close(gate)
        self.job_pid = pid
        with contextlib.suppress(OSError):
            os.setpgid(pid, pid)  # the child does too: whichever runs first (setpgid(2))
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
        _bind(host, record.id, pid)
        os.write(opener, b"go")  # the job runs once its lease lives with it
        os.close(opener)
        if grant.lock_fd is not None:
            os.close(grant.lock_fd)  # the job holds the lease lock; this process the lease
        host.hang_up()
        self.save(
            state="running",
            reason="None",
            detail=None,
            gpus=grant.held,
            started=datetime.now(timezone.utc),
            time_limit_s=lease_view.get("time_limit_s"),
            job_pgid=pid,
            job_start=process_start_time(pid),
            boot_id=this_boot(),
        )
        status = _wait(pid)
        ended = time.time()
        self.save(state="completing")
        self._wait_for_group(pid)
        signal.setitimer(signal.ITIMER_REAL, 0)
        code = os.waitstatus_to_exitcode(status)
        exit_code, exit_signal = (code, None) if code >= 0 else (None, -code)
        if self.ends is not None and ended >= self.ends - TIMEOUT_TOLERANCE_S:
            state, reason = "timeout", "TimeLimit"
        elif self.cancelled:
            state, reason = "cancelled", "Cancelled"
        elif code == 0:
            state, reason = "completed", "None"
        else:
            state, reason = "failed", "NonZeroExitCode" if code > 0 else "Signal"
        self.finish(state, reason=reason, exit_code=exit_code, exit_signal=exit_signal)
        _tell_exit(host, record.id, code, cancelled=state == "cancelled")
        return 0

    def _become_job(
        self,
        host: Host,
        grant: Grant,
        verify: VerifyTerms | None,
        look: Callable[[], list[GpuProcess]] | None,
        mode: NumaMode,
        say: Callable[[str], None],
        warn: Callable[[Iterable[str]], None],
        *,
        gate: int,
    ) -> NoReturn:
        """The forked child: a process group of its own; once the supervisor opens ``gate``
        (its lease bound to this group: :meth:`Host.adopt`), ``run``'s launch (it execs). A
        supervisor killed before that closes the gate unopened, and no job runs unwatched."""
        from gpualloc.host.launching import launch_granted

        try:
            os.setpgid(0, 0)
            if os.read(gate, 2) != b"go":
                sys.stderr.write("gpualloc: error: the job's supervisor is gone: not started\n")
                sys.stderr.flush()
                os._exit(1)
            os.close(gate)
            signal.setitimer(signal.ITIMER_REAL, 0)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
            os.environ.update(_job_variables(self.record))
            if self.record.error is not None:
                flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
                os.dup2(os.open(self.record.error, flags, 0o600), 2)
            launch_granted(
                host, grant, list(self.record.command), mode, quiet=False, verify=verify,
                look=look, say=say, warn=warn, forked=True,
            )  # fmt: skip
        except GpuallocError as exc:
            sys.stderr.write(f"gpualloc: error: {exc.message}\n")
            sys.stderr.flush()
            os._exit(int(exc.exit_code))
        except BaseException:
            traceback.print_exc()
            os._exit(1)

    def _wait_for_group(self, group: int) -> None:
        """Until the last process of the job's group has gone (``completing``). The supervisor
        is the job's subreaper (:func:`_become_subreaper`): orphans of the job that end are
        its children, reaped here, so a zombie never counts as a process still running."""
        while True:
            with contextlib.suppress(ChildProcessError):
                while os.waitpid(-1, os.WNOHANG)[0] > 0:
                    pass
            try:
                os.killpg(group, 0)
            except ProcessLookupError:
                return
            except OSError:
                return
            time.sleep(POLL_S)

    def finish(self, state: str, *, reason: str, detail: str | None = None, **more: object) -> None:
        self.save(
            state=state, reason=reason, detail=detail, ended=datetime.now(timezone.utc), **more
        )
        _tidy()


def _still_named(descriptor: int, path: Path) -> bool:
    """Whether ``path`` still names the file open at ``descriptor`` (a slot unlinked by
    :func:`gpualloc.batch.record.remove_old_jobs` after it was opened names it no more)."""
    try:
        return os.fstat(descriptor).st_ino == path.stat().st_ino
    except OSError:
        return False


def _tidy() -> None:
    """The user's old job directories and spent array slots removed (best effort: another
    supervisor may be removing the same)."""
    from gpualloc.batch.record import remove_old_jobs

    with contextlib.suppress(OSError, GpuallocError):
        remove_old_jobs()


def _bind(host: Host, lease_id: str, pid: int) -> None:
    """Bind the lease to the job's process group (:meth:`Host.adopt`): through a broker the
    job keeps its lease, and meets its limit, even if this process is killed a moment
    later. A broker that cannot be asked leaves the job to its watch's next pass."""
    with contextlib.suppress(GpuallocError, OSError):
        host.adopt(lease_id, pid)


def _tell_exit(host: Host, lease_id: str, code: int, *, cancelled: bool) -> None:
    """The host's history keeps the job's exit status (:meth:`Host.exited`); where it cannot
    be told (a broker gone for good), the lease still ends with this process, as ``ended``."""
    with contextlib.suppress(GpuallocError, OSError):
        host.exited(lease_id, code, cancelled=cancelled)


def _wait(pid: int) -> int:
    """The wait status of ``pid`` (signals meanwhile are handled and the wait goes on)."""
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            return status
        except ChildProcessError:
            return 0
        except InterruptedError:  # pragma: no cover - PEP 475 retries; a handler may raise
            continue


def _job_variables(record: JobRecord) -> dict[str, str]:
    """What a submitted job's environment gains beside ``run``'s (never ``SLURM_*``: gpualloc
    reads those as "inside a Slurm job")."""
    variables = {"GPUALLOC_JOB_ID": record.id, "GPUALLOC_JOB_NAME": record.name}
    if record.array_id is not None:
        variables["GPUALLOC_ARRAY_JOB_ID"] = record.array_id
        variables["GPUALLOC_ARRAY_TASK_ID"] = str(record.array_task)
    return variables


def _become_subreaper() -> None:
    """``prctl(PR_SET_CHILD_SUBREAPER)`` (Linux 3.4; prctl(2)), as slurmstepd is for its
    job: a process the job leaves behind becomes the supervisor's child when its parent
    ends, not init's (which in a container may never reap it)."""
    import ctypes

    pr_set_child_subreaper = 36
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_child_subreaper, 1, 0, 0, 0)


def main(argv: list[str]) -> int:
    """The supervisor of the job in ``argv[0]``."""
    from gpualloc.cli.state import STATE

    if len(argv) != 1:
        sys.stderr.write("usage: python -m gpualloc.cli.supervisor JOB_DIRECTORY\n")
        return 2
    directory = Path(argv[0])
    record = read_record(directory)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    _become_subreaper()
    supervisor = Supervisor(directory, record)
    from gpualloc.ledger.liveness import process_start_time

    for sig in (signal.SIGTERM, signal.SIGINT):  # before the pid is there for cancel to read
        signal.signal(sig, supervisor.on_cancel_while_pending)
    supervisor.save(supervisor_pid=os.getpid(), supervisor_start=process_start_time(os.getpid()))
    try:
        os.chdir(record.cwd)
        os.environ.clear()
        os.environ.update(record.environment)
        STATE.reset()
        STATE.apply_global_options(topology=record.topology)
        return supervisor.run()
    except Cancelled:  # before run() took over its signals
        supervisor.finish("cancelled", reason="Cancelled", detail="cancelled before it started")
        return 0
    except GpuallocError as exc:
        supervisor.say(f"error: {exc.message}")
        if exc.hint:
            supervisor.say(f"hint: {exc.hint}")
        supervisor.finish("failed", reason="Error", detail=exc.message)
        return int(exc.exit_code)
    except OSError as exc:
        supervisor.say(f"error: {exc}")
        supervisor.finish("failed", reason="Error", detail=str(exc))
        return 8
    except BaseException as exc:  # a bug: the record says so and the traceback is in the log
        traceback.print_exc()
        supervisor.finish("failed", reason="Error", detail=f"internal error: {exc!r}")
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
