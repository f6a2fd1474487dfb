"""``gpualloc submit``: check the job, write its record, start its supervisor, say its id.

Everything that can be refused without the host is refused here, before anything is written
(a command that is not found, a bad ``--time``, a limit above the host's maximum, a
dependency on a job that is not the user's); what only the host can judge (a job that can
never fit) ends the job ``failed`` with the host's words, in its record and its log. No
topology is loaded and no ledger opened: the command returns as soon as the supervisor is
detached (``benchmarks/bench_submit.py``).
"""

from __future__ import annotations

import os
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple

from gpualloc.batch.record import LOG_FILE, JobRecord, make_job_directory, write_record
from gpualloc.errors import RequestError

MAX_ARRAY_TASKS = 256
"""The most tasks one ``--array`` may have: each task has a supervisor of its own (a Python
process of some 20 MB while it waits), so a thousand-task sweep would hold gigabytes of
memory before a GPU is free; Slurm's own default bound is 1001 (``MaxArraySize``)."""


class Submitted(NamedTuple):
    records: list[JobRecord]
    notes: list[str]


def submit(values: dict[str, Any], *, topology: str | None) -> Submitted:
    """Submit the job ``values`` describes (``submit``'s parameters by name)."""
    from gpualloc.batch.script import is_script, read_directives
    from gpualloc.cli.batch_options import OWN_OPTIONS
    from gpualloc.cli.jobs import numa_mode
    from gpualloc.model.job_fields import FIELDS

    refuse_inside_slurm()
    command = list(values["command"])
    notes: list[str] = []
    script: Path | None = None
    copied = False
    first = Path(command[0]) if command and command[0] else None
    if first is not None and is_script(first):
        script = first
        directives = read_directives(first)
        copied = bool(directives.options or directives.ignored)  # a batch script: sbatch's copy
        if directives.ignored:
            notes.append("#SBATCH options ignored on one host: " + " ".join(directives.ignored))
        if directives.options:
            values = merged(directives.options, values)
    cwd = Path(values.get("chdir") or Path.cwd())
    if not cwd.is_dir():
        raise RequestError(f"--chdir {cwd}: no such directory")
    if not copied:  # a batch script runs as its copy (0700), wherever and whatever mode it had
        check_command(command, cwd)
    time_limit_s = check_time_limit(values.get("time"), values.get("signal"))
    numa_mode(values.get("numa"))  # exit 2 now, not in the job's log
    dependency = None
    if values.get("dependency"):
        from gpualloc.batch.dependency import parse_dependency

        dependency = parse_dependency(values["dependency"]).text()
    tasks, limit = array_tasks(values.get("array"))
    options = {k: v for k, v in values.items() if k in FIELDS or k in OWN_OPTIONS}
    user = _user_name()
    now = datetime.now(timezone.utc)
    records: list[JobRecord] = []
    array_id: str | None = None
    for task in tasks:
        job_id = os.urandom(6).hex()  # the lease's id too (gpualloc.ledger.store.new_lease_id)
        if task is not None and array_id is None:
            array_id = job_id
        directory = make_job_directory(job_id)
        name = values.get("name") or (Path(command[0]).name if command else "job")
        fill = {"j": job_id, "x": name, "u": user, "A": array_id or job_id,
                "a": "" if task is None else str(task)}  # fmt: skip
        output = _pattern(values.get("output"), fill, cwd) or directory / LOG_FILE
        error = _pattern(values.get("error"), fill, cwd)
        job_command = list(command)
        for path in (output, error):
            if path is not None and not os.access(path.parent, os.W_OK):
                from gpualloc.errors import FileAccessError

                raise FileAccessError(
                    f"cannot write the job's log {path}: no such writable directory"
                )
        if script is not None and copied:
            copy = directory / "script"
            shutil.copyfile(script, copy)
            copy.chmod(0o700)
            job_command[0] = str(copy)
        record = JobRecord(
            id=job_id,
            name=name,
            user=user,
            uid=os.geteuid(),
            command=tuple(job_command),
            script=str(script.resolve()) if script is not None else None,
            cwd=str(cwd.resolve()),
            environment=dict(os.environ),
            options=options,
            topology=topology,
            output=str(output),
            error=str(error) if error is not None else None,
            time_limit=values.get("time"),
            time_limit_s=time_limit_s,
            dependency=dependency,
            array_id=array_id if task is not None else None,
            array_task=task,
            array_limit=limit,
            submitted=now,
        )
        write_record(record, directory)
        records.append(record)
    from gpualloc.batch.spawn import start_supervisor

    for record in records:
        try:
            start_supervisor(record.directory, Path(record.output))
        except OSError as exc:
            from gpualloc.errors import FileAccessError

            raise FileAccessError(
                f"cannot start job {record.id}'s supervisor: {exc.strerror or exc}"
            ) from None
    return Submitted(records, notes)


def refuse_inside_slurm() -> None:
    """Exit 2 inside a Slurm job: the submitted job would outlive the allocation it is
    confined to (its environment names the Slurm job's GPUs, which Slurm gives to the next
    job once this one ends), unless ``GPUALLOC_NO_SLURM`` says to ignore Slurm."""
    if not os.environ.get("SLURM_JOB_ID", "").strip():
        return
    from gpualloc.config import NO_SLURM_VARIABLE, no_slurm

    if no_slurm(os.environ):
        return
    raise RequestError(
        f"submit inside Slurm job {os.environ['SLURM_JOB_ID'].strip()}: the job would outlive "
        "the Slurm job whose GPUs it is confined to",
        hint=f"submit from a shell outside Slurm, use 'gpualloc run' in the Slurm job, or set "
        f"{NO_SLURM_VARIABLE}=1",
    )


def merged(script_options: list[str], given: dict[str, Any]) -> dict[str, Any]:
    """The script's options (read as ``submit``'s), under those given on the command line."""
    from gpualloc.cli.parser import parse_command

    read = parse_command(["submit", *script_options, "--", "true"]).values
    merged = dict(read)
    for key, value in given.items():
        if key == "command" or (value is not None and value is not False):
            merged[key] = value
    return merged


def check_command(command: list[str], cwd: Path) -> None:
    """127/126 before anything is written, as ``run`` refuses them before any GPU is taken."""
    from gpualloc.launcher.command import resolve_program

    program = command[0]
    if "/" in program and not Path(program).is_absolute():
        program = str(cwd / program)
    resolve_program(program, os.environ)


def check_time_limit(time: str | None, signal: str | None) -> float | None:
    """The limit the job will have (None: none), ``--time`` and ``--signal`` read and the
    host's time rules applied now, through the same door the host's ledger applies them at
    (:meth:`TimeRules.grant`): exit 12 for a limit above the maximum, exit 2 for a
    ``--signal`` with no limit to come before. Through a broker, its own system file
    decides again when the job starts."""
    from gpualloc.cli.jobs import asked_signal, asked_time_limit
    from gpualloc.cli.state import STATE
    from gpualloc.host.lease_terms import LeaseTerms
    from gpualloc.host.time_rules import TimeRules

    terms = LeaseTerms(
        source="submit",
        pid=os.getpid(),
        time_limit_s=asked_time_limit(time),
        signal=asked_signal(signal),
    )
    TimeRules.from_config(STATE.config()).grant(terms)
    return terms.time_limit_s


def array_tasks(text: str | None) -> tuple[list[int | None], int | None]:
    """``--array``'s task ids (``0-15``, ``1,3,5-7``, ``0-10:2``) and its ``%N`` limit; a plain
    job is one task, None."""
    if text is None:
        return [None], None
    spec, _, limit_text = text.partition("%")
    limit = None
    if limit_text:
        if not limit_text.isdigit() or int(limit_text) < 1:
            raise RequestError(f"--array {text}: %{limit_text} is not a number of tasks")
        limit = int(limit_text)
    tasks: list[int] = []
    for part in spec.split(","):
        span, _, step_text = part.partition(":")
        low_text, dash, high_text = span.partition("-")
        try:
            low = int(low_text)
            high = int(high_text) if dash else low
            step = int(step_text) if step_text else 1
        except ValueError:
            raise RequestError(
                f"--array {text!r}: {part!r} is not a task range",
                hint="e.g. 0-15, 1,3,5-7, 0-10:2, and %4 for at most 4 at once",
            ) from None
        if low < 0 or high < low or step < 1:
            raise RequestError(f"--array {text!r}: {part!r} is not a task range")
        if (high - low) // step + 1 + len(tasks) > MAX_ARRAY_TASKS:
            raise RequestError(
                f"--array {text!r} has more than {MAX_ARRAY_TASKS} tasks",
                hint="split the sweep, or let each task do several runs",
            )
        tasks += range(low, high + 1, step)
    unique = sorted(set(tasks))
    return list(unique), limit


def _pattern(text: str | None, fill: dict[str, str], cwd: Path) -> Path | None:
    """``--output``/``--error``: Slurm's ``%j`` (id), ``%x`` (name), ``%u`` (user), ``%A`` and
    ``%a`` (array and task), ``%%``; relative to the job's directory of work."""
    if not text:
        return None
    out: list[str] = []
    index = 0
    while index < len(text):
        char = text[index]
        if char == "%" and index + 1 < len(text):
            key = text[index + 1]
            out.append("%" if key == "%" else fill.get(key, f"%{key}"))
            index += 2
            continue
        out.append(char)
        index += 1
    path = Path("".join(out)).expanduser()
    return path if path.is_absolute() else cwd / path


def _user_name() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())
