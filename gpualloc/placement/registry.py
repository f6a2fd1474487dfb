"""Policy names to policy objects: the one list the CLI, the simulator and the tests share."""

from __future__ import annotations

from gpualloc.errors import RequestError
from gpualloc.placement.baseline import BaselinePolicy
from gpualloc.placement.besteffort import BestEffortPolicy
from gpualloc.placement.drb import DrbPolicy
from gpualloc.placement.mapa import MapaPolicy
from gpualloc.placement.mapa_greedy import MapaGreedyPolicy
from gpualloc.placement.pack import PackPolicy
from gpualloc.placement.policy import Policy
from gpualloc.placement.slurm import SlurmPolicy
from gpualloc.placement.spread import SpreadPolicy

DEFAULT_POLICY = "mapa"

POLICIES: dict[str, Policy] = {
    policy.name: policy
    for policy in (
        MapaPolicy(),
        MapaGreedyPolicy(),
        DrbPolicy(),
        PackPolicy(),
        SpreadPolicy(),
        BestEffortPolicy(),
        SlurmPolicy(),
        BaselinePolicy(),
    )
}


def policy_names() -> list[str]:
    return list(POLICIES)


def get_policy(name: str) -> Policy:
    try:
        return POLICIES[name]
    except KeyError:
        raise RequestError(
            f"unknown policy {name!r}",
            hint=f"choose one of: {', '.join(POLICIES)}",
        ) from None
