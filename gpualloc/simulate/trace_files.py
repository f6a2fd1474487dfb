"""Which kind of trace a file holds, and its jobs: gpualloc's own (JSON Lines or CSV,
:mod:`.trace`) or the Alibaba GPU cluster trace (:mod:`.openb`), recognised by its header."""

from __future__ import annotations

from pathlib import Path

from gpualloc.errors import TraceError
from gpualloc.simulate.openb import looks_like_openb, read_openb
from gpualloc.simulate.trace import BOM, SimJob, parse_trace


def read_trace_file(path: Path, *, host_model: str | None = None) -> tuple[list[SimJob], list[str]]:
    """The jobs of ``path`` in arrival order, and notes on what was skipped or defaulted (a
    byte order mark, which spreadsheet programs write before a CSV, is skipped)."""
    from gpualloc.user_files import read_user_text

    text = read_user_text(path, "trace", error=TraceError).removeprefix(BOM)
    if looks_like_openb(text):
        trace = read_openb(text, source=str(path), host_model=host_model)
        return trace.jobs, ["read as the Alibaba GPU trace (openb pod list)", *trace.notes()]
    return parse_trace(text, source=str(path)), []
