"""Seeded workload generators: the MAPA paper's and the DRB paper's (``--generate SPEC``).

A SPEC is a generator name with optional ``key=value`` settings: ``mapa``,
``mapa:jobs=300,min_gpus=2,max_gpus=5``, ``drb:jobs=100,rate_per_min=10``. The same SPEC and
seed always give the same jobs.

``mapa`` follows MAPA's job generator (socal-ucr/jobGenerator, final version, as recorded in the
project's reference notes): GPU counts uniform over ``min_gpus..max_gpus`` (default 2..5),
service times uniform over ``min_service..max_service`` (default 5..24, seconds here), ring
jobs, the network uniform over six, of which AlexNet, Inception-v3, ResNet-50 and VGG16 are
bandwidth-sensitive and GoogLeNet and CaffeNet are not. MAPA's simulator queues every job at
time 0 (``arrival=zero``, the default); ``arrival=spread`` draws the generator's sorted uniform
arrival times in ``[0, 14.5 * jobs)`` instead. ``hold=1`` gives each sensitive job the original
simulator's hidden threshold as ``min_bandwidth`` (:data:`ABOVE_EMPTY_ALLOCATION`): it waits
rather than start on GPUs predicted at or below an empty allocation's bandwidth.

``drb`` follows the DRB paper's simulation (seed 000, section 5.3): Poisson arrivals with
``rate_per_min`` jobs per minute (default 10); the network from a Binomial(2, 1/2) over AlexNet,
CaffeRef, GoogLeNet; the batch size from a Binomial(3, 1/2) over tiny, small, medium, big
(1, 4, 64, 128); the GPU count 1 + Binomial(``max_gpus`` - 1, 1/2) (default up to 3, what the
measured profiles cover). Durations are the measured solo run times within one socket
(``drb_profile.json``; CaffeRef, which was not profiled, takes AlexNet's, its close relative).
Small batches (1, 4) communicate most and are sensitive (section 3); the minimum utility is
0.3 for one GPU and 0.5 for more (Table 1).

``mixed`` is what a lab's shared server sees: Poisson arrivals at the rate that keeps a
``host_gpus``-GPU host ``load`` busy on average (default 0.9 of 8 GPUs); sizes drawn with
weights ``w1``..``w8`` (default 40, 25, 5, 20, 0, 0, 0, 10 per cent: mostly small jobs, some
whole-host ones; an assumption, not a measured distribution); a share ``insensitive`` (default
0.3) of bandwidth-insensitive jobs (GoogLeNet, CaffeNet), the rest MAPA's four sensitive
networks; durations log-uniform over ``min_service``..``max_service`` (default 300..3600 s), the
time each job takes on the best GPUs of its size.

Every setting is a finite number within :data:`BOUNDS` (``jobs`` at least 1, ``host_gpus`` and
GPU counts at least 1, ``load`` within 0.001..1000, as ``--load``).
"""

from __future__ import annotations

import math
import random
from typing import Any

from gpualloc.errors import TraceError
from gpualloc.simulate.profile import DrbProfile
from gpualloc.simulate.trace import SimJob, shown
from gpualloc.simulate.window import MAX_LOAD, MIN_LOAD

MAPA_NETWORKS: dict[str, bool] = {
    "alexnet": True,
    "inception-v3": True,
    "resnet-50": True,
    "vgg16": True,
    "googlenet": False,
    "caffenet": False,
}
"""The six networks of MAPA's generator and whether each is bandwidth-sensitive."""

DRB_NETWORKS = ("bvlc_alexnet", "bvlc_reference_caffenet", "bvlc_googlenet")
DRB_BATCHES = (1, 4, 64, 128)


DEFAULTS: dict[str, dict[str, float]] = {
    "mapa": {
        "jobs": 300,
        "min_gpus": 2,
        "max_gpus": 5,
        "min_service": 5,
        "max_service": 24,
        "hold": 0,
    },
    "drb": {"jobs": 100, "rate_per_min": 10, "max_gpus": 3},
    "mixed": {
        "jobs": 300,
        "load": 0.9,
        "host_gpus": 8,
        "insensitive": 0.3,
        "min_service": 300,
        "max_service": 3600,
        **{f"w{size}": weight for size, weight in enumerate((40, 25, 5, 20, 0, 0, 0, 10), 1)},
    },
}
ABOVE_EMPTY_ALLOCATION = 12.33507
"""The original MAPA's hidden threshold (``mapa:hold=1``): its search for a sensitive job starts
from an empty allocation, predicted at 12.33506 GB/s (Table 2 at no edge), and keeps only a
strictly better one, so a job whose best placement predicts no more waits (and, FIFO, holds
the queue) until better GPUs are free (shared/reference/mapa_effbw_model.json, _meta)."""
FRACTIONS = {"rate_per_min", "load", "insensitive"}
"""Settings that need not be whole numbers."""
CHOICES: dict[str, dict[str, tuple[str, ...]]] = {"mapa": {"arrival": ("zero", "spread")}}
MAX_JOBS = 1_000_000
MAX_GPUS = 1024
BOUNDS: dict[str, tuple[float, float]] = {
    "jobs": (1, MAX_JOBS),
    "min_gpus": (1, MAX_GPUS),
    "max_gpus": (1, MAX_GPUS),
    "host_gpus": (1, MAX_GPUS),
    "load": (MIN_LOAD, MAX_LOAD),
    "rate_per_min": (0.001, 1e6),
    "hold": (0, 1),
    **{f"w{size}": (0, 1e6) for size in range(1, 9)},
}
"""Each setting's least and greatest value; the others (times in seconds) need only be finite
and not negative. A generator spec is typed by people: a thousand GPUs or a million jobs is a
slip, and the simulation would not end in a working day."""


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``name[:key=value,...]`` -> the generator name and its settings (defaults filled in)."""
    name, _, rest = spec.strip().partition(":")
    quoted = shown(spec)
    if name not in DEFAULTS:
        from gpualloc.model.option_values import unknown_choice

        raise unknown_choice("generator", name, DEFAULTS, error=TraceError)
    settings: dict[str, Any] = dict(DEFAULTS[name])
    settings.update({key: values[0] for key, values in CHOICES.get(name, {}).items()})
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, equals, value = item.partition("=")
        if not equals or key not in settings:
            known = ", ".join([*DEFAULTS[name], *CHOICES.get(name, {})])
            raise TraceError(
                f"--generate {quoted}: unknown setting {shown(item)}", hint=f"known: {known}"
            )
        if key in CHOICES.get(name, {}):
            if value not in CHOICES[name][key]:
                raise TraceError(
                    f"--generate {quoted}: {key} is one of {', '.join(CHOICES[name][key])}"
                )
            settings[key] = value
            continue
        try:
            number = float(value)
        except ValueError:
            raise TraceError(f"--generate {quoted}: {key}={shown(value)} is not a number") from None
        if not math.isfinite(number):
            raise TraceError(f"--generate {quoted}: {key}={shown(value)} is not a finite number")
        if number < 0 or (key not in FRACTIONS and not number.is_integer()):
            raise TraceError(f"--generate {quoted}: {key}={shown(value)} is not a count")
        low, high = BOUNDS.get(key, (0, math.inf))
        if not low <= number <= high:
            raise TraceError(
                f"--generate {quoted}: {key}={shown(value)} is not within {low:g}..{high:g}"
            )
        settings[key] = number
    return name, settings


def generate(spec: str, seed: int = 0) -> list[SimJob]:
    """The jobs ``spec`` describes, reproducibly for ``seed``."""
    name, settings = parse_spec(spec)
    rng = random.Random(seed)
    make = {"mapa": _mapa, "drb": _drb, "mixed": _mixed}[name]
    jobs = make(rng, settings)
    return sorted(jobs, key=lambda job: (job.arrival_s, job.order))


def _mapa(rng: random.Random, s: dict[str, Any]) -> list[SimJob]:
    count = int(s["jobs"])
    low, high = int(s["min_gpus"]), int(s["max_gpus"])
    if not 1 <= low <= high:
        raise TraceError("--generate mapa: need 1 <= min_gpus <= max_gpus")
    if not 0 < s["min_service"] <= s["max_service"]:
        raise TraceError("--generate mapa: need 0 < min_service <= max_service")
    arrivals = (
        sorted(rng.uniform(0, 14.5 * count) for _ in range(count))
        if s["arrival"] == "spread"
        else [0.0] * count
    )
    networks = list(MAPA_NETWORKS)
    hold = bool(s["hold"])
    jobs = []
    for i in range(count):
        network = rng.choice(networks)
        jobs.append(
            SimJob(
                id=f"job{i}",
                arrival_s=round(arrivals[i], 3),
                gpus=rng.randint(low, high),
                duration_s=float(rng.randint(int(s["min_service"]), int(s["max_service"]))),
                sensitive=MAPA_NETWORKS[network],
                workload=network,
                min_bandwidth=ABOVE_EMPTY_ALLOCATION if hold and MAPA_NETWORKS[network] else None,
                order=i,
            )
        )
    return jobs


def _drb(rng: random.Random, s: dict[str, Any]) -> list[SimJob]:
    profile = DrbProfile.bundled()
    count, rate = int(s["jobs"]), float(s["rate_per_min"])
    max_gpus = int(s["max_gpus"])
    if rate <= 0 or max_gpus < 1:
        raise TraceError("--generate drb: need rate_per_min > 0 and max_gpus >= 1")
    now = 0.0
    jobs = []
    for i in range(count):
        now += rng.expovariate(rate / 60.0)
        network = DRB_NETWORKS[_binomial(rng, 2)]
        batch = DRB_BATCHES[_binomial(rng, 3)]
        gpus = 1 + _binomial(rng, max_gpus - 1)
        jobs.append(
            SimJob(
                id=f"job{i}",
                arrival_s=round(now, 3),
                gpus=gpus,
                duration_s=round(profile.solo_s(network, batch, gpus), 3),
                sensitive=batch <= 4,
                workload=network,
                batch=batch,
                min_utility=0.3 if gpus == 1 else 0.5,
                order=i,
            )
        )
    return jobs


def _mixed(rng: random.Random, s: dict[str, Any]) -> list[SimJob]:
    weights = {size: s[f"w{size}"] for size in range(1, 9) if s[f"w{size}"] > 0}
    low, high = float(s["min_service"]), float(s["max_service"])
    if not weights:
        raise TraceError("--generate mixed: give some size a weight (w1=..w8=)")
    if not 0 < low <= high or s["load"] <= 0 or not 0 <= s["insensitive"] <= 1:
        raise TraceError(
            "--generate mixed: need 0 < min_service <= max_service, load > 0, 0 <= insensitive <= 1"
        )
    mean_gpus = sum(size * w for size, w in weights.items()) / sum(weights.values())
    mean_service = (high - low) / math.log(high / low) if high > low else low
    rate_per_s = s["load"] * s["host_gpus"] / (mean_gpus * mean_service)
    sensitive_networks = [n for n, sensitive in MAPA_NETWORKS.items() if sensitive]
    calm_networks = [n for n, sensitive in MAPA_NETWORKS.items() if not sensitive]
    sizes, size_weights = list(weights), list(weights.values())
    now, jobs = 0.0, []
    for i in range(int(s["jobs"])):
        now += rng.expovariate(rate_per_s)
        sensitive = rng.random() >= s["insensitive"]
        jobs.append(
            SimJob(
                id=f"job{i}",
                arrival_s=round(now, 3),
                gpus=rng.choices(sizes, size_weights)[0],
                duration_s=round(math.exp(rng.uniform(math.log(low), math.log(high))), 1),
                sensitive=sensitive,
                workload=rng.choice(sensitive_networks if sensitive else calm_networks),
                order=i,
            )
        )
    return jobs


def _binomial(rng: random.Random, trials: int) -> int:
    return sum(rng.random() < 0.5 for _ in range(trials))
