"""Prometheus's text exposition format, as ``gpualloc metrics`` writes it, read back."""

from __future__ import annotations

import re

_SAMPLE = re.compile(r"^([a-z_]+)(?:\{(.*)\})? (\S+)$")


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """Metrics text -> {(name, labels): value}."""
    found = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        match = _SAMPLE.match(line)
        assert match, line
        labels = frozenset(re.findall(r'(\w+)="([^"]*)"', match[2] or ""))
        found[(match[1], labels)] = float(match[3])
    return found


def value(found: dict, name: str, **labels: str) -> float:
    return found[(name, frozenset(labels.items()))]
