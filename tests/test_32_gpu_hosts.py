"""The bundled 32-GPU hosts: their layout, and every policy's exact optimum
where brute force can check it (small jobs, or pools of a few free GPUs)."""

from __future__ import annotations

import random
import zlib

import pytest

from gpualloc.model import PciePath
from gpualloc.model.request import HostState, JobRequest
from gpualloc.placement.decide import decision_context
from gpualloc.placement.mapa.patterns import build_pattern
from gpualloc.placement.policies.registry import get_policy
from gpualloc.topologies import load_bundled
from scripts.build_bundled_topologies import MAPA_TORUS_2D, mapa_torus_edges
from tests.brute_force import PATTERNS, contexts, optimum

HOSTS = ["pcie-32gpu-2socket", "torus-2d-32"]


def test_the_32_gpu_torus_is_mapas_torus_construction() -> None:
    """On 4 x 4 the construction gives MAPA's torus-2d (with the edge 1-5 its reference omits);
    on 4 x 8 every GPU has five or six NVLinks, as a V100 may."""
    mapa = {(min(a, b), max(a, b), kind) for a, b, kind in MAPA_TORUS_2D} | {(1, 5, "NV1")}
    assert set(mapa_torus_edges(4, 4)) == mapa
    topology = load_bundled("torus-2d-32")
    links = [0] * 32
    for link in topology.links:
        links[link.a] += link.nvlinks
        links[link.b] += link.nvlinks
    assert set(links) == {5, 6}


def test_the_32_gpu_pcie_host_has_four_gpus_a_switch_and_two_sockets() -> None:
    topology = load_bundled("pcie-32gpu-2socket")
    for link in topology.links:
        a, b = link.a, link.b
        expected = (
            PciePath.PIX if a // 4 == b // 4 else PciePath.NODE if a // 16 == b // 16
            else PciePath.SYS
        )  # fmt: skip
        assert link.pcie == expected and not link.nvlinks, (a, b)


@pytest.mark.parametrize("host_name", HOSTS)
@pytest.mark.parametrize("policy_name", ["mapa", "mapa-greedy", "drb", "pack", "spread"])
def test_small_jobs_on_32_gpu_hosts_are_optimal(host_name: str, policy_name: str) -> None:
    policy = get_policy(policy_name)
    for ctx in contexts(host_name, seed=zlib.crc32(host_name.encode()), max_k=3):
        assert policy.place(ctx).gpus == tuple(optimum(ctx, policy_name)), (
            ctx.k, ctx.request.pattern.name, sorted(ctx.state.free)
        )  # fmt: skip


@pytest.mark.parametrize("host_name", HOSTS)
@pytest.mark.parametrize("policy_name", ["mapa", "mapa-greedy", "drb", "pack", "spread"])
def test_large_jobs_on_a_few_free_gpus_of_32_gpu_hosts(host_name: str, policy_name: str) -> None:
    """Jobs of 5 to 7 GPUs on 7 free GPUs: brute force over every set and order."""
    topology = load_bundled(host_name)
    policy = get_policy(policy_name)
    rng = random.Random(zlib.crc32(f"{host_name}/{policy_name}".encode()))
    for _ in range(2):
        free = frozenset(rng.sample(range(32), 7))
        for k in (5, 7):
            pattern = rng.choice(PATTERNS)
            sensitive = rng.random() < 0.5
            if policy_name == "mapa" and not sensitive and k > 5:
                continue  # the brute force of the tie-break costs k! per set
            request = JobRequest(k, build_pattern(pattern, k), sensitive)
            state = HostState.with_busy(32, frozenset(range(32)) - free)
            ctx = decision_context(topology, request, state)
            assert policy.place(ctx).gpus == tuple(optimum(ctx, policy_name)), (
                k, pattern, sorted(free)
            )  # fmt: skip
