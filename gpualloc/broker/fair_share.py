"""Fair share between users for the broker's queue.

Turn order is: priority class, then the user who has had the fewest GPU-seconds lately, then
arrival. "Lately" is an exponentially decaying sum, Slurm's fair-share factor in its simplest
form (``PriorityDecayHalfLife``): every GPU-second a user's leases hold counts, and halves in
weight every ``queue.fair_share_half_life`` (1 hour by default), running leases included, as
they run. Between users whose usage is equal to a tenth of a GPU-second (two users with no
past, one of whose jobs has just started), the one holding fewer GPUs now goes first. So user
A's 32 queued one-GPU jobs do not keep user B's one job behind all 32: once A's first job
runs, B's is next.

The usage is kept beside the ledger (``fair-share.json``, written once a second when it
changed, :meth:`FairShare.save`), so a broker restart does not forgive anyone's past: what was
saved is decayed by the time the broker was down, and the leases held then count at once.
``max_bypass`` and the backfill window keep their meaning:
:func:`gpualloc.host.queue.next_start` applies them to whatever order it is given.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from gpualloc.ledger.schema import PRIORITY_RANK, Lease, Waiter

SAVE_FAILURE_SAID_S = 60.0
"""How often the broker's log says again that the fair share cannot be saved."""


class FairShare:
    """Decayed GPU-seconds per uid."""

    def __init__(
        self,
        half_life_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.half_life_s = half_life_s
        self.clock = clock
        self.log = log
        """Where a failed save is said (the broker's log; None: nowhere)."""
        self._quiet_until: float | None = None
        """While saves fail: when the next failure is said again (:data:`SAVE_FAILURE_SAID_S`)."""
        self.usage: dict[int, float] = {}
        self.held: dict[int, int] = {}
        """GPUs each uid holds now (whole GPUs; a shared or MIG place counts as one)."""
        self._last = clock()
        self._saved = ""

    def account(self, leases: Iterable[Lease]) -> None:
        """Add what ``leases`` held since the last call, decaying what came before."""
        now = self.clock()
        elapsed = max(0.0, now - self._last)
        self._last = now
        decay = math.pow(0.5, elapsed / self.half_life_s) if self.half_life_s > 0 else 0.0
        self.usage = {uid: used * decay for uid, used in self.usage.items() if used * decay > 1e-3}
        held: dict[int, int] = {}
        for lease in leases:
            held[lease.uid] = held.get(lease.uid, 0) + max(1, len(lease.gpus))
        for uid, gpus in held.items():
            self.usage[uid] = self.usage.get(uid, 0.0) + gpus * elapsed
        self.held = held

    def order(self, queue: Sequence[Waiter]) -> list[Waiter]:
        """``queue`` in turn order (module docstring)."""
        return sorted(
            queue,
            key=lambda w: (
                PRIORITY_RANK[w.priority],
                round(self.usage.get(w.uid, 0.0), 1),
                self.held.get(w.uid, 0),
                w.seq,
            ),
        )

    def save(self, path: Path) -> None:
        """Write the usage (decayed to now) for the next broker (module docstring)."""
        from gpualloc.atomic import write_text_atomic

        text = json.dumps(
            {"saved": time.time(), "usage": {str(u): round(v, 3) for u, v in self.usage.items()}},
            sort_keys=True,
        )
        if text == self._saved:
            return
        try:
            write_text_atomic(path, text + "\n", mode=0o644, sync=False)
        except OSError as exc:
            self._failed(path, exc)
            return
        self._saved = text
        if self._quiet_until is not None:
            self._quiet_until = None
            self._say(f"the users' fair share is saved again to {path}")

    def _failed(self, path: Path, exc: OSError) -> None:
        """A save that failed (a full state disk): the queue goes on from the usage in memory,
        and the save is tried again at the next change. Said once, then once a minute while it
        fails, not once a second with a traceback (tests/test_broker_deadlines.py)."""
        now = self.clock()
        if self._quiet_until is not None and now < self._quiet_until:
            return
        self._quiet_until = now + SAVE_FAILURE_SAID_S
        self._say(
            f"warning: the users' fair share could not be saved to {path}: "
            f"{exc.strerror or exc}; the queue uses what it has in memory (said again in "
            f"{SAVE_FAILURE_SAID_S:g} s at most while it fails)"
        )

    def _say(self, line: str) -> None:
        if self.log is not None:
            self.log(line)

    def load(self, path: Path) -> None:
        """The usage a previous broker saved, decayed by the time since (nothing when there is
        no file, or one that does not read as saved usage)."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            saved = float(data["saved"])
            usage = {int(uid): float(used) for uid, used in data["usage"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return
        away = max(0.0, time.time() - saved)
        decay = math.pow(0.5, away / self.half_life_s) if self.half_life_s > 0 else 0.0
        self.usage = {uid: used * decay for uid, used in usage.items() if used >= 0}

    def standing(self) -> dict[int, tuple[int, float]]:
        """uid -> (GPUs held now, decayed GPU-seconds), for ``status``."""
        uids = set(self.usage) | set(self.held)
        return {uid: (self.held.get(uid, 0), self.usage.get(uid, 0.0)) for uid in uids}
