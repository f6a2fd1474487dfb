"""This machine: its name, its installation's id, and which boot of it we are in (the kernel's
random boot id).

Discovered topologies are cached per boot (GPUs may change across a reboot), and leases are
valid for the boot that made them (no process, lock or Slurm job survives a reboot).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
MACHINE_ID_PATHS = (Path("/etc/machine-id"), Path("/var/lib/dbus/machine-id"))


@functools.cache
def boot_id() -> str | None:
    """The current boot id, or None where the kernel does not offer one. Read once a process:
    no process outlives its boot (the broker read it for every lease it made)."""
    try:
        return BOOT_ID_PATH.read_text().strip() or None
    except OSError:
        return None


def hostname() -> str:
    """This machine's name, as ``socket.gethostname()`` returns it on Linux (the kernel's
    nodename), without importing socket on every command's path."""
    return os.uname().nodename


def machine_id() -> str | None:
    """This installation's id (systemd's ``/etc/machine-id``, else D-Bus's copy), which survives
    reboots and, unlike the host name, tells apart machines that share one (cloud VMs are often
    all called ``vm`` or ``localhost``); None where neither file exists."""
    for path in MACHINE_ID_PATHS:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text:
            return text
    return None
