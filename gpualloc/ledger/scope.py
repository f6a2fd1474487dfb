"""Which ledger of the state directory a topology uses (see :class:`.statedir.StateDirectory`).

This host's topology uses the host ledger. Any other topology gets a ledger named after it and
after a digest of its GPUs' identities, so two different files that share a name do not share
leases, and the same file used by two users (or by a Slurm prolog and a user) does.
"""

from __future__ import annotations

import re

from gpualloc.discovery.this_host import describes_this_host
from gpualloc.model.topology import Topology

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def ledger_scope(topology: Topology) -> str | None:
    """None for this host's ledger; else ``<name>-<8 hex digits>``."""
    if describes_this_host(topology):
        return None
    identity = "\n".join(
        gpu.uuid or gpu.pci_bus_id or f"index {gpu.index}" for gpu in topology.gpus
    )
    digest = _sha256_hex(identity.encode())[:8]
    name = _UNSAFE.sub("_", topology.name or "topology").strip("._")[:40] or "topology"
    return f"{name}-{digest}"


def _sha256_hex(data: bytes) -> str:
    """SHA-256 of ``data`` in hex, from the interpreter's built-in module where it has one:
    :mod:`hashlib` loads OpenSSL, which every ``run`` on a recorded topology would pay for
    one digest. The digest is the same (it names existing ledger files)."""
    try:
        from _sha2 import sha256  # type: ignore[import-not-found]  # Python >= 3.12
    except ImportError:
        try:
            from _sha256 import sha256  # type: ignore[import-not-found]  # <= 3.11
        except ImportError:
            from hashlib import sha256
    return sha256(data).hexdigest()


def job_ledger_scope(host_scope: str | None, job_id: str) -> str:
    """The scope of a job's own ledger, beside the ledger of the host (``None``) or of a
    recorded topology (``host_scope``) that the job runs on."""
    return f"{host_scope or 'host'}+slurm-job-{job_id}"
