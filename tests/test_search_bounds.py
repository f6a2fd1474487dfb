"""Bounds of the placement search: parity on bipartite link groups, paths on degree-2 links."""

from __future__ import annotations

from itertools import product

import pytest

from gpualloc.model.request import CommunicationPattern, HostState, JobRequest
from gpualloc.placement.decide import decision_context
from gpualloc.placement.host_graph import HostGraph
from gpualloc.placement.mapa import search_bounds
from gpualloc.placement.mapa.pattern_graphs import (
    bipartition,
    component_sizes,
    fewest_monochromatic,
    forest_diameter,
)
from gpualloc.placement.mapa.patterns import build_pattern
from gpualloc.placement.policies.registry import get_policy
from gpualloc.topologies import load_bundled


def _brute_force(pattern: CommunicationPattern) -> list[int]:
    k = pattern.size
    fewest = [k + 1] * (k + 1)
    for colours in product((0, 1), repeat=k):
        mono = sum(colours[u] == colours[v] for u, v in pattern.edges)
        fewest[sum(colours)] = min(fewest[sum(colours)], mono)
    return fewest


@pytest.mark.parametrize("name", ["ring", "tree", "star"])
@pytest.mark.parametrize("k", range(2, 11))
def test_fewest_monochromatic_edges_match_brute_force(name: str, k: int) -> None:
    pattern = build_pattern(name, k)
    assert fewest_monochromatic(pattern) == _brute_force(pattern)


def test_fewest_monochromatic_of_a_forest_and_of_other_graphs() -> None:
    forest = CommunicationPattern("custom", 7, ((0, 1), (1, 2), (3, 4), (4, 5), (4, 6)))
    assert fewest_monochromatic(forest) == _brute_force(forest)
    assert fewest_monochromatic(build_pattern("all", 4)) is None  # not a tree or cycle
    theta = CommunicationPattern("custom", 4, ((0, 1), (1, 2), (2, 3), (3, 0), (0, 2)))
    assert fewest_monochromatic(theta) is None


def _nvlink_masks(host: HostGraph, *, least: int = 1) -> list[int]:
    n = host.gpu_count
    return [
        sum(1 << b for b in range(n) if b != a and host.nvlinks[a][b] >= least) for a in range(n)
    ]


def test_bipartite_link_graphs_are_found() -> None:
    torus = HostGraph.from_topology(load_bundled("torus-2d-16"))
    side = bipartition(range(16), _nvlink_masks(torus))
    assert side is not None and side.bit_count() == 8
    dgx = HostGraph.from_topology(load_bundled("dgx1-v100"))
    assert bipartition(range(8), _nvlink_masks(dgx)) is None  # 0-1-2 is a triangle
    assert bipartition(range(8), _nvlink_masks(dgx, least=2)) is not None  # NV2: 8-cycle


@pytest.mark.slow
@pytest.mark.parametrize(
    ("pattern", "k", "sensitive"), [("ring", 9, True), ("tree", 12, True), ("tree", 11, False)]
)
def test_the_bound_changes_no_answer(
    monkeypatch: pytest.MonkeyPatch, pattern: str, k: int, sensitive: bool
) -> None:
    topology = load_bundled("torus-2d-16")
    request = JobRequest(gpus=k, pattern=build_pattern(pattern, k), sensitive=sensitive)
    state = HostState.with_busy(16, frozenset({5}))

    def place() -> tuple:
        placement = get_policy("mapa").place(decision_context(topology, request, state))
        return placement.gpus, placement.scores

    with_bound = place()
    monkeypatch.setattr(search_bounds, "fewest_monochromatic", lambda pattern: None)
    assert place() == with_bound


def test_forest_diameters_and_component_sizes() -> None:
    assert forest_diameter(build_pattern("tree", 14)) == 6
    assert forest_diameter(build_pattern("tree", 16)) == 7  # rank 15 hangs one deeper
    assert forest_diameter(build_pattern("star", 5)) == 2
    assert forest_diameter(build_pattern("ring", 5)) is None
    torus = HostGraph.from_topology(load_bundled("torus-2d-16"))
    nv2 = _nvlink_masks(torus, least=2)
    assert sorted(component_sizes(range(16), nv2)) == [4, 4, 8]
    assert sorted(component_sizes([g for g in range(16) if g not in (6, 10)], nv2)) == [
        1, 1, 2, 2, 8,
    ]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(("policy", "busy"), [("pack", (6, 10)), ("mapa-greedy", (0, 9))])
def test_the_paths_bound_changes_no_answer(
    monkeypatch: pytest.MonkeyPatch, policy: str, busy: tuple[int, ...]
) -> None:
    topology = load_bundled("torus-2d-16")
    request = JobRequest(gpus=14, pattern=build_pattern("tree", 14), sensitive=False)
    state = HostState.with_busy(16, frozenset(busy))

    def place() -> tuple:
        placement = get_policy(policy).place(decision_context(topology, request, state))
        return placement.gpus, placement.scores

    with_bound = place()
    monkeypatch.setattr(search_bounds, "forest_diameter", lambda pattern: None)
    assert place() == with_bound
