"""How much a network's training time depends on the bandwidth between its GPUs: published
measurements, turned into one number per network, its *communication intensity*.

The model (the "alpha-beta" cost of data-parallel training, compute plus ring all-reduce): one
iteration on GPUs whose ring runs at ``B`` GB/s takes ``t_c * (1 + v / B)``, where ``t_c`` is
the compute time and ``v`` (GB) the data each GPU moves per iteration per second of compute. A
ring all-reduce over ``k`` GPUs moves ``2 (k - 1) / k`` times the gradient size through each
GPU (NCCL's performance notes, "busBw"), so ``v`` measured on 2 GPUs becomes
``v * 2 (k - 1) / k`` on ``k`` (1 at ``k = 2``, 1.5 at 4, 1.75 at 8).

One published ratio fixes ``v``: if a job takes ``s`` times longer on a pair at ``slow`` GB/s
than on a pair at ``fast`` GB/s, then ``(1 + v/slow) = s (1 + v/fast)``, so
``v = (s - 1) / (1/slow - s/fast)``. Each entry below keeps the figure, the two pairs'
bandwidths and where the figure comes from.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from msgspec import Struct

from gpualloc.errors import TraceError

if TYPE_CHECKING:
    from gpualloc.simulate.profile import DrbProfile
    from gpualloc.simulate.trace import SimJob

DGX1_V100_NV2_GBPS = 50.0
"""GPUs 1 and 5 of the MAPA paper's DGX-1 V100 (two NVLink 2 links; ``dgx1-v100``)."""
DGX1_V100_SYS_GBPS = 7.88
"""GPUs 1 and 6 of the same DGX-1: PCIe 3.0 x16 through the CPUs (``dgx1-v100``)."""
MINSKY_NV_GBPS = 40.0
"""Two P100 of one socket of the DRB paper's Minsky (two NVLink 1 links; ``minsky-p100``)."""
MINSKY_SYS_GBPS = 7.88
"""Two P100 on different sockets of the Minsky (PCIe 3.0 x16 through the CPUs)."""


class PublishedSensitivity(Struct, frozen=True, kw_only=True):
    """A job took ``slowdown`` times longer on a pair at ``slow_gbps`` than at ``fast_gbps``."""

    slowdown: float
    fast_gbps: float
    slow_gbps: float
    source: str

    @property
    def intensity_gb(self) -> float:
        """``v`` of the model above (GB per second of compute, on 2 GPUs)."""
        denominator = 1 / self.slow_gbps - self.slowdown / self.fast_gbps
        if self.slowdown < 1 or denominator <= 0:
            raise ValueError(f"no intensity explains a slowdown of {self.slowdown}")
        return (self.slowdown - 1) / denominator


_MAPA_FIG_2B = (
    "MAPA paper (seed 003) section 2.1, Fig. 2(b): Caffe on 2 GPUs of a DGX-1 V100, GPUs 1,5 "
    "(double NVLink) against 1,6 (PCIe)"
)
VGG16 = PublishedSensitivity(
    slowdown=3.0,
    fast_gbps=DGX1_V100_NV2_GBPS,
    slow_gbps=DGX1_V100_SYS_GBPS,
    source=f"{_MAPA_FIG_2B}: VGG-16 'up to 3x'",
)
SENSITIVE = PublishedSensitivity(
    slowdown=1.5,
    fast_gbps=DGX1_V100_NV2_GBPS,
    slow_gbps=DGX1_V100_SYS_GBPS,
    source=f"{_MAPA_FIG_2B}; section 2.3: a sensitive network on a fragmented allocation "
    "'may slow down ... by more than 50%' (a lower bound, used for AlexNet, Inception-v3, "
    "ResNet-50 and any sensitive job of unknown network)",
)
GOOGLENET = PublishedSensitivity(
    slowdown=150.265 / 146.135,
    fast_gbps=MINSKY_NV_GBPS,
    slow_gbps=MINSKY_SYS_GBPS,
    source="DRB paper (seed 000) measured profile (drb_profile.json): GoogLeNet, batch 1, 2 "
    "GPUs, 146.1 s within a socket, 150.3 s across (used for GoogLeNet, CaffeNet, which MAPA "
    "section 2.3 classes with it, and any insensitive job of unknown network)",
)

BY_NETWORK: dict[str, PublishedSensitivity] = {
    "vgg16": VGG16,
    "alexnet": SENSITIVE,
    "inception-v3": SENSITIVE,
    "resnet-50": SENSITIVE,
    "googlenet": GOOGLENET,
    "caffenet": GOOGLENET,
}
"""The six networks of the MAPA paper's workload (:data:`~gpualloc.simulate.generate.
MAPA_NETWORKS`)."""
ALIASES = {
    "vgg-16": "vgg16",
    "inception": "inception-v3",
    "inception_v3": "inception-v3",
    "resnet50": "resnet-50",
    "resnet_50": "resnet-50",
    "bvlc_alexnet": "alexnet",
    "bvlc_googlenet": "googlenet",
    "bvlc_reference_caffenet": "caffenet",
}
"""Other spellings, including the DRB paper's Caffe model names."""


def sensitivity(network: str | None, sensitive: bool) -> PublishedSensitivity:
    """The published figure behind a job: its network's, else its class's."""
    name = (network or "").lower()
    name = ALIASES.get(name, name)
    if name in BY_NETWORK:
        return BY_NETWORK[name]
    return SENSITIVE if sensitive else GOOGLENET


def intensity_gb(network: str | None, sensitive: bool, gpus: int) -> float:
    """``v`` for a job of ``gpus`` GPUs (0 for one GPU: nothing to communicate)."""
    if gpus < 2:
        return 0.0
    return sensitivity(network, sensitive).intensity_gb * 2 * (gpus - 1) / gpus


def known_workload(name: str, profile: DrbProfile) -> bool:
    """Whether a trace's ``workload`` names something a runtime model looks up: one of the
    networks above (any spelling of :data:`ALIASES`, any case), or a network of ``profile``."""
    lowered = name.lower()
    return lowered in BY_NETWORK or lowered in ALIASES or profile.knows(name)


def check_workloads(jobs: Iterable[SimJob], profile: DrbProfile, source: str) -> None:
    """Refuse the first job whose ``workload`` no model knows (it would be read, silently, as an
    unknown network of its class)."""
    from gpualloc.model.printable import printable
    from gpualloc.simulate.trace import shown

    for job in jobs:
        if job.workload is not None and not known_workload(job.workload, profile):
            names = dict.fromkeys([*BY_NETWORK, *sorted(profile.networks())])
            raise TraceError(
                f"{source}: job {shown(job.id)} names an unknown workload {shown(job.workload)}",
                hint=f"known: {printable(', '.join(names), 160)}; or leave workload empty",
            )
