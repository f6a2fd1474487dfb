"""Runtime models of the simulator: job times that depend on the GPUs a job got, grounded in
the papers' measurements (``gpualloc.simulate.runtime``, ``gpualloc.simulate.networks``)."""

from __future__ import annotations

import itertools

import pytest

from gpualloc.simulate import networks
from gpualloc.simulate.engine import SimOptions, simulate
from gpualloc.simulate.profile import DrbProfile
from gpualloc.simulate.runtime import AutoRuntime, BandwidthRuntime, Neighbour, ProfileRuntime
from gpualloc.simulate.trace import SimJob
from gpualloc.topologies import load_bundled


def _job(gpus: int, *, network: str | None = None, sensitive: bool = True, **more) -> SimJob:
    fields = {"id": "j", "arrival_s": 0.0, "duration_s": 100.0, **more}
    return SimJob(gpus=gpus, sensitive=sensitive, workload=network, **fields)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def dgx1():
    return load_bundled("dgx1-v100")


@pytest.fixture(scope="module")
def minsky():
    return load_bundled("minsky-p100")


def test_the_published_figures_come_back_on_the_machines_they_were_measured_on(
    dgx1, minsky
) -> None:
    """MAPA Fig. 2(b): VGG-16 3x slower on a PCIe pair than on a double-NVLink pair of the
    DGX-1 V100; a sensitive network 1.5x; the DRB profile's GoogLeNet across Minsky's sockets."""
    model = BandwidthRuntime(dgx1)
    nv2, sys = (0, 3), (0, 5)
    assert {dgx1.link(*nv2).kind, dgx1.link(*sys).kind} == {"NV2", "SYS"}
    vgg = _job(2, network="vgg16")
    assert model.solo_s(vgg, nv2) == pytest.approx(100.0)
    assert model.solo_s(vgg, sys) == pytest.approx(300.0)
    assert model.solo_s(_job(2, network="resnet-50"), sys) == pytest.approx(150.0)
    assert model.solo_s(_job(2), sys) == pytest.approx(150.0)  # sensitive, network unknown
    on_minsky = BandwidthRuntime(minsky)
    googlenet = _job(2, network="googlenet", sensitive=False)
    ratio = on_minsky.solo_s(googlenet, (0, 2)) / on_minsky.solo_s(googlenet, (0, 1))
    assert ratio == pytest.approx(150.265 / 146.135)


def test_a_single_nvlink_costs_less_than_pcie_and_one_gpu_costs_nothing(dgx1) -> None:
    model = BandwidthRuntime(dgx1)
    vgg = _job(2, network="vgg16")
    nv1 = model.solo_s(vgg, (0, 1))
    assert 100.0 < nv1 < model.solo_s(vgg, (0, 5))
    v = networks.VGG16.intensity_gb
    assert nv1 == pytest.approx(100.0 * (1 + v / 25.0) / (1 + v / 50.0))
    assert model.solo_s(_job(1, network="vgg16"), (5,)) == 100.0


def test_a_bigger_ring_moves_more_per_gpu(dgx1) -> None:
    """Ring all-reduce moves 2(k-1)/k of the gradients through each GPU: 1.5 times a pair's at
    k = 4, so the same slow link costs a 4-GPU job more."""
    assert networks.intensity_gb("vgg16", True, 4) == pytest.approx(
        1.5 * networks.intensity_gb("vgg16", True, 2)
    )
    assert networks.intensity_gb(None, False, 1) == 0.0


def _slowest_link_of_ring(topology, order) -> float:
    return min(
        topology.link(a, b).bandwidth_gbps
        for a, b in zip(order, order[1:] + order[:1], strict=True)
    )


def test_a_set_runs_at_its_best_ring_and_the_best_set_is_found(dgx1, minsky) -> None:
    """NCCL orders its ring itself, so a set runs at its best ring (checked against every
    order), and ``best_gbps`` (placement's own search) is the best set of the empty host."""
    for topology in (dgx1, minsky):
        model = BandwidthRuntime(topology)
        for k in range(2, min(6, topology.gpu_count) + 1):
            job, best = _job(k), 0.0
            for chosen in itertools.combinations(range(topology.gpu_count), k):
                brute = max(
                    _slowest_link_of_ring(topology, (chosen[0], *rest))
                    for rest in itertools.permutations(chosen[1:])
                )
                assert model.ring_gbps(job, chosen) == brute, (topology.name, chosen)
                best = max(best, brute)
            assert model.best_gbps(job) == best, (topology.name, k)


def test_the_ring_search_scales_to_sixteen_gpus() -> None:
    """Every GPU of a 16-GPU torus: a ring exists at the NVLink speed, none faster."""
    torus = load_bundled("torus-2d-16")
    ring = BandwidthRuntime(torus).ring_gbps(_job(16), tuple(range(16)))
    nvlink = sorted({link.bandwidth_gbps for link in torus.links if link.nvlinks})
    assert ring in nvlink


def test_measured_link_bandwidths_drive_the_model(dgx1) -> None:
    """A calibrated host's figures replace the estimates: a faster PCIe path costs less."""
    import msgspec

    links = [
        msgspec.structs.replace(link, bandwidth_gbps=20.0) if link.kind == "SYS" else link
        for link in dgx1.links
    ]
    faster = msgspec.structs.replace(dgx1, links=links)
    vgg = _job(2, network="vgg16")
    assert BandwidthRuntime(faster).solo_s(vgg, (0, 5)) < BandwidthRuntime(dgx1).solo_s(vgg, (0, 5))


def test_running_jobs_are_retimed_when_a_neighbour_comes_and_goes(minsky) -> None:
    """The DRB profile's co-location times (Eq. 4's data): AlexNet batch 1 runs 8.5% slower
    beside AlexNet batch 4 on its socket, from the moment that job starts to the moment it ends,
    and the neighbour's own pace changes the same way."""
    profile = DrbProfile.bundled()
    first = SimJob("first", 0.0, 1, 69.165, True, workload="bvlc_alexnet", batch=1)
    second = SimJob("second", 10.0, 1, 109.435, True, workload="bvlc_alexnet", batch=4)
    result = simulate(minsky, [first, second], SimOptions("baseline", runtime="profile")).jobs
    assert [r.gpus for r in result] == [(0,), (1,)]  # one socket
    slow_first = profile.slowdown("bvlc_alexnet", 1, 1, ("bvlc_alexnet", 4, 1))
    slow_second = profile.slowdown("bvlc_alexnet", 4, 1, ("bvlc_alexnet", 1, 1))
    assert slow_first > 1.08
    first_end = 10.0 + (69.165 - 10.0) * slow_first
    assert result[0].end_s == pytest.approx(first_end)
    done_beside = (first_end - 10.0) / (109.435 * slow_second)
    assert result[1].end_s == pytest.approx(first_end + (1 - done_beside) * 109.435)
    alone = simulate(minsky, [first], SimOptions("baseline", runtime="profile")).jobs[0]
    assert alone.end_s == pytest.approx(69.165)


def test_auto_measures_where_the_profile_covers_and_models_elsewhere(dgx1) -> None:
    model = AutoRuntime(dgx1, DrbProfile.bundled())
    profiled = _job(2, network="bvlc_alexnet", batch=1)
    assert model.solo_s(profiled, (0, 5)) == pytest.approx(159.115)  # measured, across sockets
    assert model.solo_s(profiled, (0, 3)) == pytest.approx(127.415)
    unprofiled = _job(2, network="bvlc_alexnet", batch=2)  # batch 2 was not measured
    assert model.solo_s(unprofiled, (0, 5)) == pytest.approx(150.0)
    beside = [Neighbour(unprofiled, (1, 2))]
    assert model.slowdown(profiled, (0, 3), beside) == 1.0  # nothing measured for the pair


def test_the_profile_model_refuses_jobs_it_has_no_figure_for(minsky) -> None:
    from gpualloc.errors import TraceError

    model = ProfileRuntime(minsky, DrbProfile.bundled())
    with pytest.raises(TraceError, match="no solo time"):
        model.solo_s(_job(2, network="bvlc_alexnet", batch=2), (0, 1))


def test_every_published_figure_names_its_source() -> None:
    for figure in {*networks.BY_NETWORK.values(), networks.SENSITIVE, networks.GOOGLENET}:
        assert "paper" in figure.source and figure.intensity_gb > 0
    with pytest.raises(ValueError):
        _ = networks.PublishedSensitivity(
            slowdown=10.0, fast_gbps=50.0, slow_gbps=7.88, source="x"
        ).intensity_gb


def test_any_collective_pattern_is_measured_against_the_best_ring(dgx1) -> None:
    """A tree or star job's collectives are NCCL's too: its best is the best ring's, so no set
    runs it faster than its trace duration."""
    model = BandwidthRuntime(dgx1)
    for pattern in ("tree", "star"):
        job = _job(4, pattern=pattern)
        assert model.best_gbps(job) == model.best_gbps(_job(4))
        for chosen in itertools.combinations(range(8), 4):
            assert model.solo_s(job, chosen) >= 100.0 - 1e-9


def test_network_names_are_read_in_their_usual_spellings() -> None:
    assert networks.sensitivity("VGG-16", True) is networks.VGG16
    assert networks.sensitivity("bvlc_googlenet", False) is networks.GOOGLENET
    assert networks.sensitivity("my-transformer", True) is networks.SENSITIVE
    assert networks.sensitivity(None, False) is networks.GOOGLENET
