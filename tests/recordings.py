"""The recorded files of ``tests/fixtures``: real ``nvidia-smi`` and ``numactl`` outputs of
many machines (``fixtures/topologies``, each with a header saying where it came from) and the
other fixtures beside them."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
RECORDED = FIXTURES / "topologies"


def recorded(name: str) -> str:
    """A recorded output without its provenance header (everything up to the first blank line)."""
    text = (RECORDED / name).read_text(encoding="utf-8")
    return text.split("\n\n", 1)[1]
