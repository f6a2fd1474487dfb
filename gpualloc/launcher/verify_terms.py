"""How a job's verifier checks that the job runs on its lease's GPUs (``verify.grace``,
``verify.action``): the terms alone, which ``run`` builds on its way to ``exec`` without the
verifier's own imports (:mod:`.verify` does the checking)."""

from __future__ import annotations

from typing import Literal

from msgspec import Struct

POLL_S = 2.0
"""How often the verifier looks at the GPUs' running-process lists."""
VerifyAction = Literal["warn", "kill"]


class VerifyTerms(Struct, frozen=True):
    grace_s: float
    action: VerifyAction = "warn"
    poll_s: float = POLL_S
