"""Starting the broker: its directory, its lock, its socket, then the loop.

Who runs it: root, as slurmd does (the systemd unit of ``examples/systemd``). A dedicated
system user works as well where ``/proc`` is not mounted with ``hidepid`` (the broker reads
other users' ``/proc/PID/stat`` and ``status`` to check and follow their processes, and opens
pidfds for them, which needs no privilege) and NVML lists every user's GPU processes to it;
the state directory must then be that user's. Root's Slurm hooks talk to whichever runs.

Order matters for a clean failure: the state directory is checked and ``ledger.lock`` taken
(a second broker, or a root tool writing the ledger, makes this one refuse to start) before
the socket is made, and the socket is ready before the process reports itself ready
(``sd_notify``'s ``READY=1`` under systemd, or the parent's exit with ``--background``).
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from gpualloc.broker.fair_share import FairShare
from gpualloc.broker.limits import Limits
from gpualloc.broker.listener import activated, listening_socket
from gpualloc.broker.log import log_line, log_lines
from gpualloc.broker.server import Broker
from gpualloc.broker.service import LedgerService
from gpualloc.config import Config
from gpualloc.errors import BrokerError
from gpualloc.host.local import LocalHost
from gpualloc.host.queue_policy import QueuePolicy
from gpualloc.host.time_rules import TimeRules
from gpualloc.ledger.idle import IdlePolicy
from gpualloc.model.printable import count_of
from gpualloc.model.topology import Topology


def serve(
    topology: Topology,
    *,
    socket_path: Path,
    state_dir: Path,
    config: Config,
    background: bool = False,
    ignore_foreign: bool = False,
    topology_file: Path | None = None,
) -> None:
    """Run the broker until SIGTERM or SIGINT (module docstring). ``topology_file``: the
    recorded topology it serves, whose declared processes it reads again as NVML's."""
    host = LocalHost.open(topology, state_dir=state_dir, owner=True, ignore_foreign=ignore_foreign)
    host.take_share_settings(config)
    host.placement_budget_s = config.system_value("broker.placement_budget")
    host.budget_setting = "broker.placement_budget"
    host.time_rules = TimeRules.from_config(config)
    service = LedgerService(
        host,
        QueuePolicy.from_config(config),
        FairShare(config.system_value("queue.fair_share_half_life"), log=log_line),
        config,
    )
    store = service.store
    if topology_file is not None and not host.this_host:
        service.topology_file = topology_file
    if not store.hold_lock():
        raise BrokerError(
            f"the ledger in {store.directory.path} is in use by {store.lock_holders()}",
            hint="another broker runs (systemctl status gpualloc), or a root gpualloc is "
            "writing it now; stop it first",
        )
    for litter in store.directory.path.glob(".ledger*.tmp"):  # a write a kill -9 cut short
        litter.unlink(missing_ok=True)
    damaged = store.set_aside_damaged()
    if damaged is not None:
        log_line(f"warning: {damaged}")
    before = _take_priority()
    try:
        listener = listening_socket(socket_path)
        made_here = not activated()  # systemd's socket file is systemd's to remove
        limits = Limits(
            config.system_value("broker.max_connections"),
            config.system_value("broker.max_requests_per_s"),
            config.system_value("broker.max_connects_per_s"),
            config.system_value("broker.idle_timeout"),
        )
        broker = Broker(
            service,
            listener,
            limits,
            idle_policy=IdlePolicy.from_config(config),
            log=log_lines,
            search_budget_s=config.value("placement.time_budget"),
        )
        log_line(
            f"serving {count_of(topology.gpu_count, 'GPU')} of {topology.name or 'this host'} on "
            f"{socket_path}, ledger {store.directory.ledger_file} (pid {os.getpid()})"
        )
        if background:
            _detach()
        _notify_ready()
        try:
            broker.serve()
        finally:
            if made_here:
                socket_path.unlink(missing_ok=True)
            log_line("stopped")
    finally:  # a broker served in-process (tests) leaves its caller as it was
        if before is not None:
            os.setpriority(os.PRIO_PROCESS, 0, before)


NICE = -10
"""The broker's nice value. One loop serves every user, and until it accepts a connection it
cannot tell whose it is: a user whose processes connect at full speed, each with the CPU share
of the broker, fill the listen queue faster than it drains it, and everyone's calls wait behind
them (:data:`~.listener.BACKLOG`). At -10 the kernel gives the broker about nine times the CPU
of a process at 0 (CFS weights 9548 and 1024), as a daemon that must answer others does."""


def _take_priority() -> int | None:
    """:data:`NICE` for the broker and the worker it starts, when root runs it at nice 0 (a
    value the administrator chose, ``Nice=`` in the unit, is theirs); the nice value it had,
    where it was changed."""
    if os.geteuid() != 0:
        return None
    try:
        if os.getpriority(os.PRIO_PROCESS, 0) == 0:
            os.setpriority(os.PRIO_PROCESS, 0, NICE)
            return 0
    except OSError as exc:  # a container without CAP_SYS_NICE
        log_line(
            f"warning: the broker keeps nice 0 ({exc.strerror}): a user's connect flood "
            "delays everyone's calls more"
        )
    return None


def _detach() -> None:
    """Fork into the background; the parent exits 0 once the child is ready (it is: the
    socket listens and the lock is held, and the child inherits both)."""
    if os.fork() > 0:
        os._exit(0)
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    sys.stdout = Path(os.devnull).open("w")  # noqa: SIM115 - the process's stdout from now on


def _notify_ready() -> None:
    """Tell systemd (``Type=notify``) that the broker serves."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        try:
            notify.connect(address)
            notify.sendall(b"READY=1")
        except OSError:
            pass
