"""A policy that reads the free GPUs alone makes one choice per free set, whoever holds the
others (issue 43: the simulator's queue reuses such choices, scored again for the jobs at hand;
:func:`gpualloc.placement.choose.searched`)."""

from __future__ import annotations

import random

import pytest

from gpualloc.errors import GpusBusy, NoFeasiblePlacement
from gpualloc.ledger.occupancy import Occupancy
from gpualloc.ledger.schema import Lease, LeasedGpu
from gpualloc.model.request import JobRequest
from gpualloc.placement.choose import Choices, searched
from gpualloc.placement.patterns import build_pattern
from gpualloc.placement.registry import get_policy, policy_names
from gpualloc.placement.want import Want
from gpualloc.topologies import load_bundled
from tests.test_hostile_bytes import _lease

HOSTS = ("dgx1-v100", "pcie-8gpu-2socket", "summit-node")


def _occupancy(topology, holders: list[tuple[int, ...]], sensitive: list[bool]) -> Occupancy:
    leases: dict[int, Lease] = {}
    for gpus, flag in zip(holders, sensitive, strict=True):
        lease = _lease(gpus[0], gpus=tuple(LeasedGpu(index=g) for g in gpus), sensitive=flag)
        leases.update(dict.fromkeys(gpus, lease))
    return Occupancy(gpu_count=topology.gpu_count, leases=leases)


def _split(rng: random.Random, busy: list[int]) -> list[tuple[int, ...]]:
    """The busy GPUs held by jobs of random sizes."""
    rng.shuffle(busy)
    holders, i = [], 0
    while i < len(busy):
        size = rng.randint(1, len(busy) - i)
        holders.append(tuple(sorted(busy[i : i + size])))
        i += size
    return holders


def test_the_policies_that_say_so_read_only_the_free_gpus() -> None:
    free_only = {name for name in policy_names() if not get_policy(name).reads_running_jobs}
    assert free_only == {"mapa", "mapa-greedy", "baseline", "besteffort", "slurm", "spread"}


@pytest.mark.parametrize("host", HOSTS)
def test_a_remembered_choice_is_the_choice_made_afresh(host: str) -> None:
    """For every policy: the same free GPUs held by other jobs (other sizes, other
    sensitivities) give the placement a fresh search gives, scores and all."""
    topology = load_bundled(host)
    rng = random.Random(host)
    n = topology.gpu_count
    compared = 0
    for _ in range(60):
        busy = rng.sample(range(n), rng.randint(0, n - 1))
        k = rng.randint(1, n - len(busy))
        pattern = build_pattern(rng.choice(["ring", "all", "tree"]), k)
        request = JobRequest(k, pattern, rng.random() < 0.7)
        for policy in policy_names():
            want = Want(request=request, policy=policy)
            choices: Choices = {}
            for _ in range(3):
                holders = _split(rng, list(busy))
                sensitive = [rng.random() < 0.5 for _ in holders]
                occupancy = _occupancy(topology, holders, sensitive)
                try:
                    fresh = searched(topology, occupancy, want)
                except (GpusBusy, NoFeasiblePlacement):
                    continue
                assert searched(topology, occupancy, want, choices=choices) == fresh, policy
                compared += 1
    assert compared > 500
