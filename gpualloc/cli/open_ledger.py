"""What the ledger commands share: opening this host's ledger, allocating with or without
--wait (and its status line), and the prefixed lines they tell people on stderr."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpualloc.cli.state import STATE

if TYPE_CHECKING:
    from gpualloc.launcher.allocate import Allocation, HostLedger, LeaseTerms
    from gpualloc.launcher.queue import WaitOptions
    from gpualloc.launcher.wait import WaitStatus
    from gpualloc.placement.want import Want


def open_host_ledger(
    *,
    ignore_foreign: bool = False,
    create: bool = True,
    check_health: bool = True,
    allow_unhealthy: bool = False,
    full: bool = True,
) -> HostLedger:
    """The selected topology with its ledger, GPU processes and GPU faults (``check_health``:
    placing or showing needs them; releasing does not); warnings go to stderr.

    Inside a Slurm job with GPUs, the job's own ledger, limited to the job's GPUs (see
    :mod:`gpualloc.slurm.job`). On a host with a broker, the broker's view of the host, whose
    changes the broker makes (:mod:`gpualloc.broker.remote`; ``full``: with the ledger and the
    GPUs' processes, which ``run`` and ``alloc`` do not need).
    """
    import os

    from gpualloc.launcher.allocate import HostLedger
    from gpualloc.slurm.job import slurm_job

    socket = broker_for_this_command()
    if socket is not None:
        from gpualloc.broker.remote import brokered_host

        host = brokered_host(socket, full=full)
        host.allow_unhealthy = allow_unhealthy
        warn(host.processes.notes)
        return host
    topology = STATE.load_topology()
    host = HostLedger.open(
        topology,
        ignore_foreign=ignore_foreign,
        create=create,
        slurm_job=slurm_job(topology, os.environ),
        state_dir=STATE.setting("state_dir"),
        lock_timeout_s=STATE.setting("lock_timeout"),
        check_health=check_health,
    )
    host.take_share_settings(STATE.config())
    host.allow_unhealthy = allow_unhealthy
    warn(host.processes.notes)
    return host


def broker_for_this_command() -> Path | None:
    """The broker's socket when this command's ledger is the broker's: there is one (see
    :func:`gpualloc.broker.address.broker_socket`), and the command is neither a trial on a
    topology of another host nor inside a Slurm job (whose GPUs have a ledger of their own)."""
    import os

    from gpualloc.broker.address import broker_socket

    socket = broker_socket(STATE.setting("host.broker"))
    if socket is None:
        return None
    if os.environ.get("SLURM_JOB_ID") and os.environ.get("GPUALLOC_NO_SLURM", "") in ("", "0"):
        return None
    if STATE.topology is not None or os.environ.get("GPUALLOC_TOPOLOGY"):
        from gpualloc.discovery.this_host import describes_this_host

        if not describes_this_host(STATE.load_topology()):
            return None
    return socket


def warn(lines: Iterable[str]) -> None:
    for line in lines:
        say(f"warning: {line}")


def say(line: str) -> None:
    """A line for people on stderr, prefixed so it stands out among the job's own output."""
    from gpualloc.cli.output import say as to_stderr

    to_stderr(f"gpualloc: {line}")


def allocate(
    host: HostLedger, want: Want, terms: LeaseTerms, waiting: WaitOptions | None
) -> Allocation:
    """Allocate now, or with --wait queue until it is this job's turn (with a status line)."""
    if waiting is None:
        return host.allocate(want, terms)
    from gpualloc.launcher.wait import wait_and_allocate

    line = StatusLine()
    try:
        if host.remote is not None:
            return host.remote.allocate(
                want,
                terms,
                waiting=waiting,
                report=line.show,
                allow_unhealthy=host.allow_unhealthy,
            )
        return wait_and_allocate(host, want, terms, waiting, report=line.show)
    finally:
        line.close()


class StatusLine:
    """One live line on stderr while waiting: redrawn in place on a terminal, otherwise a plain
    line each time what it says changes (not every tick: logs stay readable)."""

    def __init__(self) -> None:
        self.terminal = sys.stderr.isatty()
        self.drawn = False
        self.last_said: tuple[int, str, str] | None = None

    def show(self, status: WaitStatus) -> None:
        if self.terminal:
            import shutil

            width = shutil.get_terminal_size().columns
            text = f"gpualloc: {status.line()}"[: max(20, width - 1)]
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


def wait_options(
    *, wait: bool, timeout: str | None, priority: str | None, max_bypass: int | None
) -> WaitOptions | None:
    """The queue options, or None without --wait (usage errors for options that need it)."""
    from gpualloc.launcher.queue import WaitOptions
    from gpualloc.model.option_values import parse_duration

    if not check_wait_flags(wait=wait, timeout=timeout, priority=priority, max_bypass=max_bypass):
        return None
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
        raise RequestError(f"unknown --priority {priority!r}", hint="choose high, normal or low")
    if not wait and (timeout is not None or priority is not None or max_bypass is not None):
        raise RequestError(
            "--timeout, --priority and --max-bypass apply to --wait", hint="add --wait"
        )
    return wait


def alloc_owner(output_format: str, pid: int | None, hold: bool) -> int | None:
    """The pid an ``alloc`` lease lives with (None: ``--hold``); usage errors first."""
    import os

    from gpualloc.errors import RequestError

    if output_format not in ("ids", "env", "json"):
        raise RequestError(f"unknown --format {output_format!r}", hint="choose ids, env or json")
    if pid is not None and hold:
        raise RequestError("--pid and --hold both say how long the lease lives", hint="give one")
    owner = None if hold else (pid or os.getppid())
    if owner == 1:
        raise RequestError(
            "gpualloc's parent is init, so the lease would end at once",
            hint="give --pid of the process that uses the GPUs, or --hold",
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
    elif output_format == "env":
        from gpualloc.launcher.environment import shell_exports

        write_stdout(shell_exports(variables))
    else:
        lease, placement = views()
        print_json({"lease": lease, "placement": placement, "environment": variables})
