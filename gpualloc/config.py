"""Defaults from configuration files and the environment, and where each value came from.

Precedence, highest first: a command-line flag, a ``GPUALLOC_*`` environment variable, the
user's file (``$XDG_CONFIG_HOME/gpualloc/config.toml``, else ``~/.config/gpualloc/config.toml``),
the system file (``/etc/gpualloc/config.toml``; ``GPUALLOC_SYSTEM_CONFIG`` names another, for
packagers and tests), the built-in default. ``gpualloc config show`` prints every effective value
with its source. A file is TOML::

    policy = "drb"              # plan, run, alloc
    numa = "bind"               # run
    ignore_foreign = false      # run, alloc
    state_dir = "/var/tmp/gpualloc"
    lock_timeout = "30s"        # waiting for the ledger's lock, then exit 16
    bandwidth_table = "/etc/gpualloc/bandwidth.json"   # or an inline [bandwidth_table] table

    [queue]
    priority = "normal"         # run --wait, alloc --wait
    max_bypass = 8              # in the system file also the least a user may ask for
    privileged = ["alice", "@gpuadmin"]   # system file only: may use --priority high and
                                          # a lower --max-bypass (root always may)
    max_waiting = 32            # system file only: waiting jobs per user (0: no limit)
    backfill_window = "2h"      # system file only: no backfill past a job waiting longer

    [share]
    max_jobs = 4                # system file only: shared jobs per GPU (run --share)

Settings that limit what one user may do to the others are read from the
system file only: a user's own file or a variable that sets them is an error, since a limit a
user could lift for themselves would bind nobody.

An unknown key or a bad value is an error naming the file and the key (exit 15), never silently
ignored: a typo in a system file would otherwise change nothing and nobody would know why.
Reading is cheap (no pydantic): completion and ``--help`` may load this module.

NamedTuples, not msgspec Structs: completion asks for lease ids through this module, and msgspec
would double what that costs. A leaf: it imports nothing of gpualloc but :mod:`gpualloc.errors`,
:mod:`gpualloc.setting_values` (what a value may be) and what that reads
(tests/test_architecture.py::test_the_configuration_is_a_leaf). The defaults live here; what a value
means is checked where it is used (a policy name by
:func:`gpualloc.placement.policies.registry.configured_policy`, the ``[idle]`` table by
:meth:`gpualloc.ledger.idle.IdlePolicy.from_config`, a bandwidth table by
:func:`gpualloc.discovery.resolve.configured_bandwidth_table`).
"""

import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from gpualloc.errors import ConfigError
from gpualloc.setting_values import (
    absolute_path,
    absolute_path_or_none,
    boolean,
    choice,
    command_or_none,
    count_value,
    duration,
    duration_or_none,
    duration_or_off,
    limit_tables,
    name_value,
    names_value,
    path_or_table,
    percent,
    time_limit_or_none,
)

DEFAULT_POLICY = "mapa"
DEFAULT_STATE_DIR = Path("/var/tmp/gpualloc")
DEFAULT_MAX_SHARED_JOBS = 4
"""Shared jobs (``run --share``) one GPU runs at once, unless ``share.max_jobs`` says."""
SHARE_PLACEMENT_NAMES = ("fgd", "best-fit", "first-fit", "spread")
"""The share placement rules ``share.placement`` may name, the default first. The rules are
:mod:`gpualloc.placement.sharing.rules`, which this leaf cannot import; a test holds the names
equal (tests/test_placement_rules.py)."""
DEFAULT_BUSY_PERCENT = 5
"""Utilisation (%) from which a GPU counts as used: CUDA contexts alone show 0-1 %."""
DEFAULT_MAX_GAP_S = 15 * 60.0
DEFAULT_NOTICE_S = 30 * 60.0
BROKER_TIMEOUT_S = 10.0
"""``host.broker_timeout``'s default: Slurm's clients wait ``MessageTimeout`` for slurmctld, 10 s
unless slurm.conf says otherwise (:data:`gpualloc.wire.client.ANSWER_S`, which the client
falls back to, is the same figure)."""

SYSTEM_FILE = Path("/etc/gpualloc/config.toml")
SYSTEM_FILE_VARIABLE = "GPUALLOC_SYSTEM_CONFIG"
TOPOLOGY_VARIABLE = "GPUALLOC_TOPOLOGY"
NO_SLURM_VARIABLE = "GPUALLOC_NO_SLURM"
DEFAULT_SOURCE = "default"


class Setting(NamedTuple):
    """One configurable default."""

    key: str
    """Its name in config.toml (``queue.max_bypass`` lives in the ``[queue]`` table)."""
    variable: str | None
    default: Any
    parse: Callable[[Any], Any]
    about: str
    flag: str | None = None
    system_only: bool = False
    """Read from the system file alone (a limit users must not lift for themselves)."""

    @property
    def is_duration(self) -> bool:
        """Its value is seconds, which people write as a duration (``15m``, ``30s``)."""
        return self.parse in (duration, duration_or_none, duration_or_off, time_limit_or_none)


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "policy", "GPUALLOC_POLICY", DEFAULT_POLICY, name_value, "placement policy", "--policy"
    ),
    Setting(
        "numa", "GPUALLOC_NUMA", "auto", choice("auto", "bind", "none"),
        "NUMA binding of 'run'", "--numa",
    ),
    Setting(
        "ignore_foreign", "GPUALLOC_IGNORE_FOREIGN", False, boolean,
        "treat GPUs running processes gpualloc did not start as free", "--ignore-foreign",
    ),
    Setting(
        "state_dir", "GPUALLOC_STATE_DIR", DEFAULT_STATE_DIR, absolute_path,
        "the shared ledger's directory",
    ),
    Setting(
        "lock_timeout", "GPUALLOC_LOCK_TIMEOUT", 30.0, duration,
        "how long a command waits for the ledger's lock before exit 16",
    ),
    Setting(
        "bandwidth_table", "GPUALLOC_BANDWIDTH_TABLE", None, path_or_table,
        "link bandwidth overrides (a JSON file, or an inline table)", "--bandwidth-table",
    ),
    Setting(
        "placement.time_budget", "GPUALLOC_PLACEMENT_BUDGET", 1.0, duration,
        "how long one placement may search before a greedy answer is used (and said)",
    ),
    Setting(
        "queue.priority", "GPUALLOC_PRIORITY", "normal", choice("high", "normal", "low"),
        "queue class of --wait", "--priority",
    ),
    Setting(
        "queue.max_bypass", "GPUALLOC_MAX_BYPASS", 8, count_value,
        "later jobs that may start before a waiting one", "--max-bypass",
    ),
    Setting(
        "queue.privileged", None, (), names_value,
        "users and @groups who may use --priority high and a lower --max-bypass",
        system_only=True,
    ),
    Setting(
        "queue.max_waiting", None, 32, count_value,
        "waiting jobs a user may have in the queue at once (0: no limit)", system_only=True,
    ),
    Setting(
        "queue.backfill_window", None, None, duration_or_none,
        "no later job starts before one that has waited this long", system_only=True,
    ),
    Setting(
        "limits.default_time", None, None, time_limit_or_none,
        "the time limit of a job that gives no --time (none: no limit)", system_only=True,
    ),
    Setting(
        "limits.max_time", None, None, time_limit_or_none,
        "the longest --time a job may ask for (run, alloc, and the default)", system_only=True,
    ),
    Setting(
        "limits.max_hold", None, None, time_limit_or_none,
        "the longest an 'alloc --hold' lease may live (and its limit when it gives no --time "
        "and limits.default_time is unset)",
        system_only=True,
    ),
    Setting(
        "limits.users", None, {}, limit_tables,
        "per user, time limits that replace [limits]' ([limits.users.alice] max_time = ...)",
        system_only=True,
    ),
    Setting(
        "limits.groups", None, {}, limit_tables,
        "per Unix group, time limits for its members (the longest of their groups' wins)",
        system_only=True,
    ),
    Setting(
        "limits.kill_wait", None, 30.0, duration,
        "how long a job past its time limit has between SIGTERM and SIGKILL", system_only=True,
    ),
    Setting(
        "verify.grace", "GPUALLOC_VERIFY_GRACE", 60.0, duration_or_off,
        "how long after 'run' starts a job its GPUs are checked for it (\"off\": not checked)",
    ),
    Setting(
        "verify.action", "GPUALLOC_VERIFY_ACTION", "warn", choice("warn", "kill"),
        "what 'run' does with a job found on GPUs its lease does not hold",
    ),
    Setting(
        "idle.busy_percent", None, DEFAULT_BUSY_PERCENT, percent,
        "GPU utilisation from which a lease's GPUs count as used", system_only=True,
    ),
    Setting(
        "idle.max_gap", None, DEFAULT_MAX_GAP_S, duration,
        "looks ('gc') further apart than this start a new idle stretch", system_only=True,
    ),
    Setting(
        "idle.expire_holds", None, None, duration_or_none,
        "release --hold leases idle this long ('gc' does it, after notice)", system_only=True,
    ),
    Setting(
        "idle.notice", None, DEFAULT_NOTICE_S, duration,
        "how long before an idle --hold lease expires its holder is told", system_only=True,
    ),
    Setting(
        "idle.notify", None, None, command_or_none,
        "shell command run for each idle notice and expiry (the lease in GPUALLOC_*; killed "
        "after 5 s)",
        system_only=True,
    ),
    Setting(
        "host.broker", "GPUALLOC_BROKER", None, absolute_path_or_none,
        "the broker's socket (gpualloc serve); unset: /run/gpualloc/gpualloc.sock if it exists",
    ),
    Setting(
        "host.broker_timeout", "GPUALLOC_BROKER_TIMEOUT", BROKER_TIMEOUT_S, duration,
        "how long a client waits for the broker to say anything before exit 18 (busy or "
        "stopped)",
    ),
    Setting(
        "broker.state_dir", None, Path("/var/lib/gpualloc"), absolute_path,
        "the broker's own state directory (gpualloc serve --state-dir's default)",
        system_only=True,
    ),
    Setting(
        "broker.max_connections", None, 64, count_value,
        "connections one user may hold open to the broker at once", system_only=True,
    ),
    Setting(
        "broker.max_requests_per_s", None, 5000, count_value,
        "request cost per second one user may spend at the broker (bursts of twice that; a "
        "hello costs 1, a full snapshot 10)",
        system_only=True,
    ),
    Setting(
        "broker.max_connects_per_s", None, 200, count_value,
        "connections per second one user may open to the broker (bursts of twice that)",
        system_only=True,
    ),
    Setting(
        "broker.placement_budget", None, 0.015, duration,
        "how long the broker lets one placement search (seconds) before a greedy answer",
        system_only=True,
    ),
    Setting(
        "broker.idle_timeout", None, 60.0, duration,
        "how long a connection may stay open with nothing asked and nothing waiting",
        system_only=True,
    ),
    Setting(
        "queue.fair_share_half_life", None, 3600.0, duration,
        "broker queue: how fast a user's past GPU-seconds stop counting against them",
        system_only=True,
    ),
    Setting(
        "share.max_jobs", None, DEFAULT_MAX_SHARED_JOBS, count_value,
        "shared jobs (run --share) one GPU may run at once (0: no sharing)", system_only=True,
    ),
    Setting(
        "share.placement", None, SHARE_PLACEMENT_NAMES[0], choice(*SHARE_PLACEMENT_NAMES),
        "how a shared job's GPU is chosen: fgd (least growth of expected fragmentation), "
        "best-fit, first-fit or spread", system_only=True,
    ),
)  # fmt: skip
BY_KEY = {setting.key: setting for setting in SETTINGS}
TABLES = frozenset(setting.key.split(".")[0] for setting in SETTINGS if "." in setting.key)
"""The config files' tables (``[queue]``, ``[verify]``, ...), from the settings' keys."""


class Resolved(NamedTuple):
    """An effective value and where it came from (a flag, a variable, a file, the default)."""

    key: str
    value: Any
    source: str


def user_file(env: Mapping[str, str]) -> Path:
    base = env.get("XDG_CONFIG_HOME", "").strip()
    root = Path(base) if base else Path(env.get("HOME") or Path.home()) / ".config"
    return root / "gpualloc" / "config.toml"


def system_file(env: Mapping[str, str]) -> Path:
    named = env.get(SYSTEM_FILE_VARIABLE)
    if named is None:
        return SYSTEM_FILE
    if not named.strip():
        raise _empty(SYSTEM_FILE_VARIABLE, f"the system configuration file, {SYSTEM_FILE}")
    return Path(named.strip())


def no_slurm(env: Mapping[str, str]) -> bool:
    """Whether ``GPUALLOC_NO_SLURM`` tells gpualloc to ignore the Slurm job it runs in. Read
    with the boolean spellings of every setting (``1``, ``true``, ``yes``, ``on`` and their
    opposites); another word is an error, not a guess (``GPUALLOC_NO_SLURM=false``
    must not mean true)."""
    raw = env.get(NO_SLURM_VARIABLE)
    if raw is None:
        return False
    if not raw.strip():
        raise _empty(NO_SLURM_VARIABLE, "inside a Slurm job, the job's GPUs")
    try:
        return boolean(raw)
    except ValueError as exc:
        raise ConfigError(
            f"{NO_SLURM_VARIABLE} = {_shown(raw)}: {exc}",
            hint=f"set {NO_SLURM_VARIABLE}=1 to use the host's ledger inside a Slurm job, or unset "
            "it",
        ) from None


def _empty(variable: str, otherwise: str) -> ConfigError:
    return ConfigError(
        f"{variable} is set but empty",
        hint=f"give it a value, or unset it ('unset {variable}') to use {otherwise}",
    )


def _check_system_file(env: Mapping[str, str], path: Path, exists: bool) -> None:
    """A system file ``GPUALLOC_SYSTEM_CONFIG`` names is missing from a directory that exists:
    a typo, which would silently drop the host's limits. One whose
    directory does not exist either names no file on purpose (a test's or a chroot's bare
    host)."""
    if exists or env.get(SYSTEM_FILE_VARIABLE) is None or not path.parent.is_dir():
        return
    from gpualloc.user_files import shown_path

    raise ConfigError(
        f"{SYSTEM_FILE_VARIABLE} names {shown_path(path)}, which does not exist",
        hint=f"give the path of the system's config.toml, or unset {SYSTEM_FILE_VARIABLE} "
        f"to read {SYSTEM_FILE}",
    )


class Config(NamedTuple):
    """The environment and the parsed files, ready to answer :meth:`resolve`."""

    env: Mapping[str, str]
    files: tuple[tuple[Path, dict[str, Any]], ...]
    """(path, its checked settings, flattened) of the files that exist, highest precedence
    first."""
    variables: dict[str, Any]
    """Setting key -> its checked value, for each ``GPUALLOC_*`` variable set: every one is
    read when the configuration is, so a bad value stops any command before it does anything,
    whichever path the command line takes
    (tests/test_config.py::test_every_setting_is_checked_before_the_ledger_is_touched)."""

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None) -> "Config":
        env = os.environ if env is None else env
        files = []
        for path in (user_file(env), system_file(env)):
            table = _read(path)
            if table is not None:
                files.append((path, table))
        system = system_file(env)
        _check_system_file(env, system, any(path == system for path, _ in files))
        if files and files[0][0] == user_file(env):
            lifted = sorted(key for key in files[0][1] if BY_KEY[key].system_only)
            if lifted:
                raise ConfigError(
                    f"{files[0][0]}: {lifted[0]} can be set only in the system configuration "
                    f"({system_file(env)})",
                    hint="it limits what one user may do to the others; remove it from your file",
                )
        return cls(env, tuple(files), _variables(env))

    def resolve(self, key: str, flag: Any = None) -> Resolved:
        """The value of ``key``: ``flag`` when given, else the environment, the files, the
        default."""
        setting = BY_KEY[key]
        if flag is not None:
            return Resolved(key, flag, setting.flag or "command line")
        if key in self.variables:
            return Resolved(key, self.variables[key], str(setting.variable))
        for path, table in self.files:
            if key in table:
                return Resolved(key, table[key], str(path))
        return Resolved(key, setting.default, DEFAULT_SOURCE)

    def value(self, key: str, flag: Any = None) -> Any:
        return self.resolve(key, flag).value

    def system_value(self, key: str) -> Any:
        """``key`` as the system file alone sets it (else its default): a limit on what one
        user may do to the others, which no user's file or variable may change."""
        system = system_file(self.env)
        for path, table in self.files:
            if path == system and key in table:
                return table[key]
        return BY_KEY[key].default

    def considered(self) -> list[tuple[Path, bool]]:
        """The files looked at, highest precedence first, and whether each exists."""
        present = {path for path, _ in self.files}
        return [(p, p in present) for p in (user_file(self.env), system_file(self.env))]


def _variables(env: Mapping[str, str]) -> dict[str, Any]:
    """The settings the environment sets, each checked (see :attr:`Config.variables`)."""
    found: dict[str, Any] = {}
    if not env.get(TOPOLOGY_VARIABLE, "x").strip():
        raise _empty(TOPOLOGY_VARIABLE, "this host's GPUs")
    system_file(env)  # GPUALLOC_SYSTEM_CONFIG, read by load
    no_slurm(env)
    for setting in SETTINGS:
        raw = env.get(setting.variable) if setting.variable else None
        if raw is None:
            continue
        if not raw.strip():
            raise _empty(str(setting.variable), f"the configured value ({setting.about})")
        found[setting.key] = _parsed(setting, raw.strip(), str(setting.variable))
    return found


def _parsed(setting: Setting, raw: Any, where: str) -> Any:
    try:
        return setting.parse(raw)
    except ValueError as exc:
        raise ConfigError(
            f"{where} = {_shown(raw)}: {exc}",
            hint=getattr(exc, "hint", None)
            or f"fix it, or see 'gpualloc config show' ({setting.key}: {setting.about})",
        ) from None


def _known_like(unknown: str) -> str:
    """A hint for an unknown key: the keys it may be a typo of, else those of its table, else
    where every key is listed (the whole list, 30 keys, was cut short on a terminal)."""
    table, _, leaf = unknown.rpartition(".")
    close = sorted(
        (key for key in BY_KEY if _alike(leaf, key.rpartition(".")[2])),
        key=lambda key: key.rpartition(".")[0] != table,  # the same table's first
    )[:3]
    if close:
        return "did you mean " + " or ".join(f"'{key}'" for key in close) + "?"
    table = unknown.partition(".")[0] + "."
    same_table = [key for key in BY_KEY if key.startswith(table)]
    if "." in unknown and same_table:
        return f"the keys of [{table[:-1]}]: " + ", ".join(same_table)
    return "'gpualloc config show' lists every setting (docs/configuration.md says what each does)"


def _alike(typed: str, key: str) -> bool:
    import difflib

    return difflib.SequenceMatcher(None, typed, key).ratio() >= 0.75


def _shown(raw: Any) -> str:
    """A value a file or variable gave, for an error line, cut to a readable length."""
    from gpualloc.user_files import shown_text, shown_value

    return shown_value(raw) if isinstance(raw, str) else shown_text(repr(raw))


class _NoFile(ConfigError):
    """The configuration file does not exist: most hosts have none."""


def _read(path: Path) -> dict[str, Any] | None:
    """The file's settings, flattened (``queue.max_bypass``, ``share.max_jobs``); None when it
    does not exist."""
    from gpualloc.user_files import read_user_text, shown_path

    shown = shown_path(path)
    try:
        text = read_user_text(path, "configuration file", error=ConfigError, missing=_NoFile)
    except _NoFile:
        return None  # most hosts have no file: no TOML parser to import
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{shown} is not valid TOML: {exc}", hint="fix the file") from None
    except RecursionError:  # arrays or tables nested thousands deep
        raise ConfigError(f"{shown} is not valid TOML: nested too deep", hint="fix it") from None
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if key in TABLES and isinstance(value, dict):
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    unknown = sorted(set(flat) - set(BY_KEY))
    if unknown:
        raise ConfigError(
            f"{shown}: unknown setting {_shown(unknown[0])}", hint=_known_like(unknown[0])
        )
    # Every value is checked now, not when a command first needs it: a bad line in a file is
    # reported by whichever command runs next.
    return {key: _parsed(BY_KEY[key], value, f"{shown}: {key}") for key, value in flat.items()}
