"""What the ledger commands share: opening this host's ledger and telling people about it."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING

from gpualloc.cli.state import STATE

if TYPE_CHECKING:
    from gpualloc.launcher.allocate import HostLedger


def open_host_ledger(*, ignore_foreign: bool = False, create: bool = True) -> HostLedger:
    """The selected topology with its ledger and GPU processes; warnings go to stderr."""
    from gpualloc.launcher.allocate import HostLedger

    host = HostLedger.open(STATE.load_topology(), ignore_foreign=ignore_foreign, create=create)
    warn(host.processes.notes)
    return host


def warn(lines: Iterable[str]) -> None:
    for line in lines:
        sys.stderr.write(f"gpualloc: warning: {line}\n")


def say(line: str) -> None:
    sys.stderr.write(f"gpualloc: {line}\n")
