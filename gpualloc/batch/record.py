"""A submitted job's record, kept in its user's own directory.

``$XDG_STATE_HOME/gpualloc/jobs/<id>/`` (``~/.local/state`` when the variable is unset, as
the XDG Base Directory Specification says for state that outlives a restart of the program
but is not worth backing up), mode 0700, holds ``job.json`` (:class:`JobRecord`) and, unless
``--output`` names another place, ``output.log``. The client writes the record once, at
submission; from then on only the job's supervisor writes it, each time replacing the whole
file (:func:`gpualloc.atomic.write_text_atomic`), so a reader sees one version or the next.

A record whose supervisor is gone without a final state is ``lost`` (:func:`seen_state`):
a reboot, or a supervisor killed with SIGKILL. States as Slurm's squeue(1) names them, in
lower case.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from msgspec import Struct, field

from gpualloc.errors import FileAccessError, GpuallocError

JobState = Literal[
    "pending", "running", "completing", "completed", "failed", "cancelled", "timeout", "lost"
]
FINAL_STATES: frozenset[str] = frozenset({"completed", "failed", "cancelled", "timeout", "lost"})
POLL_S = 0.5
"""How often a supervisor looks at its dependencies, its array's slots, and, once its job's
process has exited, at the job's process group."""
RECORD_FILE = "job.json"
LOG_FILE = "output.log"
CANCEL_FILE = "cancel"
"""Left in a job's directory by ``cancel``: a supervisor that had not recorded its pid yet,
which no signal could reach, reads it once it has (:func:`cancel_asked`)."""


class JobRecord(Struct, kw_only=True):
    """One submitted job, as its supervisor last wrote it."""

    id: str
    """The job's id, which is also its lease's (12 hexadecimal digits)."""
    name: str
    user: str
    uid: int
    command: tuple[str, ...]
    """What the job runs: the command, or the copy of the script and its arguments."""
    script: str | None = None
    """The script as submitted (``submit script.sh``), before it was copied."""
    cwd: str
    environment: dict[str, str] = field(default_factory=dict)
    """The submitting shell's environment, which the job gets (sbatch's ``--export=ALL``)."""
    options: dict[str, Any] = field(default_factory=dict)
    """The placement, lease and queue options, by parameter name, as ``run --wait`` takes
    them."""
    topology: str | None = None
    """``--topology`` of the submission (else the environment's, else this host's)."""
    output: str
    """The log's path (stdout, and stderr unless :attr:`error` is set)."""
    error: str | None = None
    time_limit: str | None = None
    """``--time`` as given (the host grants the limit: :attr:`time_limit_s`)."""
    time_limit_s: float | None = None
    dependency: str | None = None
    array_id: str | None = None
    """The array this job is a task of (``--array``): the array's id."""
    array_task: int | None = None
    array_limit: int | None = None
    """``%N`` of ``--array``: how many of the array's tasks may run at once."""
    submitted: datetime
    state: JobState = "pending"
    reason: str = "None"
    """Why a pending job waits (squeue's REASON: ``Dependency``, ``Priority``, ``Resources``),
    or why a job ended as it did."""
    detail: str | None = None
    """The reason in words (the queue's status line, an error message)."""
    supervisor_pid: int | None = None
    supervisor_start: float | None = None
    """The supervisor's start time, as :func:`gpualloc.ledger.liveness.process_start_time`."""
    job_pgid: int | None = None
    """The job's process group (the job leads it); what ``cancel`` signals."""
    job_start: float | None = None
    """The start time of the job's first process, which leads :attr:`job_pgid`."""
    boot_id: str | None = None
    """The boot the job ran in (:func:`gpualloc.boot.boot_id`): after a reboot its group's
    number names whatever process has it now."""
    gpus: str | None = None
    """The devices held, in words (``GPU 0,3``)."""
    queued: datetime | None = None
    started: datetime | None = None
    ended: datetime | None = None
    exit_code: int | None = None
    """The job's exit status, or None when a signal ended it (:attr:`exit_signal`)."""
    exit_signal: int | None = None

    @property
    def directory(self) -> Path:
        """Where the record is kept (its user's jobs directory)."""
        return job_directory(self.id)


def state_home(env: dict[str, str] | os._Environ[str] | None = None) -> Path:
    """``$XDG_STATE_HOME``, else ``~/.local/state`` (an empty or relative value is ignored, as
    the XDG Base Directory Specification says)."""
    env = os.environ if env is None else env
    value = env.get("XDG_STATE_HOME", "")
    if value and Path(value).is_absolute():
        return Path(value)
    return Path("~").expanduser() / ".local" / "state"


def jobs_directory(env: dict[str, str] | os._Environ[str] | None = None) -> Path:
    return state_home(env) / "gpualloc" / "jobs"


def job_directory(job_id: str, env: dict[str, str] | os._Environ[str] | None = None) -> Path:
    return jobs_directory(env) / job_id


def make_job_directory(job_id: str) -> Path:
    """A new job's directory, 0700 (its log and environment are its user's alone)."""
    base = jobs_directory()
    try:
        base.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = base / job_id
        path.mkdir(mode=0o700)
    except OSError as exc:
        raise FileAccessError(
            f"cannot make the job's directory under {base}: {exc.strerror}",
            hint="set XDG_STATE_HOME to a directory of yours",
        ) from None
    return path


def write_record(record: JobRecord, directory: Path) -> None:
    """Replace ``job.json`` (atomically: a reader sees this version or the last)."""
    import msgspec

    from gpualloc.atomic import write_text_atomic

    text = msgspec.json.format(msgspec.json.encode(record)).decode()
    write_text_atomic(directory / RECORD_FILE, text + "\n", mode=0o600, sync=False)


def read_record(directory: Path) -> JobRecord:
    """The record in ``directory``. Raises FileAccessError when it cannot be read or parsed."""
    from gpualloc.model.validation import decode_json

    path = directory / RECORD_FILE
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise FileAccessError(f"cannot read {path}: {exc.strerror}") from None
    try:
        return decode_json(text, JobRecord)
    except Exception as exc:  # a record a newer gpualloc or a stray editor wrote
        raise FileAccessError(f"{path} is not a job record: {exc}") from None


def own_records() -> Iterator[JobRecord]:
    """Every readable record of this user's, oldest submission first."""
    base = jobs_directory()
    try:
        entries = list(base.iterdir())
    except OSError:
        return iter(())
    records = []
    for entry in entries:
        try:
            records.append(read_record(entry))
        except GpuallocError:
            continue  # a directory being made, or not a job's
    records.sort(key=lambda r: (r.submitted, r.array_task or 0, r.id))
    return iter(records)


def ask_cancel(record: JobRecord) -> None:
    """Leave ``cancel``'s mark in the job's directory (:data:`CANCEL_FILE`)."""
    try:
        (record.directory / CANCEL_FILE).touch(mode=0o600)
    except OSError as exc:
        raise FileAccessError(
            f"cannot mark job {record.id} cancelled in {record.directory}: {exc.strerror}"
        ) from None


def cancel_asked(directory: Path) -> bool:
    return (directory / CANCEL_FILE).exists()


def job_processes(record: JobRecord) -> list[int]:
    """The processes of the job's group that run now, and are the job's: this boot's, of its
    user, started no earlier than the job (a group number reused since names another's
    processes). For a lost job, whose supervisor can say nothing."""
    from gpualloc.boot import boot_id
    from gpualloc.ledger.liveness import WALL_CLOCK_SLACK_S, started_at, stat_fields

    group, started = record.job_pgid, record.job_start
    if group is None or started is None or record.boot_id != boot_id():
        return []
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = stat_fields(int(entry.name))
            owner = entry.stat().st_uid
        except OSError:
            continue
        if fields[0] in ("Z", "X") or int(fields[2]) != group or owner != record.uid:
            continue
        if started_at(fields) >= started - WALL_CLOCK_SLACK_S:
            found.append(int(entry.name))
    return found


def supervisor_alive(record: JobRecord) -> bool:
    from gpualloc.ledger.liveness import process_alive

    if record.supervisor_pid is None:
        return False
    return process_alive(record.supervisor_pid, record.supervisor_start)


def seen_state(record: JobRecord) -> JobState:
    """The record's state as a reader should see it: ``lost`` where it is not final and its
    supervisor is gone (a reboot, ``kill -9``); a job submitted a moment ago whose supervisor
    has not written its pid yet is still ``pending``."""
    if record.state in FINAL_STATES:
        return record.state
    if record.supervisor_pid is None:
        age = (datetime.now(timezone.utc) - record.submitted).total_seconds()
        return "pending" if age < SUPERVISOR_START_S else "lost"
    return record.state if supervisor_alive(record) else "lost"


SUPERVISOR_START_S = 30.0
"""How long a new job's supervisor may take to record its pid before the job counts as lost
(a Python start on a loaded host takes well under a second)."""


KEEP_ENDED_DAYS = 30
"""How long a job's directory (its record, and its log unless ``--output`` put it elsewhere)
is kept after the job ended, as sacct's records outlive squeue's: :func:`remove_old_jobs`."""


def remove_old_jobs(now: datetime | None = None) -> list[str]:
    """Remove this user's job directories of jobs that ended (or were lost) more than
    :data:`KEEP_ENDED_DAYS` ago, and the slot files of arrays none of whose tasks is still
    to end (no supervisor holds or will take one then); the ids removed. Each supervisor
    calls it as its job ends, so that ``jobs`` and a dependency's wait read a bounded
    directory."""
    import shutil
    from datetime import timedelta

    now = now or datetime.now(timezone.utc)
    cutoff = now - timedelta(days=KEEP_ENDED_DAYS)
    removed = []
    open_arrays: set[str] = set()
    for record in own_records():
        state = seen_state(record)
        if state not in FINAL_STATES:
            if record.array_id is not None:
                open_arrays.add(record.array_id)
            continue
        last = record.ended or last_written(record)
        if last < cutoff and not (state == "lost" and job_processes(record)):
            shutil.rmtree(record.directory, ignore_errors=True)
            removed.append(record.id)
    for slot in jobs_directory().glob(".array-*.slot*"):
        array = slot.name.removeprefix(".array-").partition(".slot")[0]
        if array not in open_arrays:
            _remove_free_slot(slot)
    return removed


def last_written(record: JobRecord) -> datetime:
    """When the record was last written (a lost job's last word), else its submission."""
    try:
        return datetime.fromtimestamp(
            (record.directory / RECORD_FILE).stat().st_mtime, tz=timezone.utc
        )
    except OSError:
        return record.submitted


def _remove_free_slot(path: Path) -> None:
    """Unlink an array slot file that no supervisor holds (a new array's task that opened it
    meanwhile finds it unnamed after its lock, and takes another)."""
    import fcntl

    try:
        descriptor = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        path.unlink(missing_ok=True)
    except OSError:
        pass  # held: an array's task uses it
    finally:
        os.close(descriptor)


def find_record(selector: str) -> JobRecord:
    """The caller's job ``selector`` names: its id, a unique prefix of 4 or more characters,
    or an array task as ``ARRAY_TASK``. Raises NoSuchJob."""
    from gpualloc.errors import NoSuchJob

    records = list(own_records())
    if "_" in selector:
        array, _, task = selector.partition("_")
        hits = [
            r
            for r in records
            if r.array_id is not None and r.array_id.startswith(array) and str(r.array_task) == task
        ]
    else:
        hits = [r for r in records if r.id == selector]
        if not hits and len(selector) >= 4:
            hits = [r for r in records if r.id.startswith(selector)]
    if len(hits) == 1:
        return hits[0]
    if not hits:
        raise NoSuchJob(
            f"no job {selector} of yours",
            hint="gpualloc jobs lists your jobs; another user's job is theirs to read",
        )
    listed = ", ".join(r.id for r in hits[:8])
    raise NoSuchJob(f"{selector} names {len(hits)} jobs ({listed})", hint="give more of the id")


def find_records(selector: str) -> list[JobRecord]:
    """The caller's jobs ``selector`` names, as ``cancel`` and ``--dependency`` read it: an
    array's id (or a prefix of 4 or more that names one array and no other job) names every
    task of it, as in Slurm's scancel(1) and sbatch(1); anything else one job
    (:func:`find_record`). Raises NoSuchJob."""
    if "_" not in selector:
        records = list(own_records())
        arrays = {r.array_id for r in records if r.array_id is not None}
        named = {selector} & arrays
        if not named and len(selector) >= 4:
            named = {a for a in arrays if a.startswith(selector)}
            others = [r for r in records if r.id.startswith(selector) and r.array_id not in named]
            if len(named) != 1 or others:
                named = set()
        if named:
            (array,) = named
            return [r for r in records if r.array_id == array]
    return [find_record(selector)]


def shown_id(record: JobRecord) -> str:
    """The id ``jobs`` shows: an array task as ``ARRAY_TASK`` (Slurm's ``%A_%a``)."""
    if record.array_id is not None:
        return f"{record.array_id}_{record.array_task}"
    return record.id
