"""What the host's administrator lets each user do in the queue.

The queue's rule (:mod:`.queue`) is fair only while nobody can lift its bounds for themselves:
one user's ``--wait -n 16 --max-bypass 0 --priority high`` would otherwise stop every other
job on the host, 15 free GPUs or not. So the system configuration (``/etc/gpualloc/config.toml``,
which users cannot write, and which no user file or variable may override) decides:

- who may use ``--priority high`` and a ``--max-bypass`` below the host's default
  (``queue.privileged``: user names and ``@group`` names; root always may);
- how many jobs one user may have waiting at once (``queue.max_waiting``, default 32);
- how long a waiting job may be passed by later ones at most (``queue.backfill_window``): after
  that no later job starts before it, whatever its bypass count (off by default: the count
  bound alone already guarantees that it starts).

A request beyond these bounds is refused with exit 12 and the setting that would allow it, never
silently weakened: a user who asked for ``--max-bypass 0`` must learn that it was not granted.

A waiting job's own options (:class:`WaitOptions`: its timeout, priority and bypass count, under
these bounds) live here too, beside the bounds and without the queue's rule: a client of the
host's broker builds them on its way to ``exec``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from msgspec import Struct, field

from gpualloc.config import BY_KEY, Config, system_file
from gpualloc.errors import NotPermitted, QueueFull
from gpualloc.model.printable import count_of

if TYPE_CHECKING:
    from gpualloc.ledger.schema import Priority, Waiter


def _default(key: str) -> Any:
    return field(default_factory=lambda: BY_KEY[key].default)


class QueuePolicy(Struct, frozen=True):
    """The system configuration's bounds on the queue."""

    privileged: tuple[str, ...] = _default("queue.privileged")
    min_bypass: int = _default("queue.max_bypass")
    """The host's default ``max_bypass``: a user may raise theirs, only the privileged lower it."""
    max_waiting: int = _default("queue.max_waiting")
    backfill_window_s: float | None = _default("queue.backfill_window")
    source: str = "the system configuration"

    @classmethod
    def from_config(cls, config: Config) -> QueuePolicy:
        return cls(
            privileged=config.system_value("queue.privileged"),
            min_bypass=config.system_value("queue.max_bypass"),
            max_waiting=config.system_value("queue.max_waiting"),
            backfill_window_s=config.system_value("queue.backfill_window"),
            source=str(system_file(config.env)),
        )

    def is_privileged(self, uid: int) -> bool:
        if uid == 0:
            return True
        import grp
        import pwd

        try:
            entry = pwd.getpwuid(uid)
        except KeyError:
            return False
        for name in self.privileged:
            if not name.startswith("@"):
                if name == entry.pw_name:
                    return True
                continue
            try:
                group = grp.getgrnam(name[1:])
            except KeyError:
                continue
            if entry.pw_gid == group.gr_gid or entry.pw_name in group.gr_mem:
                return True
        return False

    def admit(
        self, *, uid: int, priority: Priority, max_bypass: int, queue: Sequence[Waiter]
    ) -> None:
        """Raise :class:`NotPermitted` unless ``uid`` may join ``queue`` so."""
        privileged = self.is_privileged(uid)
        allowed_by = f"queue.privileged in {self.source}"
        if priority == "high" and not privileged:
            raise NotPermitted(
                "--priority high is for the users the host's administrator names",
                hint=f"use normal or low, or ask for a place in {allowed_by}",
            )
        if max_bypass < self.min_bypass and not privileged:
            raise NotPermitted(
                f"--max-bypass {max_bypass} is below this host's {self.min_bypass}: fewer "
                "passes would hold other users' jobs back",
                hint=f"use --max-bypass {self.min_bypass} or more (or unset GPUALLOC_MAX_BYPASS"
                f" / queue.max_bypass in your config.toml), or ask for a place in {allowed_by}",
            )
        mine = sum(1 for waiter in queue if waiter.uid == uid)
        if self.max_waiting and mine >= self.max_waiting and not privileged:
            raise QueueFull(
                f"you have {count_of(mine, 'job')} waiting already, this host's limit "
                f"(queue.max_waiting in {self.source})",
                hint="wait for some of them to start, or end some ('gpualloc status' lists them)",
            )


POLL_S = 0.25
"""How often a waiting job looks at the ledger (see :mod:`.wait`)."""
DEFAULT_MAX_BYPASS: int = BY_KEY["queue.max_bypass"].default
"""How many later jobs may start before a waiting one, before backfill past it stops."""


class WaitOptions(Struct, frozen=True):
    timeout_s: float | None = None
    priority: Priority = "normal"
    max_bypass: int = DEFAULT_MAX_BYPASS
    poll_s: float = POLL_S
    policy: QueuePolicy = field(default_factory=QueuePolicy)
    """The host's bounds (:mod:`.queue_policy`), checked when the job joins the queue."""

    @classmethod
    def from_config(
        cls,
        config: Config,
        *,
        timeout_s: float | None = None,
        priority: Priority | None = None,
        max_bypass: int | None = None,
    ) -> WaitOptions:
        """The options of a ``--wait``: flags over the configured defaults, under the host's
        queue policy (one place for the command line and :func:`gpualloc.api.hold`). The
        timeout is bounded as the broker bounds it, on either ledger."""
        from gpualloc.durations import seconds_given

        return cls(
            timeout_s=seconds_given(timeout_s, "timeout_s"),
            priority=config.value("queue.priority", priority),
            max_bypass=config.value("queue.max_bypass", max_bypass),
            policy=QueuePolicy.from_config(config),
        )
