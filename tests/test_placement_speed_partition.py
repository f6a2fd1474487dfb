"""The smallest-cut split of the last two groups (:mod:`gpualloc.placement.besteffort.two_groups`)
keeps go-gpuallocator's partition: compared with the literal enumeration on mesh-like scores (a
constant PCIe score plus 100 per NVLink, the shape on which the split's bound matters), PCIe
twins, required GPUs and padding, where two or three groups are left."""

from __future__ import annotations

import random
from itertools import combinations

import pytest

from gpualloc.placement.besteffort.partition import PartitionSearch
from tests.go_gpuallocator import literal_best


def _mesh_weights(rng: random.Random, n: int) -> list[list[int]]:
    base = rng.choice([0, 10, 30])
    weights = [[0] * n for _ in range(n)]
    for a, b in combinations(range(n), 2):
        links = rng.choice([0, 0, 0, 1, 2])
        weights[a][b] = weights[b][a] = base + 100 * links
    return weights


def _twin_weights(rng: random.Random, n: int) -> list[list[int]]:
    block = rng.choice([2, 3, 4])
    return [
        [0 if a == b else 50 if a // block == b // block else 20 for b in range(n)]
        for a in range(n)
    ]


def _required(rng: random.Random, n: int, k: int) -> frozenset[int]:
    if rng.random() < 0.35:
        return frozenset(rng.sample(range(n), rng.randint(1, min(k, 3))))
    return frozenset()


def _from_the_start(rng: random.Random) -> tuple[int, int]:
    """n and k such that two groups (with the padding) make the whole partition."""
    n = rng.randint(3, 12)
    return n, rng.randint((n + 1) // 2, n - 1) if n > 3 else 2


def _after_the_first(rng: random.Random) -> tuple[int, int]:
    """n and k such that a first group is chosen, and then two are left."""
    n = rng.randint(7, 12)
    return n, rng.randint(max(3, (n + 2) // 3), (n - 1) // 2)


@pytest.mark.parametrize(
    ("draw", "seed", "cases"),
    [(_from_the_start, 4302, 150), (_after_the_first, 4303, 80)],
    ids=["two-groups-from-the-start", "two-groups-after-the-first"],
)
def test_the_last_two_groups_keep_the_literal_partition(draw, seed: int, cases: int) -> None:
    rng = random.Random(seed)
    for _ in range(cases):
        n, k = draw(rng)
        weights = (_mesh_weights if rng.random() < 0.7 else _twin_weights)(rng, n)
        required = _required(rng, n, k)
        expected = literal_best(weights, k, required)
        got = PartitionSearch(weights, k, required).best_partition()
        assert got == expected, (weights, k, sorted(required))
