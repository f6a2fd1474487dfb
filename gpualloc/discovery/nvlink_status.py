"""Parser for ``nvidia-smi nvlink -s`` (``--status``) text.

Pure: ``parse_nvlink_status(text) -> list[NvlinkGpuStatus]``. Handles the formats in
tests/fixtures/topologies: ``GPU n: NAME (UUID: ...)`` headers with or without the UUID (old
drivers), ``Link k: 25.781 GB/s`` or ``<inactive>`` lines, the message NVML prints for a GPU whose
links are all inactive, authors' ``[snip]`` / ``...<snip>...`` cuts (noted, not fatal), and
``#`` comments or shell prompts pasted above the output.
"""

from __future__ import annotations

import re

from msgspec import Struct, field

from gpualloc.discovery.text import is_comment_or_prompt
from gpualloc.errors import TopologyParseError

_GPU_HEADER = re.compile(r"^GPU (\d+): (.+?)(?: \(UUID: (\S+)\))?\s*$")
_LINK_LINE = re.compile(r"^\s*Link (\d+):\s*(.+?)\s*$")
_RATE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)\s*(GB/s|MB/s|Gbps)$")
_INACTIVE = re.compile(r"^<?inactive>?$", re.IGNORECASE)
_ALL_INACTIVE = re.compile(r"all links are in\s*active", re.IGNORECASE)
_SNIP = re.compile(r"^\s*(\[snip\]|\.\.\.\s*<snip>\s*\.\.\.|\.\.\.)\s*$", re.IGNORECASE)


class NvlinkGpuStatus(Struct):
    """One GPU's block: its links' rates in GB/s (None = inactive)."""

    index: int
    name: str
    uuid: str | None
    links: dict[int, float | None] = field(default_factory=dict)
    snipped: bool = False
    """An author cut lines out of this GPU's block, so its link list is incomplete."""

    @property
    def active_links(self) -> int:
        return sum(1 for rate in self.links.values() if rate is not None)

    @property
    def link_gbps(self) -> float | None:
        """The common per-link rate of the active links (the lowest if they differ)."""
        rates = [rate for rate in self.links.values() if rate is not None]
        return min(rates) if rates else None


def parse_nvlink_status(text: str, *, source: str | None = None) -> list[NvlinkGpuStatus]:
    gpus: list[NvlinkGpuStatus] = []
    current: NvlinkGpuStatus | None = None
    for number, raw in enumerate(text.replace("\r\n", "\n").split("\n"), start=1):
        line = raw.rstrip()
        if not line.strip() or is_comment_or_prompt(line):
            continue
        if header := _GPU_HEADER.match(line):
            current = NvlinkGpuStatus(int(header.group(1)), header.group(2), header.group(3))
            if any(g.index == current.index for g in gpus):
                raise TopologyParseError(
                    f"GPU {current.index} appears twice", line_number=number, source=source
                )
            gpus.append(current)
        elif _SNIP.match(line):
            if current is not None:
                current.snipped = True
        elif _ALL_INACTIVE.search(line):
            if current is None:
                raise TopologyParseError(
                    "NVML message before any GPU header", line_number=number, source=source
                )
        elif link := _LINK_LINE.match(line):
            if current is None:
                raise TopologyParseError(
                    "link line before any 'GPU n:' header",
                    line_number=number,
                    source=source,
                    token=line.strip(),
                )
            current.links[int(link.group(1))] = _parse_rate(link.group(2), number, source)
        else:
            raise TopologyParseError(
                "not a line of 'nvidia-smi nvlink -s' output",
                line_number=number,
                token=line.strip(),
                source=source,
                hint="record it with: nvidia-smi nvlink -s > nvlink.txt",
            )
    if not gpus:
        raise TopologyParseError(
            "no 'GPU n:' block found; is this 'nvidia-smi nvlink -s' output?", source=source
        )
    return gpus


def _parse_rate(text: str, line_number: int, source: str | None) -> float | None:
    if _INACTIVE.match(text):
        return None
    rate = _RATE.match(text)
    if not rate:
        raise TopologyParseError(
            "link rate is neither 'N GB/s' nor '<inactive>'",
            line_number=line_number,
            token=text,
            source=source,
        )
    value = float(rate.group(1))
    unit = rate.group(2)
    if unit == "MB/s":
        return value / 1000.0
    if unit == "Gbps":
        return value / 8.0
    return value
