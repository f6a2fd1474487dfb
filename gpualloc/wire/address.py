"""Where the host's broker listens, found without importing the socket client.

Every ``run``, ``alloc`` and ``release`` asks this, broker or not, so it costs one ``stat``:
``host.broker`` (``GPUALLOC_BROKER``, ``[host] broker``) when set, that socket and nothing else
(one that does not answer is an error, never a fall-back to the file ledger); else
:data:`DEFAULT_SOCKET` when it exists (the systemd socket unit makes it); else None, the
embedded file ledger.
"""

from __future__ import annotations

import stat
from pathlib import Path

DEFAULT_SOCKET = "/run/gpualloc/gpualloc.sock"


def broker_socket(configured: Path | None) -> Path | None:
    """The broker's socket for this command, or None for the embedded ledger (module
    docstring). ``configured`` is the ``host.broker`` setting."""
    if configured is not None:
        return configured
    try:
        is_socket = stat.S_ISSOCK(Path(DEFAULT_SOCKET).stat().st_mode)
    except OSError:
        return None
    return Path(DEFAULT_SOCKET) if is_socket else None
