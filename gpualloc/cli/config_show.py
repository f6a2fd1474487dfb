"""``gpualloc config show``: every configurable default, its effective value, and its source."""

from __future__ import annotations

from typing import Any

from gpualloc.cli.declare import Command, Group, json_flag
from gpualloc.cli.state import STATE


def _shown(value: Any) -> Any:
    """A value as JSON and people read it (paths as strings, inline tables as they are)."""
    if value is None or isinstance(value, (bool, int, float, str, dict)):
        return value
    if isinstance(value, tuple):
        return list(value)
    return str(value)


def _toml(value: Any) -> str:
    """A value as config.toml would write it, for the table (``false``, not Python's
    ``False``; an inline table as ``{ key = value }``, not a dict's repr)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        inner = ", ".join(f"{key} = {_toml(item)}" for key, item in value.items())
        return f"{{ {inner} }}" if inner else "{}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    return str(value)


def _duration(seconds: float) -> str:
    """A duration as the config file would write it (``900.0`` read as a count);
    0 turns the thing it times off."""
    from gpualloc.durations import format_duration

    return "off" if seconds == 0 else format_duration(seconds)


def show_command(as_json: bool) -> None:
    """Print every setting: its effective value and where it came from (a GPUALLOC_* variable,
    the user's or the system's config.toml, or the default).

    Precedence: flag > environment > user file > system file > default. The files are TOML
    (policy = "drb", numa = "bind", ignore_foreign = false, state_dir = "...",
    bandwidth_table = "file.json" or a [bandwidth_table] table, and in a [queue] table
    priority and max_bypass, and, in the system file only, privileged, max_waiting and
    backfill_window; in a [share] table, system file only, max_jobs); an unknown key or a bad
    value is an error (exit 15).
    """
    from gpualloc.cli.output import Table, print_json, print_tables
    from gpualloc.config import SETTINGS
    from gpualloc.placement.policies.registry import configured_policy

    config = STATE.config()
    configured_policy(config)  # values whose meaning the configuration cannot check:
    STATE.bandwidth_override()  # the policy's name, and the bandwidth table's file or fields
    resolved = [config.resolve(setting.key) for setting in SETTINGS]
    files = config.considered()
    if as_json:
        print_json(
            {
                "settings": [
                    {
                        "key": r.key,
                        "value": _shown(r.value),
                        "source": r.source,
                        "variable": s.variable,
                        "flag": s.flag,
                        "default": _shown(s.default),
                    }
                    for r, s in zip(resolved, SETTINGS, strict=True)
                ],
                "files": [{"path": str(path), "exists": exists} for path, exists in files],
            }
        )
        return
    rows = []
    for r, s in zip(resolved, SETTINGS, strict=True):
        value = "-" if r.value is None else _toml(_shown(r.value))
        if s.is_duration and isinstance(r.value, float):
            value = _duration(r.value)
        rows.append([r.key, value, r.source, s.variable or "(system file only)", s.flag or "-"])
    footer = [
        f"{'user' if i == 0 else 'system'} file: {path}" + ("" if exists else " (absent)")
        for i, (path, exists) in enumerate(files)
    ]
    footer.append("precedence: flag > environment > user file > system file > default")
    print_tables(
        [Table("Settings", ["Key", "Value", "From", "Variable", "Flag"], rows)], footer=footer
    )


CONFIG = Group(
    "config",
    "Configuration: defaults from /etc/gpualloc/config.toml and "
    "$XDG_CONFIG_HOME/gpualloc/config.toml, overridden by GPUALLOC_* variables and flags.",
    (
        Command(
            "show",
            show_command,
            (json_flag(),),
            summary="Every setting, its value and where it came from.",
        ),
    ),
)
