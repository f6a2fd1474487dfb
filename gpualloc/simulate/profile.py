"""Measured job profiles (the DRB paper's): solo run times within and across sockets, and run
times when co-located with another job.

The bundled ``drb_profile.json`` is the profile the DRB reference simulator was configured
with (HiEST/gpu-topo-aware ``prof_from_experiments``, measured on the paper's IBM Minsky);
``--profile FILE`` takes another in the same format. Keys: network (``bvlc_alexnet``,
``bvlc_googlenet``), per-GPU batch size, GPU count. A time of 0 means "not measured" and falls
back as documented on each method. ``bvlc_reference_caffenet`` (CaffeRef, in the paper's
workloads but not profiled) reads as AlexNet, its close relative.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from gpualloc.errors import TraceError
from gpualloc.model.printable import count_of

ALIASES = {"bvlc_reference_caffenet": "bvlc_alexnet", "caffenet": "bvlc_alexnet",
           "alexnet": "bvlc_alexnet", "googlenet": "bvlc_googlenet"}  # fmt: skip


@dataclass(frozen=True)
class DrbProfile:
    solo: dict[tuple[str, int, int], tuple[float, float]]
    """(network, batch, GPUs) -> (seconds within one socket, seconds across sockets or 0)."""
    collocation: dict[tuple[str, int, int, str, int, int], float]
    """(network, batch, GPUs, other network, other batch, other GPUs) -> seconds (0: unknown)."""
    source: str

    @classmethod
    def bundled(cls) -> DrbProfile:
        text = resources.files("gpualloc.simulate").joinpath("drb_profile.json").read_text()
        return cls.parse(text, "drb_profile.json (bundled)")

    @classmethod
    def load(cls, path: Path) -> DrbProfile:
        from gpualloc.user_files import read_user_text

        return cls.parse(read_user_text(path, "profile", error=TraceError), str(path))

    @classmethod
    def parse(cls, text: str, source: str) -> DrbProfile:
        from gpualloc.user_files import json_document

        try:
            data = json_document(text)
            solo = {
                (str(t), _whole(b), _whole(n)): (_seconds(intra), _seconds(inter))
                for t, b, n, intra, inter in data["solo"]
            }
            collocation = {
                (str(t1), _whole(b1), _whole(n1), str(t2), _whole(b2), _whole(n2)): _seconds(s)
                for t1, b1, n1, t2, b2, n2, s in data["collocation"]
            }
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            from gpualloc.user_files import shown_path, shown_text

            raise TraceError(
                f"{shown_path(source)} is not a job profile ({type(exc).__name__}: "
                f"{shown_text(str(exc))})",
                hint="a JSON object with 'solo' and 'collocation' tables, as drb_profile.json",
            ) from None
        return cls(solo, collocation, source)

    def networks(self) -> set[str]:
        """The networks measured, and the other names read as one of them."""
        return {network for network, _, _ in self.solo} | set(ALIASES)

    def knows(self, network: str) -> bool:
        """Whether ``network`` is one the profile measured, or reads as one."""
        return ALIASES.get(network, network) in {name for name, _, _ in self.solo}

    def has(self, network: str, batch: int, gpus: int) -> bool:
        """Whether a solo time was measured for this job."""
        return (ALIASES.get(network, network), batch, gpus) in self.solo

    def solo_s(self, network: str, batch: int, gpus: int, *, cross_socket: bool = False) -> float:
        """Run time alone; across sockets when asked and measured, else within one socket."""
        key = (ALIASES.get(network, network), batch, gpus)
        if key not in self.solo:
            raise TraceError(
                f"the profile {self.source} has no solo time for {network} with batch {batch} "
                f"on {count_of(gpus, 'GPU')}",
                hint="use --runtime fixed, or a profile that covers this job",
            )
        intra, inter = self.solo[key]
        return inter if cross_socket and inter > 0 else intra

    def slowdown(self, network: str, batch: int, gpus: int, other: tuple[str, int, int]) -> float:
        """How much longer the job runs next to ``other`` (network, batch, GPUs) on one
        socket: co-located time over solo time, at least 1; 1 where not measured."""
        base = self.solo.get((ALIASES.get(network, network), batch, gpus))
        o_network, o_batch, o_gpus = other
        key = (
            ALIASES.get(network, network), batch, gpus,
            ALIASES.get(o_network, o_network), o_batch, o_gpus,
        )  # fmt: skip
        together = self.collocation.get(key, 0.0)
        if base is None or together <= 0 or base[0] <= 0:
            return 1.0
        return max(1.0, together / base[0])


def _whole(value: object) -> int:
    """A batch size or a GPU count of a profile (a number, or its digits as text)."""
    try:
        number = int(value)  # type: ignore[call-overload]
    except OverflowError:  # infinity
        number = -1
    if number < 0 or (isinstance(value, float) and value != number):
        raise ValueError(f"{_shown(value)} is not a whole number >= 0")
    return number


def _seconds(value: object) -> float:
    """A time of a profile: finite, not negative: an infinite one would be an internal
    error, a NaN one a simulation of NaN seconds
    (tests/test_fuzz_findings.py::test_a_profile_of_numbers_no_job_runs_for_is_refused)."""
    from gpualloc.simulate.trace import MAX_SECONDS

    number = float(value)  # type: ignore[arg-type]
    if not 0 <= number <= MAX_SECONDS:
        raise ValueError(f"{_shown(value)} is not a time from 0 to {MAX_SECONDS:g} seconds")
    return number


def _shown(value: object) -> str:
    from gpualloc.user_files import shown_value

    return shown_value(value)
