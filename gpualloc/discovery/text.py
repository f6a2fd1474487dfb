"""Helpers shared by the parsers of recorded command output."""

from __future__ import annotations

import re

_COMMENT_OR_PROMPT = re.compile(r"^\s*(#|\$ |\S*[$#] nvidia-smi|\S*[$#] numactl)")


def is_comment_or_prompt(line: str) -> bool:
    """``# ...`` comments and shell prompt lines that people paste above recorded output."""
    return bool(_COMMENT_OR_PROMPT.match(line))
