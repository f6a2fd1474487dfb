"""Where the host's broker listens, found without importing the socket client.

Every ``run``, ``alloc`` and ``release`` asks this, broker or not, so it costs one ``lstat``:
``host.broker`` (``GPUALLOC_BROKER``, ``[host] broker``) when set, that socket and nothing else
(one that does not answer is an error, never a fall-back to the file ledger); else
:data:`DEFAULT_SOCKET` when the host is in broker mode; else None, the embedded file ledger.

Broker mode is a property of the host, not the momentary presence of a socket: a broker that stops
cleanly removes its socket, and clients that took its absence for no broker would fall back to the
file ledger beside the broker's leases
(tests/test_broker_access.py::test_a_host_in_broker_mode_never_falls_back_to_the_file_ledger).
The mark is :data:`BROKER_DIRECTORY`, a directory root owns (``gpualloc serve`` and the systemd
units make it; a reboot or ``rmdir`` clears it): while it stands, a missing socket is exit 18, "the
broker does not answer". A directory another user made there is no mark.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

BROKER_DIRECTORY = "/run/gpualloc"
DEFAULT_SOCKET = f"{BROKER_DIRECTORY}/gpualloc.sock"


def broker_socket(configured: Path | None) -> Path | None:
    """The broker's socket for this command, or None for the embedded ledger (module
    docstring). ``configured`` is the ``host.broker`` setting."""
    if configured is not None:
        return configured
    try:
        mark = os.lstat(BROKER_DIRECTORY)
    except OSError:
        return None
    if not stat.S_ISDIR(mark.st_mode) or mark.st_uid != 0:
        return None
    return Path(DEFAULT_SOCKET)
