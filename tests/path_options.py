"""The command line's options that name a path gpualloc does not read as a file: those it
writes (an output file, or the directory ``--plot`` fills) and the broker's state directory.
The options that name a file it reads are ``READERS`` of tests/test_user_files.py; between
them, every option declared to take a path."""

from __future__ import annotations

WRITTEN_OR_DIRECTORIES = {
    "simulate --save-trace", "simulate --plot", "simulate --report", "topo record --output",
    "topo export --output", "topo import --output", "serve --state-dir",
}  # fmt: skip
