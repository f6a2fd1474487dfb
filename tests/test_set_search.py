"""pack, DRB and spread choose the set that scoring every candidate set would.

pack and DRB search sets by branch and bound over twin classes
(:mod:`gpualloc.placement.sets.search`), spread by socket counts, DRB's t_min by the same branch
and bound: each must return the brute force's answer (the highest key, then the lowest set),
on the 16-GPU meshes where no GPUs are twins, on PCIe hosts where most are, with running jobs,
required and excluded GPUs.
"""

from __future__ import annotations

import random
import zlib
from itertools import combinations
from math import comb

import pytest

from gpualloc.model import Topology
from gpualloc.model.request import HostState, JobRequest, RunningJob
from gpualloc.placement.decide import decision_context
from gpualloc.placement.mapa.patterns import build_pattern
from gpualloc.placement.policies.drb import DrbPolicy
from gpualloc.placement.policies.pack import PackPolicy
from gpualloc.placement.policies.registry import get_policy
from gpualloc.placement.policies.spread import spread_set
from gpualloc.placement.sets.candidates import candidate_sets
from gpualloc.placement.sets.search import cheapest_communication, twin_classes
from gpualloc.topologies import load_bundled

MAX_SETS = 13_000
"""Brute force only where the candidate sets are this many or fewer."""


def pcie_32() -> Topology:
    return load_bundled("pcie-32gpu-2socket")


HOSTS = {
    "torus-2d-16": lambda: load_bundled("torus-2d-16"),
    "cube-mesh-16": lambda: load_bundled("cube-mesh-16"),
    "dgx2": lambda: load_bundled("dgx2"),
    "dgx1-v100": lambda: load_bundled("dgx1-v100"),
    "pcie-32": pcie_32,
}


def _contexts(topology: Topology, seed: int, count: int):
    """Random requests whose candidate sets brute force can score: busy GPUs held by one or two
    jobs (or none), sometimes required and excluded GPUs."""
    n = topology.gpu_count
    rng = random.Random(seed)
    made = 0
    while made < count:
        k = rng.randint(1, n)
        busy = rng.sample(range(n), rng.randint(0, n - k))
        halves = [part for part in (busy[: len(busy) // 2], busy[len(busy) // 2 :]) if part]
        running = rng.choice([(), tuple(RunningJob(frozenset(p)) for p in halves)])
        free = frozenset(range(n)) - frozenset(busy)
        spare = sorted(free)
        excluded = frozenset(rng.sample(spare, rng.randint(0, (len(spare) - k) // 2)))
        usable = sorted(free - excluded)
        required = frozenset(rng.sample(usable, rng.randint(0, min(2, k))))
        if comb(len(usable) - len(required), k - len(required)) > MAX_SETS:
            continue
        made += 1
        request = JobRequest(k, build_pattern("ring", k), rng.random() < 0.5, required, excluded)
        yield decision_context(topology, request, HostState(free=free, running=running))


def _brute(ctx, key) -> tuple[int, ...]:
    """The first candidate set of the highest ``key(ctx, set)``."""
    best = None
    for gpus in candidate_sets(ctx.pool, ctx.request.required, ctx.k):
        value = key(ctx, gpus)
        if best is None or value > best[0]:
            best = (value, gpus)
    assert best is not None
    return best[1]


@pytest.mark.parametrize("host_name", sorted(HOSTS))
def test_pack_drb_and_spread_choose_the_brute_force_set(host_name: str) -> None:
    topology = HOSTS[host_name]()
    pack, drb, spread = PackPolicy(), DrbPolicy(), get_policy("spread")
    for ctx in _contexts(topology, zlib.crc32(host_name.encode()), 25):
        why = (ctx.k, sorted(ctx.pool), sorted(ctx.request.required), len(ctx.state.running))
        assert pack.choose_set(ctx) == _brute(ctx, pack.set_key), why
        assert drb.choose_set(ctx) == _brute(ctx, _drb_key), why
        assert spread_set(ctx) == _brute(ctx, spread.set_key), why


def _drb_key(ctx, gpus):
    return ctx.utility_model.set_key(gpus)


def test_drb_keys_sets_as_its_scan_did() -> None:
    """UtilityModel.set_key is the key best_set ranks by (its prefix memo's arithmetic)."""
    topology = load_bundled("cube-mesh-16")
    for ctx in _contexts(topology, 5, 10):
        model = ctx.utility_model
        sets = list(candidate_sets(ctx.pool, ctx.request.required, ctx.k))
        assert model.best_set(sets) == _brute(ctx, _drb_key)


def test_t_min_is_the_cheapest_set_of_the_host() -> None:
    for topology in (load_bundled("torus-2d-16"), pcie_32()):
        request = JobRequest(1, build_pattern("ring", 1), True)
        distance = decision_context(topology, request).utility_model.distance
        n = len(distance)
        for k in (2, 3, 4, n - 3, n - 2, n - 1):
            if comb(n, k) > 40_000:
                continue
            brute = min(
                sum(distance[a][b] for a, b in combinations(s, 2))
                for s in combinations(range(n), k)
            )
            assert cheapest_communication(distance, k) == pytest.approx(brute), k


def test_the_gpus_under_one_pcie_switch_are_twins() -> None:
    ctx = decision_context(pcie_32(), JobRequest(1, build_pattern("ring", 1), True))
    model = ctx.utility_model
    labels = tuple(zip(model.socket_bits, model.switch_bits, strict=True))
    assert twin_classes(model.distance, labels) == tuple(4 * (g // 4) for g in range(32))
    request = JobRequest(1, build_pattern("ring", 1), True)
    model = decision_context(load_bundled("torus-2d-16"), request).utility_model
    labels = tuple(zip(model.socket_bits, model.switch_bits, strict=True))
    assert twin_classes(model.distance, labels) == tuple(range(16)), "a torus has no twins"
