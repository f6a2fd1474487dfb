"""Policy names to policy objects: the one list the CLI, the simulator and the tests share.

Policies are imported when first asked for, so that ``gpualloc run`` with the default policy
does not load the seven others (start-up is a feature: house style habit 9).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from gpualloc.config import BY_KEY, DEFAULT_POLICY
from gpualloc.errors import ConfigError

if TYPE_CHECKING:
    from gpualloc.config import Config
    from gpualloc.placement.policies.policy import Policy

__all__ = ["DEFAULT_POLICY", "all_policies", "configured_policy", "get_policy", "policy_names"]

_POLICY_CLASSES: dict[str, tuple[str, str]] = {
    "mapa": ("gpualloc.placement.policies.mapa", "MapaPolicy"),
    "mapa-greedy": ("gpualloc.placement.policies.mapa_greedy", "MapaGreedyPolicy"),
    "drb": ("gpualloc.placement.policies.drb", "DrbPolicy"),
    "pack": ("gpualloc.placement.policies.pack", "PackPolicy"),
    "spread": ("gpualloc.placement.policies.spread", "SpreadPolicy"),
    "besteffort": ("gpualloc.placement.policies.besteffort", "BestEffortPolicy"),
    "slurm": ("gpualloc.placement.policies.slurm_cons_tres", "SlurmPolicy"),
    "baseline": ("gpualloc.placement.policies.baseline", "BaselinePolicy"),
}
_loaded: dict[str, Policy] = {}


def policy_names() -> list[str]:
    return list(_POLICY_CLASSES)


def configured_policy(config: Config, flag: str | None = None) -> str:
    """The policy's name: ``flag`` when given, else the configured one, checked against the
    registry here, where policies are known (the configuration is a leaf and cannot know
    them). A bad name from a file or a variable is a configuration error naming where it came
    from (exit 15); a bad ``--policy`` a usage error."""
    resolved = config.resolve("policy", flag)
    if flag is None and resolved.value not in _POLICY_CLASSES:
        variable = BY_KEY["policy"].variable
        where = variable if resolved.source == variable else f"{resolved.source}: policy"
        from gpualloc.user_files import shown_value

        raise ConfigError(
            f"{where} = {shown_value(resolved.value)}: must be one of {', '.join(_POLICY_CLASSES)}",
            hint="fix it, or see 'gpualloc config show' (policy: placement policy)",
        )
    get_policy(resolved.value)
    return resolved.value


def get_policy(name: str) -> Policy:
    if name not in _POLICY_CLASSES:
        from gpualloc.model.option_values import unknown_choice

        raise unknown_choice("policy", name, _POLICY_CLASSES)
    if name not in _loaded:
        module, cls = _POLICY_CLASSES[name]
        policy = getattr(import_module(module), cls)()
        if policy.name != name:  # a registry typo would otherwise surface far away
            raise AssertionError(f"{module}.{cls} is named {policy.name!r}, not {name!r}")
        _loaded[name] = policy
    return _loaded[name]


def all_policies() -> list[Policy]:
    """Every registered policy, in the registry's order."""
    return [get_policy(name) for name in _POLICY_CLASSES]
