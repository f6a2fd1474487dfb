"""``run``, ``alloc`` and ``release`` through the host's broker, with the least start-up.

On a host with a broker (:mod:`gpualloc.broker`) these commands need neither the topology nor
the placement engine nor the ledger's models: the broker places, records, and answers with what
the command prints and execs with (the job's variables, its GPUs' NUMA nodes, the lease's
``--json``). So this path imports the socket client and the launcher's exec helpers and
nothing that loads msgspec (tests/test_broker.py checks what it imports).

It takes the command lines it can serve exactly as :mod:`.jobs` would, with the same outputs,
errors and exit codes, and leaves the rest to :mod:`.jobs` (which goes through the broker too,
through the ledger's models): ``--dry-run``, shared jobs (``--share``, ``--shareable``),
``release --evict-shared``, and a ``--pattern`` file (read with the user's own rights and sent
as edges: the broker opens no file a user names).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from gpualloc.cli.state import STATE
from gpualloc.errors import FileAccessError
from gpualloc.job_options import PATTERN_NAMES, job_fields, wire_fields

if TYPE_CHECKING:
    from gpualloc.host.terms import WaitStatus

JOB_OPTIONS = tuple(row.dest for row in wire_fields())
"""The job's options the broker reads (the ``wire`` rows of :mod:`gpualloc.job_options`:
:class:`gpualloc.model.job.JobOptions`'s fields, the sharing ones left out)."""
SHARING = tuple(row.dest for row in job_fields() if not row.wire)


def call(work: str, values: Mapping[str, Any]) -> bool:
    """Do ``work`` (a :data:`gpualloc.cli.jobs.WORK` name) through the broker; False when this
    command line is not one for this path (no broker, or an option it leaves to :mod:`.jobs`)."""
    if not _for_us(work, values):
        return False
    from gpualloc.cli.open_ledger import broker_for_this_command

    socket = broker_for_this_command()
    if socket is None:
        return False
    if work == "run_job":
        _run(socket, values)
    elif work == "alloc_gpus":
        _alloc(socket, values)
    else:
        _release(socket, values)
    return True


def _for_us(work: str, values: Mapping[str, Any]) -> bool:
    if any(values.get(name) for name in SHARING):
        return False
    if values.get("pattern") not in (None, *PATTERN_NAMES):
        return False  # a pattern file: read here, as this user, and sent as edges (.jobs)
    if work == "run_job":
        return not values.get("dry_run") and not values.get("as_json")
    if work == "release_gpus":
        return not values.get("evict_shared") and values.get("grace") is None
    return work == "alloc_gpus"


def _job_options(values: Mapping[str, Any]) -> dict[str, Any]:
    options = {name: values[name] for name in JOB_OPTIONS if values.get(name) is not None}
    options["policy"] = STATE.setting("policy", values.get("policy"))
    return options


def _wait(values: Mapping[str, Any]) -> dict[str, Any] | None:
    """The queue options, or None without --wait (the usage errors of :mod:`.open_ledger`)."""
    from gpualloc.cli.open_ledger import check_wait_flags

    timeout, priority = values.get("timeout"), values.get("priority")
    max_bypass = values.get("max_bypass")
    if not check_wait_flags(
        wait=values.get("wait", False), timeout=timeout, priority=priority, max_bypass=max_bypass
    ):
        return None
    from gpualloc.model.option_values import parse_duration

    return {
        "timeout_s": parse_duration(timeout) if timeout is not None else None,
        "priority": STATE.setting("queue.priority", priority),
        "max_bypass": STATE.setting("queue.max_bypass", max_bypass),
    }


def _allocate(socket: Path, values: Mapping[str, Any], terms: dict[str, Any]) -> dict[str, Any]:
    """One ``alloc`` request, with the waiting line on stderr while it queues."""
    from gpualloc.wire.client import BrokerClient

    wait = _wait(values)
    args = {
        "lease_id": os.urandom(6).hex(),
        "options": _job_options(values),
        "terms": terms,
        "wait": wait,
        "allow_unhealthy": bool(values.get("allow_unhealthy")),
        "views": {"uuid": bool(values.get("uuid"))},
    }
    client = BrokerClient(socket, answer_s=STATE.setting("host.broker_timeout"))
    line = _WaitingLine() if wait is not None else None
    try:
        answer = client.call("alloc", args, on_event=line.show if line else None)
    except KeyboardInterrupt:
        if line is None:
            raise
        raise line.line.interrupted() from None  # the broker drops a waiter that hangs up
    finally:
        if line is not None:
            line.close()
    answer["client"] = client
    return answer


# ---- run -------------------------------------------------------------------------------------


def _run(socket: Path, values: Mapping[str, Any]) -> None:
    from gpualloc.cli.open_ledger import say, warn
    from gpualloc.launcher.binding import NumaMode
    from gpualloc.launcher.command import resolve_program
    from gpualloc.launcher.launch import JobLaunch, launch
    from gpualloc.model.printable import lease_command

    numa = values.get("numa")
    try:
        mode = NumaMode(STATE.setting("numa", numa))
    except ValueError:
        from gpualloc.model.option_values import unknown_choice

        raise unknown_choice("--numa", numa, [mode.value for mode in NumaMode]) from None
    command = list(values["command"])
    resolve_program(command[0], os.environ)  # 127/126 before any GPU is taken
    pid = os.getpid()
    terms = {
        "source": "run",
        "pid": pid,
        "command": list(lease_command(command)),  # the job still gets all of it
        "name": values.get("name"),
        "process_group": pid if os.getpgrp() == pid else None,
    }
    answer = _allocate(socket, values, terms)
    lease, client = answer["lease"], answer["client"]
    try:
        warn(answer["notes"])
        job = JobLaunch(
            command=command,
            lease_id=lease["id"],
            held=answer["held"],
            numa_nodes=answer["numa_nodes"],
            this_host=bool(answer["this_host"]),
            variables=answer["environment"],
        )
        client.close()  # the broker watches this process, not the connection
        launch(
            job, mode, quiet=bool(values.get("quiet")), start_verifier=_verifier(socket, lease),
            say=say, warn=warn,
        )  # fmt: skip
    except BaseException:
        client.call("release", {"leases": [lease["id"]]})
        raise


def _verifier(socket: Path, lease: dict[str, Any]) -> Callable[[], None] | None:
    """What starts the job's verifier (``verify.grace``; see
    :mod:`gpualloc.launcher.verify_brokered`), or None when ``verify.grace`` is 0."""
    import functools

    grace = STATE.setting("verify.grace")
    if grace <= 0:
        return None
    from gpualloc.launcher.verify_brokered import start_verifier

    return functools.partial(start_verifier, socket, lease, grace, STATE.setting("verify.action"))


# ---- alloc -----------------------------------------------------------------------------------


def _alloc(socket: Path, values: Mapping[str, Any]) -> None:
    from gpualloc.cli.open_ledger import alloc_owner, print_allocation, warn
    from gpualloc.ledger.liveness import command_line
    from gpualloc.model.printable import lease_command

    output_format = values.get("output_format", "ids")
    hold = bool(values.get("hold"))
    owner = alloc_owner(output_format, values.get("pid"), hold)
    terms = {
        "source": "alloc",
        "pid": owner,
        "hold": hold,
        "command": list(lease_command(command_line(owner))) if owner is not None else [],
        "name": values.get("name"),
        "announce": True,
    }
    answer = _allocate(socket, values, terms)
    warn(answer["notes"])
    try:
        print_allocation(
            output_format,
            answer["environment"],
            lambda: (answer["lease_json"], answer["placement_json"]),
        )
        sys.stdout.flush()  # the id has reached the reader: only now is the lease confirmed
    except FileAccessError:  # stdout closed or full: nobody has the id, so nobody holds it
        answer["client"].call("release", {"leases": [answer["lease"]["id"]]})
        raise
    answer["client"].call("confirm", {"lease": answer["lease"]["id"]})


# ---- release ---------------------------------------------------------------------------------


def _release(socket: Path, values: Mapping[str, Any]) -> None:
    from gpualloc.cli.open_ledger import check_release, report_release
    from gpualloc.errors import ExitCode
    from gpualloc.wire.client import BrokerClient

    leases, mine = values.get("leases") or [], bool(values.get("mine"))
    include_running = bool(values.get("include_running"))
    check_release(leases, mine=mine, include_running=include_running)
    args = {"leases": list(leases), "mine": mine, "include_running": include_running}
    with BrokerClient(socket, answer_s=STATE.setting("host.broker_timeout")) as client:
        result = client.call("release", args)
    problems = result["problems"]
    report_release(
        mine=mine,
        as_json=bool(values.get("as_json")),
        released=(result["described"], result["released_json"]),
        kept=(result.get("kept_described", []), result.get("kept_json", [])),  # older: none
        errors=[problem["message"] for problem in problems],
    )
    from gpualloc.cli.output import write_error

    for problem in problems:
        write_error(str(problem["message"]), problem.get("hint") or None)
    if problems:
        sys.exit(int(problems[0].get("code", ExitCode.INTERNAL)))


class _WaitingLine:
    """The waiting job's status line (the broker renders the text: see ``line``)."""

    def __init__(self) -> None:
        from gpualloc.cli.open_ledger import StatusLine

        self.line = StatusLine()

    def show(self, status: dict[str, Any]) -> None:
        # _Status has every field of WaitStatus that StatusLine reads, without msgspec.
        self.line.show(cast("WaitStatus", _Status(status)))

    def close(self) -> None:
        self.line.close()


class _Status:
    """A waiting status from the broker, as :class:`gpualloc.cli.open_ledger.StatusLine`
    reads it (the fields of :class:`gpualloc.host.wait.WaitStatus`)."""

    def __init__(self, status: dict[str, Any]) -> None:
        self.position = status.get("position", 0)
        self.queue_length = status.get("queue_length", 0)
        self.waited_s = status.get("waited_s", 0.0)
        self.reason = status.get("reason", "")
        self.holders = status.get("holders", "")
        self.text = status.get("line", "")

    def line(self) -> str:
        return self.text
