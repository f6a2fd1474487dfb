"""What the ledger commands share: opening this host's ledger, starting a job with or without
--wait (and its status line), and the prefixed lines they tell people on stderr."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from gpualloc.cli.state import STATE

if TYPE_CHECKING:
    from gpualloc.errors import Interrupted
    from gpualloc.host.grant import Grant
    from gpualloc.host.lease_terms import LeaseTerms
    from gpualloc.host.protocol import Host
    from gpualloc.host.queue_policy import WaitOptions
    from gpualloc.host.receipt import Receipt
    from gpualloc.host.terms import WaitStatus
    from gpualloc.model.job_fields import JobFields


def open_host_ledger(
    *,
    ignore_foreign: bool = False,
    create: bool = True,
    check_health: bool = True,
    allow_unhealthy: bool = False,
    full: bool = True,
    reconnect_s: float | None = None,
) -> Host:
    """The host this command is on (:func:`gpualloc.host.open.open_host` decides: the broker,
    a Slurm job's ledger, this host's or a named topology's), with its ledger, GPU processes
    and faults; warnings go to stderr. ``check_health``: placing or showing needs it;
    releasing does not. ``full``: through the broker, with its ledger and the GPUs'
    processes, which ``run`` and ``alloc`` do not need. ``reconnect_s``: how long a broker
    that went away is tried again (None: a command's default)."""
    import os

    from gpualloc.host.open import open_host

    host = open_host(
        STATE.load_topology,
        STATE.config(),
        named=_topology_named(),
        ignore_foreign=ignore_foreign,
        create=create,
        check_health=check_health,
        allow_unhealthy=allow_unhealthy,
        full=full,
        env=os.environ,
        reconnect_s=reconnect_s,
    )
    warn(host.opening_notes)
    warn(_broker_not_used())
    return host


def _broker_not_used() -> list[str]:
    """A line when the user configured a broker (``GPUALLOC_BROKER``, their config file) that
    this command does not use: a bundled topology's trial passed by it without a word."""
    import os

    from gpualloc.config import DEFAULT_SOURCE, system_file
    from gpualloc.host.open import passed_by

    configured = STATE.config().resolve("host.broker")
    if configured.source in (DEFAULT_SOURCE, str(system_file(os.environ))):
        return []  # none, or the host's own: a trial on a named topology is as documented
    named = STATE.load_topology if _topology_named() else None
    why = passed_by(os.environ, named)
    if why is None:
        return []
    from gpualloc.user_files import shown_path

    return [f"the broker {shown_path(configured.value)} ({configured.source}) is not used: {why}"]


def _topology_named() -> bool:
    import os

    return STATE.topology is not None or bool(os.environ.get("GPUALLOC_TOPOLOGY"))


def warn(lines: Iterable[str]) -> None:
    for line in lines:
        say(f"warning: {line}")


def say(line: str) -> None:
    """A line for people on stderr, prefixed so it stands out among the job's own output."""
    from gpualloc.cli.output import say as to_stderr

    to_stderr(f"gpualloc: {line}")


def start(
    host: Host, job: JobFields, terms: LeaseTerms, waiting: WaitOptions | None, *, uuid: bool
) -> Grant:
    """Start ``job`` on ``host`` now, or with --wait queue until it is this job's turn (with a
    status line)."""
    if waiting is None:
        return host.start(job, terms, config=STATE.config(), uuid=uuid)
    line = StatusLine()
    try:
        return host.start(
            job, terms, config=STATE.config(), wait=waiting, report=line.show, uuid=uuid
        )
    except KeyboardInterrupt:
        raise line.interrupted() from None
    finally:
        line.close()


class StatusLine:
    """One live line on stderr while waiting: redrawn in place on a terminal, otherwise a plain
    line each time what it says changes (not every tick: logs stay readable)."""

    def __init__(self) -> None:
        self.terminal = sys.stderr.isatty()
        self.drawn = False
        self.last_said: tuple[int, str, str] | None = None
        self.last: WaitStatus | None = None

    def show(self, status: WaitStatus) -> None:
        self.last = status
        if self.terminal:
            import shutil

            width = shutil.get_terminal_size().columns
            text = wait_line(status, max(20, width - 1))
            sys.stderr.write(f"\r\x1b[K{text}")
            sys.stderr.flush()
            self.drawn = True
            return
        said = (status.position, status.reason, status.holders)
        if said != self.last_said:
            self.last_said = said
            say(status.line())

    def close(self) -> None:
        if self.drawn:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()

    def interrupted(self) -> Interrupted:
        """Ctrl-C in the wait: where the job stood, and that it left nothing behind (the
        queue drops a waiter that leaves: :func:`gpualloc.host.wait.wait_and_allocate`, and
        the broker's when its connection closes)."""
        from datetime import timedelta

        from gpualloc.errors import Interrupted
        from gpualloc.ledger.occupancy import format_age

        status = self.last
        if status is None:
            where = "while joining the queue"
        else:
            waited = format_age(timedelta(seconds=status.waited_s))
            where = (
                f"while waiting in the queue (#{status.position} of {status.queue_length}, "
                f"for {waited})"
            )
        return Interrupted(f"interrupted {where}; the job left the queue and holds no GPU")


def wait_line(status: WaitStatus, width: int) -> str:
    """The waiting line in ``width`` characters, shortened by what matters least (cutting it at
    the width cut exactly who holds the GPUs, the part that says whom to ask: tests/
    test_terminal_output.py, the waiting line on an 80-column terminal).
    In turn: the reason loses words from its end, then goes; the words around the position
    shrink; the holders after the first that fit give way to a count, then all of them."""
    from datetime import timedelta

    from gpualloc.ledger.occupancy import format_age

    waited = format_age(timedelta(seconds=status.waited_s))
    long_head = f"gpualloc: waiting {waited}, #{status.position} of {status.queue_length}"
    short_head = f"waiting {waited}, #{status.position}/{status.queue_length}"
    holders = f"; {status.holders}" if status.holders else ""
    words = status.reason.split()
    for kept in range(len(words), min(3, len(words)) - 1, -1):  # two words say nothing
        reason = " ".join(words[:kept]) + ("" if kept == len(words) else " …")
        text = f"{long_head} in the queue: {reason}{holders}"
        if len(text) <= width:
            return text
    for head in (long_head, short_head):
        if len(head + holders) <= width:
            return head + holders
    entries = status.holders.removeprefix("held by ").split(", ")
    for kept in range(len(entries) - 1, 0, -1):
        text = f"{short_head}; held by {', '.join(entries[:kept])} +{len(entries) - kept} more"
        if len(text) <= width:
            return text
    for text in (f"{short_head}; held by {len(entries)}: see gpualloc status", short_head):
        if len(text) <= width:
            return text
    return short_head[:width]


def wait_options(
    *, wait: bool, timeout: str | None, priority: str | None, max_bypass: int | None
) -> WaitOptions | None:
    """The queue options, or None without --wait (usage errors for options that need it)."""
    if not check_wait_flags(wait=wait, timeout=timeout, priority=priority, max_bypass=max_bypass):
        return None
    from gpualloc.host.queue_policy import WaitOptions
    from gpualloc.model.option_values import parse_duration

    return WaitOptions.from_config(
        STATE.config(),
        timeout_s=parse_duration(timeout) if timeout is not None else None,
        priority=priority,  # type: ignore[arg-type]
        max_bypass=max_bypass,
    )


def check_wait_flags(
    *, wait: bool, timeout: str | None, priority: str | None, max_bypass: int | None
) -> bool:
    """Whether the job waits; usage errors for queue options without ``--wait``."""
    from gpualloc.errors import RequestError

    if priority is not None and priority not in ("high", "normal", "low"):
        from gpualloc.model.option_values import unknown_choice

        raise unknown_choice("--priority", priority, ("high", "normal", "low"))
    if not wait and (timeout is not None or priority is not None or max_bypass is not None):
        raise RequestError(
            "--timeout, --priority and --max-bypass apply to --wait", hint="add --wait"
        )
    return wait


ALLOC_FORMATS = (
    ("ids", "the GPU indices: 0,1"),
    ("env", "export lines for eval"),
    ("json", "the lease and its placement"),
)
"""What ``alloc --format`` prints (:func:`print_allocation`), and a line about each for
completion (:func:`gpualloc.cli.complete.alloc_formats`)."""


def alloc_owner(output_format: str, pid: int | None, hold: bool) -> int | None:
    """The pid an ``alloc`` lease lives with (None: ``--hold``); usage errors first."""
    import os

    from gpualloc.errors import RequestError

    if output_format not in dict(ALLOC_FORMATS):
        from gpualloc.model.option_values import unknown_choice

        raise unknown_choice("--format", output_format, dict(ALLOC_FORMATS))
    if pid is not None and hold:
        raise RequestError("--pid and --hold both say how long the lease lives", hint="give one")
    owner = None if hold else (pid or os.getppid())
    if owner == 1:
        raise RequestError(
            "gpualloc's parent is init, so the lease would end at once",
            hint="give --pid of the process that uses the GPUs, or --hold",
        )
    if pid is None and owner is not None:
        from gpualloc.ledger.liveness import output_read_by_parent_shell

        if output_read_by_parent_shell(owner):
            raise RequestError(
                f"gpualloc's parent (pid {owner}) is a subshell whose output your shell reads "
                "($(...)), so the lease would end with it as soon as alloc returns",
                hint="give --pid $$ for a lease as long as your shell, or --hold until "
                "'gpualloc release'",
            )
    return owner


def print_allocation(
    output_format: str,
    variables: dict[str, str],
    views: Callable[[], tuple[dict[str, Any], dict[str, Any]]],
) -> None:
    """What ``alloc`` prints for ``--format``: the ids, shell exports, or JSON of the lease and
    its placement (``views``, asked only for JSON), with the job's variables."""
    from gpualloc.cli.output import print_json, write_stdout

    if output_format == "ids":
        write_stdout(variables["CUDA_VISIBLE_DEVICES"] + "\n")
        _say_lease_on_a_terminal(variables.get("GPUALLOC_LEASE_ID"))
    elif output_format == "env":
        from gpualloc.launcher.environment import shell_exports

        write_stdout(shell_exports(variables))
    else:
        lease, placement = views()
        print_json({"lease": lease, "placement": placement, "environment": variables})


def _say_lease_on_a_terminal(lease_id: str | None) -> None:
    """The lease's id on standard error when a person reads it (a terminal): the ids on
    standard output are all a script reads, and the one thing a person then needs is how to
    give the GPUs back (``alloc`` printed no lease id)."""
    import os
    import sys

    if lease_id and os.isatty(2):
        sys.stderr.write(f"lease {lease_id}: 'gpualloc release {lease_id}' gives the GPUs back\n")


def check_release(leases: list[str], *, mine: bool, include_running: bool) -> None:
    """The usage errors of ``release``."""
    from gpualloc.errors import RequestError

    if not leases and not mine:
        raise RequestError(
            "nothing to release", hint="give lease ids or names, or --mine for all yours"
        )
    if include_running and not mine:
        raise RequestError(
            "--include-running applies to --mine (a lease named is released, running or not)",
            hint="add --mine",
        )


def report_release(receipt: Receipt, *, mine: bool, as_json: bool) -> None:
    """What ``release`` says: the leases released and kept on stdout, the kept ones on stderr
    too (a person must hear that a running job's GPUs stay reserved), and the problems'
    messages in ``--json``."""
    from gpualloc.cli.output import print_json, write_stdout

    if as_json:
        print_json(
            {
                "released": [view for _, view in receipt.released],
                "kept": [view for _, view in receipt.kept],
                "errors": [problem.message for problem in receipt.problems],
            }
        )
    else:
        lines = [f"released {text}" for text, _ in receipt.released]
        if mine and not lines and not receipt.kept and not receipt.problems:
            lines.append("you hold no lease")
        write_stdout("".join(line + "\n" for line in lines))
    for text, _ in receipt.kept:
        say(f"kept {text} (its job still runs)")
    if receipt.kept:
        say("to release a running job's lease too, name it or add --include-running")
