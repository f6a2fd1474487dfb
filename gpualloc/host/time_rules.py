"""How long a lease may live: the time limits the host's administrator sets, applied at the
door (before a lease is written or a waiter queued) by the embedded ledger and the broker alike.

The system configuration alone decides (a limit a user could lift for themselves would bind
nobody): ``limits.default_time`` is the limit of a job that asks for none, ``limits.max_time``
the longest one may ask for, ``limits.max_hold`` the longest an ``alloc --hold`` lease lives
(and the limit of a hold that asks for none), as Slurm's partitions have ``DefaultTime`` and
``MaxTime`` (slurm.conf(5)). A request above a maximum is refused with exit 12 naming the
setting, never cut down silently: a user who asked for two days must learn they did not get
them. What happens at the limit is :mod:`gpualloc.host.deadlines`'.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from gpualloc.errors import NotPermitted, RequestError
from gpualloc.time_limits import format_time_limit

if TYPE_CHECKING:
    from gpualloc.config import Config
    from gpualloc.host.lease_terms import LeaseTerms


class TimeRules(NamedTuple):
    """The system configuration's time limits (None: no such bound)."""

    default_s: float | None = None
    max_s: float | None = None
    max_hold_s: float | None = None
    kill_wait_s: float = 30.0
    """Between SIGTERM and SIGKILL for a job past its limit (``limits.kill_wait``)."""
    source: str = "the system configuration"

    @classmethod
    def from_config(cls, config: Config) -> TimeRules:
        from gpualloc.config import system_file

        return cls(
            default_s=config.system_value("limits.default_time"),
            max_s=config.system_value("limits.max_time"),
            max_hold_s=config.system_value("limits.max_hold"),
            kill_wait_s=config.system_value("limits.kill_wait"),
            source=str(system_file(config.env)),
        )

    def granted(self, asked: float | None, *, hold: bool) -> float | None:
        """The limit a new lease gets (None: none) for ``asked`` (None: not given; 0: none
        asked for); :class:`NotPermitted` (exit 12) above a maximum. Root is bound too: a
        limit is the host's promise to the next user, whoever holds the GPUs."""
        bound, key = self.max_s, "limits.max_time"
        if hold and self.max_hold_s is not None:
            bound, key = self.max_hold_s, "limits.max_hold"
        if asked is None:
            chosen = self.default_s if self.default_s is not None else bound
            if chosen is not None and bound is not None:
                chosen = min(chosen, bound)
            return chosen
        if bound is not None and (asked == 0 or asked > bound):
            what = "--time 0 (no limit)" if asked == 0 else f"--time {format_time_limit(asked)}"
            kind = "an 'alloc --hold' lease" if hold else "a job"
            raise NotPermitted(
                f"{what} is more than this host allows {kind} ({format_time_limit(bound)}, "
                f"{key} in {self.source})",
                hint=f"ask for --time {format_time_limit(bound)} or less",
            )
        return asked or None

    def grant(self, terms: LeaseTerms) -> None:
        """Apply these rules to ``terms``' asked limit, once (a request that passes two doors,
        the broker's and its host's, is granted at the first)."""
        if terms.time_granted:
            return
        terms.time_limit_s = self.granted(terms.time_limit_s, hold=terms.hold)
        terms.time_granted = True
        if terms.signal is not None and terms.time_limit_s is None:
            raise RequestError(
                "--signal is sent before the time limit, and this lease has none",
                hint="give --time too (or ask the administrator for limits.default_time)",
            )
