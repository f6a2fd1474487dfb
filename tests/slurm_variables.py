"""Slurm's variables as the tests set them by hand (the hooks' and a job's, without Slurm)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def outside_slurm() -> Iterator[None]:
    """A user of the node outside Slurm: none of slurmd's variables."""
    saved = {name: value for name, value in os.environ.items() if name.startswith("SLURM_")}
    for name in saved:
        del os.environ[name]
    try:
        yield
    finally:
        os.environ.update(saved)
