"""Where the library tells a person something while it works, without printing itself.

The library stays silent for Python callers; the command line (:func:`gpualloc.cli.main.run`)
points these hooks at stderr. A leaf module, so that setting a hook loads nothing else (``--help``
starts without the ledger's modules).
"""

from __future__ import annotations

from collections.abc import Callable

slow_wait: Callable[[str], None] | None = None
"""Told once when a wait for a ledger lock drags on (see :mod:`gpualloc.ledger.locking`)."""
