"""Text helpers shared by the parsers of recorded command output and the NVML readers."""

from __future__ import annotations

import re

_COMMENT_OR_PROMPT = re.compile(r"^\s*(#|\$ |\S*[$#] nvidia-smi|\S*[$#] numactl)")


def is_comment_or_prompt(line: str) -> bool:
    """``# ...`` comments and shell prompt lines that people paste above recorded output."""
    return bool(_COMMENT_OR_PROMPT.match(line))


def text_of(value: str | bytes | None) -> str | None:
    """NVML strings are bytes in older nvidia-ml-py releases, str in newer ones."""
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)
