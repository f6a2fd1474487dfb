"""MIG slices: NVIDIA's placement rules, which profiles a GPU's free slices
still hold, and where a new GPU instance fragments them least; checked against real
``mig -lgi`` layouts and the bundled MIG hosts."""

from __future__ import annotations

from pathlib import Path

import pytest
from msgspec.structs import replace

from gpualloc.discovery.mig_text import parse_gpu_instances
from gpualloc.errors import NoFeasiblePlacement
from gpualloc.ledger.stats import MIX_MIN_REQUESTS, LedgerStats
from gpualloc.model.mig import GIB, MigInstance, MigRequest
from gpualloc.model.mig_slices import free_starts, occupied_slices, shape_of, still_fit
from gpualloc.model.topology import Topology
from gpualloc.placement.mig.fit import MigDevicesBusy, choose_mig
from gpualloc.placement.mig.slots import creation_slots, fragment, free_slices
from gpualloc.topologies import load_bundled

FIXTURES = Path(__file__).parent / "fixtures"
A100_40 = ("NVIDIA A100-SXM4-40GB", 40 * GIB)
A100_80 = ("NVIDIA A100-SXM4-80GB", 80 * GIB)
H100 = ("NVIDIA H100 80GB HBM3", 80 * GIB)
H200 = ("NVIDIA H200", 141 * 10**9)
A30 = ("NVIDIA A30", 24 * GIB)


@pytest.mark.parametrize(
    ("gpu", "profile", "memory", "starts"),
    [
        (A100_40, "1g.5gb", 1, (0, 1, 2, 3, 4, 5, 6)),
        (A100_40, "1g.10gb", 2, (0, 2, 4, 6)),  # the double-memory 1g of a 40 GB A100
        (A100_40, "2g.10gb", 2, (0, 2, 4)),
        (A100_40, "3g.20gb", 4, (0, 4)),
        (A100_40, "4g.20gb", 4, (0,)),
        (A100_40, "7g.40gb", 8, (0,)),
        (H100, "1g.10gb", 1, (0, 1, 2, 3, 4, 5, 6)),  # on 80 GB, 1g.10gb is one slice
        (H100, "1g.20gb", 2, (0, 2, 4, 6)),
        (H100, "3g.40gb", 4, (0, 4)),
        (H200, "1g.18gb", 1, (0, 1, 2, 3, 4, 5, 6)),
        (H200, "1g.35gb", 2, (0, 2, 4, 6)),
        (A30, "2g.12gb", 2, (0, 2)),
        (A30, "4g.24gb", 4, (0,)),
    ],
)
def test_nvidia_placement_rules_by_profile(gpu, profile, memory, starts) -> None:
    shape = shape_of(profile, *gpu)
    assert shape is not None and (shape.memory, shape.starts) == (memory, starts)


def test_a_compute_instance_profile_or_an_unknown_size_has_no_gpu_instance_shape() -> None:
    assert shape_of("1c.3g.20gb", *A100_40) is None
    assert shape_of("5g.30gb", *A100_40) is None
    assert shape_of("1g.10gb", "NVIDIA A100 PCIe", None) is None  # 40 or 80 GB: 1 or 2 slices
    assert shape_of("1g.10gb", A100_40[0], None).memory == 2  # type: ignore[union-attr]  # 40GB


@pytest.mark.parametrize(
    ("gpu", "profile"),
    [
        (H100, "1g.5gb"),  # an A100 40GB's: nvidia-smi mig -cgi 1g.5gb fails on an H100
        (H100, "2g.10gb"),
        (H100, "7g.40gb"),
        (A30, "1g.5gb"),  # the A30's smallest is 1g.6gb
        (A30, "3g.12gb"),  # no 3g on a 4-slice GPU
        (A100_40, "1g.20gb"),
        (A100_80, "1g.5gb"),
        (H200, "1g.20gb"),
        (("NVIDIA H100 NVL", 95830 * 2**20), "1g.10gb"),  # the 94 GB H100: 1g.12gb
    ],
)
def test_a_profile_of_another_gpu_model_has_no_shape(gpu, profile) -> None:
    """NVIDIA's MIG User Guide, "Supported MIG Profiles": a profile names its model's memory.
    Before, 1g.5gb on an H100 read as one slice, and 'plan' told an administrator to create
    it there."""
    assert shape_of(profile, *gpu) is None


@pytest.mark.parametrize(
    ("gpu", "profiles"),
    [
        (A100_40, "1g.5gb 1g.10gb 2g.10gb 3g.20gb 4g.20gb 7g.40gb"),
        (A100_80, "1g.10gb 1g.20gb 2g.20gb 3g.40gb 4g.40gb 7g.80gb"),
        (H100, "1g.10gb 1g.20gb 2g.20gb 3g.40gb 4g.40gb 7g.80gb"),
        (("NVIDIA H100 NVL", 95830 * 2**20), "1g.12gb 1g.24gb 2g.24gb 3g.47gb 4g.47gb 7g.94gb"),
        (("NVIDIA GH200 480GB", 97871 * 2**20), "1g.12gb 1g.24gb 2g.24gb 3g.48gb 4g.48gb 7g.96gb"),
        (("NVIDIA H200", 143771 * 2**20), "1g.18gb 1g.35gb 2g.35gb 3g.71gb 4g.71gb 7g.141gb"),
        (A30, "1g.6gb 2g.12gb 4g.24gb"),
    ],
)
def test_each_gpu_model_has_its_own_profiles(gpu, profiles) -> None:
    from gpualloc.model.mig_profiles import mig_model
    from gpualloc.model.mig_slices import gpu_shapes, shape_by_size

    model = mig_model(*gpu)
    assert model is not None and " ".join(model.profiles) == profiles
    named = [shape_by_size(gpu[0], c, m, gpu[1]).profile for c, m in gpu_shapes(gpu[0])]
    assert " ".join(named) == profiles  # the free-slices table names them as NVIDIA does
    for profile in profiles.split():
        assert shape_of(profile, *gpu) is not None
        assert shape_of(f"{profile}+me", *gpu) is not None


def _instance(gpu: int, device: int, profile: str, start: int, size: int) -> MigInstance:
    return MigInstance(
        gpu=gpu, device=device, profile=profile, uuid=f"MIG-{gpu}-{device}",
        gpu_instance=device + 1, compute_instance=0, placement_start=start, placement_size=size,
    )  # fmt: skip


def _obeys_the_rules(instances: list[MigInstance], gpu: tuple[str, int]) -> bool:
    for instance in instances:
        shape = shape_of(instance.profile, *gpu)
        if shape is None or instance.placement_size != shape.memory:
            return False
        if instance.placement_start not in shape.starts:
            return False
    return True


def test_real_recorded_layouts_obey_the_rules() -> None:
    real = (FIXTURES / "measured" / "mig" / "a100_mig_lgi_mixed_dcgm138.txt").read_text()
    rows = parse_gpu_instances(real)
    layout = [_instance(r.gpu, r.gpu_instance, r.profile, r.start, r.size) for r in rows]
    assert _obeys_the_rules(layout, A100_80)  # 1g.10gb at 2 and 3, 2g.20gb at 0, 3g.40gb at 4
    lgi = (FIXTURES / "topologies" / "mig_lgi_a100-40gb_2x3g.20gb.txt").read_text()
    two = [
        _instance(r.gpu, r.gpu_instance, r.profile, r.start, r.size)
        for r in parse_gpu_instances(lgi)
    ]
    assert _obeys_the_rules(two, A100_40)
    assert not _obeys_the_rules([_instance(0, 0, "1g.10gb", 7, 1)], H100)  # 1g never at 7


@pytest.mark.parametrize("name", ["dgx-a100-mig", "hgx-h100-mig"])
def test_the_bundled_mig_hosts_obey_the_rules(name: str) -> None:
    topology = load_bundled(name)
    for gpu in {m.gpu for m in topology.mig_instances}:
        card = topology.gpu(gpu)
        assert _obeys_the_rules(topology.mig_on(gpu), (card.name or "", card.memory_total_bytes))


def test_free_slices_are_not_all_alike() -> None:
    two = shape_of("2g.20gb", *H100)
    one = shape_of("1g.10gb", *H100)
    assert two is not None and one is not None
    taken = frozenset({3, 4})
    assert free_starts(two, taken) == [0]  # 2-3 and 4-5 touch a taken slice
    assert fragment(taken, two, 8) == 4  # slices 2, 5, 6, 7: no 2g covers them
    assert fragment(taken, one, 8) == 1  # slice 7: a 1g never starts there
    assert still_fit([two, one], taken) == {"2g.20gb": 1, "1g.10gb": 5}
    assert (
        occupied_slices(
            [_instance(0, 0, "3g.40gb", 0, 4), MigInstance(gpu=0, device=1, profile="1g.10gb")]
        )
        is None
    )


def _h100_with(layout: dict[int, list[tuple[str, int, int]]]) -> Topology:
    """hgx-h100-mig with MIG on the GPUs of ``layout`` only, those instances on them."""
    base = load_bundled("hgx-h100-mig")
    gpus = [replace(g, mig_enabled=g.index in layout) for g in base.gpus]
    instances = [
        _instance(gpu, device, profile, start, size)
        for gpu, specs in layout.items()
        for device, (profile, start, size) in enumerate(specs)
    ]
    return replace(base, gpus=gpus, mig_instances=instances).validated()


def test_a_new_instance_goes_where_it_fragments_the_free_slices_least() -> None:
    # GPU0: 3g at 0-3, free 4-7. A 1g at 4 (the lowest start, what a driver picking the first
    # free place does) leaves 5-7: no 2g fits any more. At 6 it leaves 4-5 for a 2g.
    topology = _h100_with({0: [("3g.40gb", 0, 4)]})
    slots = creation_slots(topology, "1g.10gb")
    assert (slots[0].gpu, slots[0].slices) == (0, "6")
    assert sorted(s.start for s in slots) == [4, 5, 6] and slots[0].growth < slots[1].growth
    # With an empty GPU beside it, the split GPU is filled first (whole GPUs stay whole).
    both = _h100_with({0: [("3g.40gb", 0, 4)], 1: []})
    assert creation_slots(both, "1g.10gb")[0].gpu == 0
    # A mix of only 1g requests sees no fragment anywhere: then packing and the lowest start.
    assert creation_slots(topology, "1g.10gb", {"1g.10gb": 1.0})[0].start == 4
    three = creation_slots(topology, "3g.40gb")
    assert [(s.gpu, s.slices) for s in three] == [(0, "4-7")]


def test_a_busy_or_missing_profile_says_where_one_could_be_created() -> None:
    topology = _h100_with({0: [("3g.40gb", 0, 4)]})
    request = MigRequest(profile="3g.40gb")
    with pytest.raises(MigDevicesBusy) as busy:
        choose_mig(topology, request, {(0, 0): True})
    assert "create a 3g.40gb in GPU 0's free memory slices 4-7" in busy.value.hint
    assert "nvidia-smi mig -i 0 -cgi 3g.40gb -C" in busy.value.hint
    with pytest.raises(NoFeasiblePlacement) as missing:
        choose_mig(topology, MigRequest(profile="2g.20gb"), {})
    assert "create a 2g.20gb in GPU 0's free memory slices 4-5" in missing.value.hint
    full = load_bundled("dgx-a100-mig")  # every GPU in MIG mode has its slices taken
    with pytest.raises(MigDevicesBusy) as nowhere:
        choose_mig(full, MigRequest(profile="3g.20gb"), {(1, 0): True, (1, 1): True})
    assert "create" not in nowhere.value.hint


def test_a_profile_of_another_model_is_refused_naming_the_hosts() -> None:
    topology = _h100_with({0: [("3g.40gb", 0, 4)]})
    with pytest.raises(NoFeasiblePlacement) as refused:
        choose_mig(topology, MigRequest(profile="1g.5gb"), {})
    assert refused.value.message == (
        "no GPU here has MIG profile 1g.5gb (NVIDIA H100 80GB HBM3: 1g.10gb, 1g.20gb, 2g.20gb, "
        "3g.40gb, 4g.40gb, 7g.80gb)"
    )
    assert "-cgi" not in (refused.value.hint or "")
    assert "this host has 1 x 3g.40gb now" in (refused.value.hint or "")
    gpus = [replace(g, mig_enabled=False) for g in topology.gpus]  # no GPU in MIG mode yet
    off = replace(topology, gpus=gpus, mig_instances=[])
    with pytest.raises(NoFeasiblePlacement, match=r"no GPU here has MIG profile 1g\.5gb"):
        choose_mig(off, MigRequest(profile="1g.5gb"), {})


def test_on_an_all_mig_host_mem_names_a_profile_to_create_not_whole_gpus() -> None:
    empty = _h100_with({gpu: [] for gpu in range(8)})
    with pytest.raises(NoFeasiblePlacement) as refused:
        choose_mig(empty, MigRequest(memory_bytes=10 * GIB), {})
    assert "create a 1g.20gb (it holds 10 GiB or more)" in (refused.value.hint or "")
    assert "whole GPU" not in (refused.value.hint or "")
    with pytest.raises(NoFeasiblePlacement) as big:
        choose_mig(empty, MigRequest(memory_bytes=78 * GIB), {})
    assert "a whole GPU holds 78 GiB once an administrator turns its MIG mode off" in (
        big.value.hint or ""
    )
    split = _h100_with({0: [("7g.80gb", 0, 8)]})  # GPUs 1-7 whole: those can be asked for
    with pytest.raises(NoFeasiblePlacement) as partly:
        choose_mig(split, MigRequest(memory_bytes=90 * GIB), {})
    assert "ask for a whole GPU" in (partly.value.hint or "")


def test_topo_show_lists_free_slices_and_what_still_fits(cli, tmp_path: Path) -> None:
    topology = _h100_with({0: [("3g.40gb", 0, 4), ("1g.10gb", 5, 1)]})
    assert free_slices(topology, 0) == ([4, 6, 7], {"1g.10gb": 2, "1g.20gb": 1})
    path = tmp_path / "split.json"
    path.write_text(topology.to_json())
    shown = cli("--topology", str(path), "topo", "show")
    assert shown.exit_code == 0, shown.stderr
    assert "Free MIG slices" in shown.stdout
    row = next(line for line in shown.stdout.splitlines() if line.strip().startswith("GPU0  4"))
    assert "2 x 1g.10gb, 1 x 1g.20gb" in row


def test_the_ledger_counts_mig_requests_by_profile() -> None:
    stats = LedgerStats()
    for _ in range(MIX_MIN_REQUESTS + 3):
        stats.observe_mig("1g.10gb")
    stats.observe_request(1, 0.5)
    mig, weight = stats.recent_mig_mix()
    assert mig == {"1g.10gb": 1.0} and weight > MIX_MIN_REQUESTS
    assert stats.recent_mix()[0] is None  # one shared request: too few of those


def test_a_mig_lease_adds_its_profile_to_the_ledgers_mix() -> None:
    import os

    from gpualloc.host.lease_terms import LeaseTerms
    from gpualloc.host.local import LocalHost
    from tests.leases import want_of_options

    host = LocalHost.open(load_bundled("dgx-a100-mig"))
    host.allocate(want_of_options(mig="3g.20gb"), LeaseTerms(source="alloc", pid=os.getpid()))
    assert host.snapshot().ledger.stats.request_mix == {"mig:3g.20gb": 1.0}


def test_a_profile_no_key_can_hold_is_not_counted() -> None:
    stats = LedgerStats()
    stats.observe_mig("MIG 3g.20gb")  # a layout's odd name: left out rather than a bad ledger
    stats.observe_mig("3G.20GB")
    assert stats.request_mix == {"mig:3g.20gb": 1.0}


def test_fgd_puts_a_3g_where_a_4g_still_fits_and_first_fit_does_not() -> None:
    """The example docs/evaluation.md 6.3 gives: on an empty H100, a 3g at slice 0 (the lowest
    start) leaves no room for a 4g (which starts only at 0); at 4 it does."""
    from gpualloc.placement.mig.slots import MigGpu, rank_slots

    empty = [MigGpu(0, H100[0], H100[1], frozenset())]
    assert rank_slots(empty, "3g.40gb", None, "first-fit")[0].start == 0
    assert rank_slots(empty, "3g.40gb", None, "fgd")[0].start == 4
