"""The partition search behind ``besteffort`` returns go-gpuallocator's partition, exactly.

The reference is the literal enumeration of ``iterateGPUPartitions`` (every partition of the
padded slots, in its order, first strict maximum kept). Random integer weights with few distinct
values make ties common, so the tie-break by enumeration order is exercised, not just the
maximum.
"""

from __future__ import annotations

import random
from itertools import combinations

import pytest

from gpualloc.placement.besteffort import partition as partition_module
from gpualloc.placement.besteffort.best_groups import best_group_scores
from gpualloc.placement.besteffort.partition import PartitionSearch
from tests.go_gpuallocator import literal_best


def _random_weights(rng: random.Random, n: int, values: list[int]) -> list[list[int]]:
    weights = [[0] * n for _ in range(n)]
    for a, b in combinations(range(n), 2):
        weights[a][b] = weights[b][a] = rng.choice(values)
    return weights


def _cases(seed: int, count: int):
    rng = random.Random(seed)
    for _ in range(count):
        n = rng.randint(3, 12)
        # Up to 12 GPUs in 3 or 4 groups: enough depth for the transposition table to matter.
        k = rng.randint(3, 4) if n > 10 else rng.randint(2, n)
        values = rng.choice([[0, 1], [0, 1, 2], [10, 20, 40, 110], list(range(0, 300, 7))])
        weights = _random_weights(rng, n, values)
        required = frozenset()
        if rng.random() < 0.4:
            required = frozenset(rng.sample(range(n), rng.randint(1, min(k, 3))))
        yield weights, k, required


@pytest.mark.parametrize(
    "bound",
    # one bound in the fast loop
    ["share", pytest.param("pair", marks=pytest.mark.slow), "escalated"],
)
def test_partition_search_matches_the_literal_enumeration(bound, monkeypatch) -> None:
    """``escalated``: the search starts under the pair bound, and once it has memoised a few
    sets finds the exact shares and starts again (as on a 32-GPU host)."""
    if bound == "pair":
        monkeypatch.setattr(partition_module, "_MAX_SHARE_NODES", 0)
    if bound == "escalated":
        monkeypatch.setattr(partition_module, "_MAX_TABULATED_GROUPS", 0)
        monkeypatch.setattr(partition_module, "_ESCALATE_AFTER_SETS", 2)
    seed = {"share": 11, "pair": 12, "escalated": 13}[bound]
    for weights, k, required in _cases(seed=seed, count=150):
        expected = literal_best(weights, k, required)
        got = PartitionSearch(weights, k, required).best_partition()
        assert got == expected, (weights, k, sorted(required))


def test_each_gpus_best_group_is_the_best_of_every_group_holding_it() -> None:
    """The share bound's table (a depth-first walk that cuts what cannot raise a best) against
    scoring each group; weights with few values make many groups tie with the greedy seed."""
    rng = random.Random(5)
    for _ in range(400):
        n = rng.randint(1, 11)
        size = rng.randint(1, n)
        weights = _random_weights(rng, n, rng.choice([[0, 1], [10, 20, 40, 110], [0, 7, 300]]))
        expected = [-1] * n
        for group in combinations(range(n), size):
            value = sum(weights[a][b] for a, b in combinations(group, 2))
            for gpu in group:
                expected[gpu] = max(expected[gpu], value)
        assert best_group_scores(weights, size) == expected, (weights, size)


def test_fewer_gpus_than_a_group_make_one_padded_group() -> None:
    """No exact shares are sought for a group larger than the GPUs (the greedy seed
    finds no GPU to add, and must not raise)."""
    # Its only group holds padding, so no partition qualifies (go-gpuallocator keeps none).
    assert PartitionSearch([[0, 1], [1, 0]], 3, frozenset()).best_partition() == []


def test_groups_come_in_go_gpuallocators_order() -> None:
    """Padding slots sort after every GPU: (0, 1, pad, pad) comes after (0, 1, 2, 3)."""
    n, k = 6, 4  # two padding slots; the padded group holds two GPUs
    search = PartitionSearch([[0] * n for _ in range(n)], k, frozenset())
    got = list(search.groups_with_lowest((1 << n) - 1, padding_left=True))
    slots = list(range(n + 2))
    expected = []
    for rest in combinations(slots[1:], k - 1):
        pads = sum(1 for i in rest if i >= n)
        if pads in (0, 2):
            expected.append((1 + sum(1 << i for i in rest if i < n), pads == 2))
    assert got == expected


def test_a_required_gpu_is_never_split_from_the_others_or_padded() -> None:
    n, k = 7, 3
    weights = [[0 if a == b else 100 for b in range(n)] for a in range(n)]
    weights[0][6] = weights[6][0] = 0  # 0 and 6 are the worst pair, but both are required
    required = frozenset({0, 6})
    best = PartitionSearch(weights, k, required).best_partition()
    groups = [mask for mask, padded in best if not padded]
    assert any(mask & 0b1000001 == 0b1000001 for mask in groups)


def test_twins_under_one_switch_keep_the_enumerations_answer() -> None:
    """PCIe-like scores (the GPUs under one switch are twins, which a group takes lowest first)
    with now and then an NVLinked pair and required GPUs: the literal answer."""
    rng = random.Random(43)
    for _ in range(150):
        n = rng.randint(4, 10)
        k = rng.randint(2, min(5, n))
        block, socket = rng.choice([2, 3, 4]), rng.choice([4, 6, 8])
        weights = [
            [0 if a == b else 50 if a // block == b // block else 20 if a // socket == b // socket
             else 10 for b in range(n)]
            for a in range(n)
        ]  # fmt: skip
        if rng.random() < 0.3:
            a, b = rng.sample(range(n), 2)
            weights[a][b] = weights[b][a] = weights[a][b] + 100
        required = frozenset()
        if rng.random() < 0.3:
            required = frozenset(rng.sample(range(n), rng.randint(1, min(2, k))))
        expected = literal_best(weights, k, required)
        assert PartitionSearch(weights, k, required).best_partition() == expected
