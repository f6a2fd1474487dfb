"""Host symmetries and MAPA's tie-break over a few tied sets, which refutes better keys on one
set per orbit."""

from __future__ import annotations

import random
from itertools import islice

import pytest

from gpualloc.model.request import HostState, JobRequest
from gpualloc.placement.decide import decision_context
from gpualloc.placement.host_graph import HostGraph
from gpualloc.placement.mapa.exact import best_placement_among
from gpualloc.placement.mapa.objectives import AggregatedObjective
from gpualloc.placement.mapa.patterns import build_pattern
from gpualloc.placement.mapa.symmetry import host_symmetries, set_orbits
from gpualloc.placement.policies.mapa import LossSearch, _best_of_few_sets
from gpualloc.topologies import load_bundled


def _host(name: str) -> HostGraph:
    return HostGraph.from_topology(load_bundled(name))


@pytest.mark.parametrize(
    ("name", "count"), [("torus-2d-16", 4), ("cube-mesh-16", 1), ("dgx1-v100", 4), ("dgx2", 64)]
)
def test_symmetries_keep_every_link(name: str, count: int) -> None:
    """The torus and the DGX-1 have 4 (their link matrices' mirror images), the cube-mesh only
    the identity; on the NVSwitch host every permutation is one, and the search stops at 64."""
    host = _host(name)
    found = host_symmetries(host)
    assert len(found) == count == len(set(found))
    assert found[0] == tuple(range(host.gpu_count))
    n = host.gpu_count
    for sigma in found:
        assert sorted(sigma) == list(range(n))
        for a in range(n):
            for b in range(n):
                assert host.bandwidth[sigma[a]][sigma[b]] == host.bandwidth[a][b]
                assert host.mapa_class[sigma[a]][sigma[b]] == host.mapa_class[a][b]


def test_the_torus_sets_that_keep_an_nv2_pair_fall_into_five_orbits() -> None:
    host = _host("torus-2d-16")
    nv2_pairs = [(a, b) for a in range(16) for b in range(a + 1, 16) if host.nvlinks[a][b] == 2]
    sets = sorted(tuple(g for g in range(16) if g not in pair) for pair in nv2_pairs)
    orbits = set_orbits(sets, host_symmetries(host))
    assert len(orbits) == 5
    assert sorted(s for members in orbits for s in members) == sets
    for members in orbits:
        assert members[0] == min(members)  # the representative is the lowest set
    objective = AggregatedObjective()
    pattern = build_pattern("tree", 14)
    for members in orbits[:2]:  # symmetric sets have the same best key
        keys = {best_placement_among(host, pattern, objective, [m]).key for m in members}
        assert len(keys) == 1


@pytest.mark.slow
@pytest.mark.parametrize("name", ["torus-2d-16", "cube-mesh-16", "dgx1-v100"])
def test_the_few_sets_tie_break_equals_searching_them_together(name: str) -> None:
    """The lowest set alone, then one set per orbit above its key: the same (key, set, order)
    as one search over all the tied sets."""
    topology = load_bundled(name)
    n = topology.gpu_count
    rng = random.Random(name)
    checked = 0
    while checked < 5:
        k = rng.randint(4, min(n - 1, 11))
        busy = frozenset(rng.sample(range(n), rng.randint(0, n - k - 1)))
        request = JobRequest(k, build_pattern("tree", k), False)
        ctx = decision_context(topology, request, HostState.with_busy(n, busy))
        sets = list(islice(LossSearch(ctx).tied_sets(), 64))
        if len(sets) < 2:
            continue
        checked += 1
        together = best_placement_among(ctx.host, request.pattern, AggregatedObjective(), sets)
        got = _best_of_few_sets(ctx.host, request.pattern, sets)
        assert together is not None
        assert (got.key, got.order) == (together.key, together.order), (k, sorted(busy))


@pytest.mark.slow
@pytest.mark.parametrize("k", [11, 12])
def test_a_set_that_beats_the_lowest_is_found_through_its_orbit(k: int) -> None:
    """On the empty torus the lowest tied set is not the best for 11- and 12-rank trees: the
    winner is the lowest set of an orbit of several, which its representative stands for."""
    topology = load_bundled("torus-2d-16")
    request = JobRequest(k, build_pattern("tree", k), False)
    ctx = decision_context(topology, request, HostState.with_busy(16, frozenset()))
    sets = list(islice(LossSearch(ctx).tied_sets(), 64))
    together = best_placement_among(ctx.host, request.pattern, AggregatedObjective(), sets)
    lowest = best_placement_among(ctx.host, request.pattern, AggregatedObjective(), sets[:1])
    assert together is not None and lowest is not None and together.key > lowest.key
    winner = tuple(sorted(together.order))
    (orbit,) = [m for m in set_orbits(sets, host_symmetries(ctx.host)) if winner in m]
    assert len(orbit) > 1
    got = _best_of_few_sets(ctx.host, request.pattern, sets)
    assert (got.key, got.order) == (together.key, together.order)


@pytest.mark.slow
@pytest.mark.parametrize("busy", [(9,), (0,), (6,)])
def test_when_every_set_ties_the_search_over_the_pool_decides(busy: tuple[int, ...]) -> None:
    """14 of the torus's 15 free GPUs: all 15 sets tie on preserved bandwidth, so the tie-break
    is the aggregated search over the pool, which must agree with searching the sets."""
    from gpualloc.placement.policies.registry import get_policy

    topology = load_bundled("torus-2d-16")
    request = JobRequest(14, build_pattern("tree", 14), False)
    ctx = decision_context(topology, request, HostState.with_busy(16, frozenset(busy)))
    loss = LossSearch(ctx)
    sets = list(loss.tied_sets())
    assert len(sets) == loss.candidate_count() == 15
    expected = _best_of_few_sets(ctx.host, request.pattern, sets)
    assert get_policy("mapa").place(ctx).gpus == expected.order
