"""How long a lease may live: the time limits the host's administrator sets, applied at the
door (before a lease is written or a waiter queued) by the embedded ledger and the broker alike.

The system configuration decides (a limit a user could lift for themselves would bind nobody;
on the cooperative file ledger a user can, as they can rewrite the ledger):
``limits.default_time`` is the limit of a lease that asks for none, cut to the maximum that
applies, and where it is unset the maximum is; ``limits.max_time`` is the longest one may ask
for, ``limits.max_hold`` the longest an ``alloc --hold`` lease lives, as Slurm's partitions
have ``DefaultTime`` and ``MaxTime`` (slurm.conf(5)). A request above a maximum is refused
with exit 12 naming the setting, never cut down silently: a user who asked for two days must
learn they did not get them. What happens at the limit is :mod:`gpualloc.broker.overdue`'s
through a broker, :mod:`gpualloc.launcher.time_limit`'s on the file ledger.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from gpualloc.errors import NotPermitted, RequestError
from gpualloc.setting_values import TIME_LIMIT_KEYS
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
    users: Mapping[str, Mapping[str, float | None]] = {}
    """``[limits.users.NAME]``: a user's own limits, which replace these."""
    groups: Mapping[str, Mapping[str, float | None]] = {}
    """``[limits.groups.NAME]``: the limits of a group's members (the longest wins)."""
    keys: tuple[str, str, str] = ("limits.default_time", "limits.max_time", "limits.max_hold")
    """The settings the three limits came from, for a refusal to name."""

    @classmethod
    def from_config(cls, config: Config) -> TimeRules:
        from gpualloc.config import system_file

        return cls(
            default_s=config.system_value("limits.default_time"),
            max_s=config.system_value("limits.max_time"),
            max_hold_s=config.system_value("limits.max_hold"),
            kill_wait_s=config.system_value("limits.kill_wait"),
            source=str(system_file(config.env)),
            users=config.system_value("limits.users"),
            groups=config.system_value("limits.groups"),
        )

    def for_uid(self, uid: int) -> TimeRules:
        """These rules as they bind ``uid``: what its own ``[limits.users.NAME]`` sets, else,
        key by key, the longest its groups' ``[limits.groups.NAME]`` set (none: no limit), else
        ``[limits]``, as Slurm's associations give a user's own limit, then their account's."""
        if not self.users and not self.groups:
            return self
        import pwd

        try:
            entry = pwd.getpwuid(uid)
        except KeyError:
            return self
        values, keys = list(self[:3]), list(self.keys)
        own = self.users.get(entry.pw_name, {})
        groups = [name for name in self.groups if _member(name, entry)]
        for index, key in enumerate(TIME_LIMIT_KEYS):  # TimeRules' order
            if key in own:
                values[index], keys[index] = own[key], f"limits.users.{entry.pw_name}.{key}"
                continue
            found = [(self.groups[g][key], g) for g in groups if key in self.groups[g]]
            if found:
                value, group = max(found, key=lambda x: math.inf if x[0] is None else x[0])
                values[index], keys[index] = value, f"limits.groups.{group}.{key}"
        default_s, max_s, max_hold_s = values
        return self._replace(
            default_s=default_s,
            max_s=max_s,
            max_hold_s=max_hold_s,
            keys=(keys[0], keys[1], keys[2]),
        )

    def granted(self, asked: float | None, *, hold: bool) -> float | None:
        """The limit a new lease gets (None: none) for ``asked`` (None: not given; 0: none
        asked for); :class:`NotPermitted` (exit 12) above a maximum. Root is bound too: a
        limit is the host's promise to the next user, whoever holds the GPUs."""
        bound, key = self.max_s, self.keys[1]
        if hold and self.max_hold_s is not None:
            bound, key = self.max_hold_s, self.keys[2]
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
        uid = os.geteuid() if terms.uid is None else terms.uid
        rules = self.for_uid(uid)
        terms.time_limit_s = rules.granted(terms.time_limit_s, hold=terms.hold)
        terms.time_granted = True
        if terms.signal is not None and terms.hold and terms.pid is None:
            raise RequestError(
                "--signal goes to the lease's process, and a --hold lease has none",
                hint="give --pid PID instead of --hold, or drop --signal",
            )
        if terms.signal is not None and terms.time_limit_s is None:
            raise RequestError(
                "--signal is sent before the time limit, and this lease has none",
                hint="give --time too (or ask the administrator for limits.default_time)",
            )


def _member(group: str, entry: Any) -> bool:
    """Whether the user of password ``entry`` belongs to ``group`` (its primary group too)."""
    import grp

    try:
        found = grp.getgrnam(group)
    except KeyError:
        return False
    return entry.pw_gid == found.gr_gid or entry.pw_name in found.gr_mem
