"""The recorded benchmark outputs of ``fixtures/measured`` (copied from shared/reference/measured
with their provenance headers), read as gpualloc reads them."""

from __future__ import annotations

from pathlib import Path

from gpualloc.measurements.recognise import read_recording
from gpualloc.measurements.records import Recording

MEASURED = Path(__file__).parent / "fixtures" / "measured"


def recording(relative: str) -> Recording:
    """The recording at ``relative`` under fixtures/measured (which must be a benchmark's)."""
    found = read_recording((MEASURED / relative).read_text(), source=str(MEASURED / relative))
    assert found is not None, relative
    return found
