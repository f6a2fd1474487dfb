"""How a job's verifier checks that the job runs on its lease's GPUs (``verify.grace``,
``verify.action``): the terms alone, which ``run`` builds on its way to ``exec`` without the
verifier's own imports (:mod:`.verify` does the checking), and without msgspec."""

from __future__ import annotations

from typing import Literal

POLL_S = 2.0
"""How often the verifier looks at the GPUs' running-process lists."""
VerifyAction = Literal["warn", "kill"]


class VerifyTerms:
    """Check for ``grace_s`` seconds, every ``poll_s``, and on a job off its GPUs ``action``:
    warn, or kill it. (A plain class: ``run`` makes one on its way to ``exec``.)"""

    __slots__ = ("action", "grace_s", "poll_s")

    def __init__(self, grace_s: float, action: VerifyAction = "warn", poll_s: float = POLL_S):
        self.grace_s = grace_s
        self.action: VerifyAction = action
        self.poll_s = poll_s
