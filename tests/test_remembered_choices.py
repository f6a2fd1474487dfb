"""A policy that reads the free GPUs alone makes one choice per free set, whoever holds the
others (the simulator's queue reuses such choices, scored again for the jobs at hand;
:func:`gpualloc.placement.choose.searched`)."""

from __future__ import annotations

import random

import pytest

from gpualloc.errors import GpusBusy, NoFeasiblePlacement
from gpualloc.ledger.occupancy import Occupancy
from gpualloc.ledger.schema import Lease, LeasedGpu
from gpualloc.model.request import JobRequest
from gpualloc.placement.choose import Choices, searched
from gpualloc.placement.mapa.patterns import build_pattern
from gpualloc.placement.policies.registry import get_policy, policy_names
from gpualloc.placement.want import Want
from gpualloc.topologies import load_bundled
from tests.leases import held_lease

HOSTS = ("dgx1-v100", "pcie-8gpu-2socket", "summit-node")


def _occupancy(topology, holders: list[tuple[int, ...]], sensitive: list[bool]) -> Occupancy:
    leases: dict[int, Lease] = {}
    for gpus, flag in zip(holders, sensitive, strict=True):
        lease = held_lease(gpus[0], gpus=tuple(LeasedGpu(index=g) for g in gpus), sensitive=flag)
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


FREE_ONLY = {"mapa", "mapa-greedy", "baseline", "besteffort", "slurm", "spread", "pack"}


def test_the_policies_that_say_so_read_only_the_free_gpus() -> None:
    free_only = {name for name in policy_names() if not get_policy(name).reads_running_jobs}
    assert free_only == FREE_ONLY


def _compare(host: str, policy: str) -> tuple[int, int]:
    """Remembered choices against fresh searches for ``policy`` on ``host``: the same free GPUs
    held by other jobs (other sizes, other sensitivities). How many were compared, and how many
    differed (scores and all)."""
    topology = load_bundled(host)
    rng = random.Random(f"{host}/{policy}")
    n = topology.gpu_count
    compared = differed = 0
    for _ in range(60):
        busy = rng.sample(range(n), rng.randint(1, n - 1))
        k = rng.randint(1, n - len(busy))
        pattern = build_pattern(rng.choice(["ring", "all", "tree"]), k)
        want = Want(request=JobRequest(k, pattern, rng.random() < 0.7), policy=policy)
        choices: Choices = {}
        for _ in range(4):
            holders = _split(rng, list(busy))
            sensitive = [rng.random() < 0.5 for _ in holders]
            occupancy = _occupancy(topology, holders, sensitive)
            try:
                fresh = searched(topology, occupancy, want)
            except (GpusBusy, NoFeasiblePlacement):
                continue
            remembered = searched(topology, occupancy, want, choices=choices)
            compared += 1
            differed += remembered != fresh
    return compared, differed


@pytest.mark.parametrize("host", HOSTS)
@pytest.mark.parametrize("policy", sorted(FREE_ONLY))
def test_a_remembered_choice_is_the_choice_made_afresh(host: str, policy: str) -> None:
    """For every policy that says it reads the free GPUs alone: a choice remembered by the free
    GPUs is what a fresh search gives whoever holds the others, scores and all."""
    compared, differed = _compare(host, policy)
    assert compared > 100
    assert differed == 0


@pytest.mark.parametrize("host", HOSTS)
def test_the_comparison_catches_a_policy_that_reads_the_running_jobs(
    monkeypatch: pytest.MonkeyPatch, host: str
) -> None:
    """The states above are strong enough to tell: DRB, whose interference term reads where the
    running jobs are, marked as reading the free GPUs alone, is caught on every host."""
    policy = type(get_policy("drb"))
    assert policy.reads_running_jobs
    monkeypatch.setattr(policy, "reads_running_jobs", False)
    compared, differed = _compare(host, "drb")
    assert differed > 0, (compared, differed)
