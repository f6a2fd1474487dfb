"""Placement rules are policies: the share placement rules and the MIG
creation rules are declared objects behind registries, as the whole-GPU policies are, and
placement reads the host through :class:`~gpualloc.model.occupancy_view.OccupancyView`, never
the ledger."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpualloc.config import BY_KEY, SHARE_PLACEMENT_NAMES, Config
from gpualloc.errors import ConfigError, GpusBusy, RequestError
from gpualloc.ledger.occupancy import Occupancy
from gpualloc.ledger.schema import Ledger
from gpualloc.model.occupancy_view import OccupancyView
from gpualloc.model.request import HostState, JobRequest, RunningJob
from gpualloc.model.share import LeasedShare, ShareRequest
from gpualloc.placement.choose import choose
from gpualloc.placement.mapa.patterns import build_pattern
from gpualloc.placement.mig.rules import MigRule, get_mig_rule, mig_rule_names, mig_rules
from gpualloc.placement.mig.slots import MigGpu, rank_slots
from gpualloc.placement.sharing.fit import choose_share
from gpualloc.placement.sharing.rules import (
    SharePolicy,
    get_share_policy,
    share_policies,
    share_policy_names,
)
from gpualloc.placement.want import Want
from gpualloc.topologies import load_bundled
from tests.import_graph import import_graph
from tests.leases import lease_on

H100 = ("NVIDIA H100 80GB HBM3", 80 * 1024**3)


# ---- the registries ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lookup", "names"),
    [(get_share_policy, share_policy_names()), (get_mig_rule, mig_rule_names())],
)
def test_an_unknown_rule_names_every_rule(lookup, names: list[str]) -> None:
    with pytest.raises(RequestError) as caught:
        lookup("random")
    error = caught.value
    assert "'random'" in error.message and f"not one of {', '.join(names)}" in error.message
    assert error.hint is None  # no name is close: the names are in the error
    assert [line.split(":")[0] for line in error.details] == names  # each with its description


def test_each_rule_is_one_declared_object_with_a_name_and_a_description() -> None:
    for rules, base in ((share_policies(), SharePolicy), (mig_rules(), MigRule)):
        assert len({rule.name for rule in rules}) == len(rules)
        for rule in rules:
            assert isinstance(rule, base)
            assert rule.description and "\n" not in rule.description
    assert [p.name for p in share_policies()] == ["fgd", "best-fit", "first-fit", "spread"]
    assert [r.name for r in mig_rules()] == ["fgd", "best-fit", "first-fit"]
    assert get_share_policy("spread").name == "spread" and get_mig_rule("fgd").weighs


def test_the_configuration_knows_the_share_rules_by_name() -> None:
    """The configuration is a leaf (it cannot import placement), so it keeps the names: they
    must be the registry's, the default first."""
    assert tuple(share_policy_names()) == SHARE_PLACEMENT_NAMES
    assert BY_KEY["share.placement"].default == share_policy_names()[0]


def _system_config(tmp_path: Path, text: str) -> Config:
    path = tmp_path / "system.toml"
    path.write_text(text)
    env = {
        "GPUALLOC_SYSTEM_CONFIG": str(path),
        "HOME": str(tmp_path),
        "XDG_CONFIG_HOME": str(tmp_path / "user"),
    }
    return Config.load(env)


@pytest.mark.parametrize("name", share_policy_names())
def test_each_share_rule_round_trips_through_the_configuration(tmp_path: Path, name: str) -> None:
    config = _system_config(tmp_path, f'[share]\nplacement = "{name}"\n')
    configured = config.system_value("share.placement")
    assert configured == name and get_share_policy(configured).name == name


def test_the_configuration_refuses_a_share_rule_the_registry_lacks(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        _system_config(tmp_path, '[share]\nplacement = "random"\n')
    assert all(name in caught.value.message for name in share_policy_names())


# ---- the rules are what the callers run -------------------------------------------------------


def test_choose_share_refuses_a_rule_that_is_not_registered() -> None:
    """Before the registry an unknown rule was silently best fit."""
    topology = load_bundled("dgx1-v100")
    occupancy = Occupancy.build(topology, Ledger(host="h"))
    with pytest.raises(RequestError, match="unknown share placement 'random'"):
        choose_share(topology, occupancy, ShareRequest(), 4, strategy="random")


def test_rank_slots_refuses_a_rule_that_is_not_registered() -> None:
    """Before the registry an unknown rule was silently fgd."""
    empty = [MigGpu(0, *H100, frozenset())]
    with pytest.raises(RequestError, match="unknown MIG creation rule 'random'"):
        rank_slots(empty, "3g.40gb", None, "random")
    for rule in mig_rules():
        ranked = rank_slots(empty, "1g.10gb", None, rule.name)
        assert ranked == rule.rank(ranked)
        assert any(s.growth for s in ranked) == rule.weighs


# ---- placement reads a view, not the ledger ---------------------------------------------------


@dataclass
class HandView:
    """A host written by hand, no ledger behind it: ``held`` GPUs held whole, ``shared`` GPUs
    with one shared job holding the given part, the others free."""

    gpu_count: int
    held: frozenset[int] = frozenset()
    shared: dict[int, float] = field(default_factory=dict)
    share_placement: str = "fgd"
    unusable: frozenset[int] = frozenset()
    unhealthy: dict[int, str] = field(default_factory=dict)
    outside: frozenset[int] = frozenset()
    mig: frozenset[int] = frozenset()
    memory_used: dict[int, int] = field(default_factory=dict)
    max_shared_jobs: int = 4
    share_mix: dict[tuple[int, float], float] | None = None
    share_mix_source: str = "a mix written by hand"
    mig_mix: dict[str, float] | None = None

    def state(self, gpu: int) -> str:
        return "held" if gpu in self.held else "shared" if gpu in self.shared else "free"

    @property
    def busy(self) -> frozenset[int]:
        return frozenset(g for g in range(self.gpu_count) if self.state(g) != "free")

    @property
    def free(self) -> frozenset[int]:
        return frozenset(range(self.gpu_count)) - self.busy

    def host_state(self) -> HostState:
        running = tuple(RunningJob(gpus=frozenset({g})) for g in sorted(self.busy))
        return HostState(free=self.free, running=running)

    def describe(self, gpus: Iterable[int]) -> list[str]:
        return [
            f"GPU {g} is {self.state(g)} (by hand)" for g in sorted(set(gpus)) if g in self.busy
        ]

    def shared_jobs(self, gpu: int) -> int:
        return 1 if gpu in self.shared else 0

    def shareable(self, gpu: int) -> bool:
        return False

    def shared_fraction(self, gpu: int) -> float:
        return self.shared.get(gpu, 0.0)

    def declared_memory(self, gpu: int) -> int:
        return 0

    def mig_taken(self) -> dict[tuple[int, int], str]:
        return {}


def test_the_ledgers_occupancy_and_a_hand_written_host_are_both_views() -> None:
    assert isinstance(Occupancy(gpu_count=8), OccupancyView)
    assert isinstance(HandView(8), OccupancyView)
    assert not isinstance(HandView(8), Occupancy)


def _one_gpu(**options) -> Want:
    return Want(JobRequest(1, build_pattern("ring", 1), sensitive=False), **options)


def test_choose_places_whole_gpus_on_a_view_that_is_not_an_occupancy() -> None:
    topology = load_bundled("dgx1-v100")
    two = Want(JobRequest(2, build_pattern("ring", 2), sensitive=False))
    view = HandView(8, held=frozenset(range(6)))
    assert set(choose(topology, view, two).gpus) == {6, 7}
    with pytest.raises(GpusBusy) as caught:
        choose(topology, HandView(8, held=frozenset(range(7))), two)
    assert "GPU 0 is held (by hand)" in caught.value.details
    assert choose(topology, view, _one_gpu(explicit=(7,))).gpus == (7,)


@pytest.mark.parametrize(
    ("rule", "gpu"), [("first-fit", 0), ("best-fit", 0), ("spread", 1), ("fgd", 1)]
)
def test_choose_shares_a_gpu_by_the_views_rule(rule: str, gpu: int) -> None:
    """GPU 0 has 40 % held by a shared job, GPU 1 10 %, the others are held whole; a 30 % job.
    Each rule is looked up by the name the view gives, and a ledger's occupancy of the same
    host gets the same answer."""
    topology = load_bundled("dgx1-v100")
    shared = {0: 0.4, 1: 0.1}
    view = HandView(8, held=frozenset(range(2, 8)), shared=shared, share_placement=rule)
    want = _one_gpu(share=ShareRequest(sm_percent=30))
    placement = choose(topology, view, want)
    assert placement.gpus == (gpu,) and placement.shared
    ledger = Ledger(host="h")
    ledger.leases += [
        lease_on(g, "a", share=LeasedShare(fraction=part, sm_percent=round(part * 100)))
        for g, part in shared.items()
    ]
    ledger.leases += [lease_on(g, "c") for g in range(2, 8)]
    occupancy = Occupancy.build(topology, ledger, share_placement=rule)
    by_ledger = choose(topology, occupancy, want)
    source = (occupancy.share_mix_source, view.share_mix_source)
    assert by_ledger.objective.replace(*source) == placement.objective


def test_an_unknown_rule_in_the_view_is_the_registrys_error() -> None:
    topology = load_bundled("dgx1-v100")
    view = HandView(8, share_placement="random")
    with pytest.raises(RequestError) as caught:
        choose(topology, view, _one_gpu(share=ShareRequest()))
    assert f"not one of {', '.join(share_policy_names())}" in caught.value.message


def test_placement_imports_no_ledger() -> None:
    """Placement gets a topology and a view of what is free (house style); the queue's record
    of a request (:meth:`Want.queued`) lives in the model. Type-hint imports count too."""
    graph = import_graph(type_checking=True)
    reaching = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if module.startswith("gpualloc.placement.")
        for target in targets
        if target.startswith("gpualloc.ledger")
    )
    assert not reaching, reaching
