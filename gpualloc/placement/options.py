"""The options that describe a job, as one struct: what ``plan``, ``run``, ``alloc`` and the
Python API take, turned into the placement engine's :class:`~gpualloc.placement.want.Want` by
one method (``tests/test_job_options.py``).

The command line fills it with the option values as typed (``exclude="0,2-3"``,
``mem="10G"``); the Python API with the same names and Python values (``exclude={0, 2, 3}``,
``mem=10 * 2**30``). :meth:`JobOptions.want` reads both, checks the combinations (``--share``
with ``--mig``, ``-n`` against ``--gpus``, ...) and fills the defaults: the configured policy, and
a job of two or more GPUs is bandwidth-sensitive unless told (MAPA section 2.3).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from msgspec import Struct

from gpualloc.errors import RequestError
from gpualloc.job_options import MAX_GPUS, JobOption, job_fields
from gpualloc.model.option_values import gpu_list, gpu_sequence, mig_request, parse_size
from gpualloc.model.printable import count_of

if TYPE_CHECKING:
    from gpualloc.config import Config
    from gpualloc.placement.mapa.scores import EffectiveModel
    from gpualloc.placement.sets.utility import UtilityWeights
    from gpualloc.placement.want import Want

GpuSelection = str | Iterable[int] | None
"""``"0,2,4-7"`` as typed, or the indices themselves."""
GpuList = str | tuple[int, ...] | None
"""A GPU list as :class:`JobOptions` keeps it: as typed, or the indices (the Python API makes
a tuple of any iterable); a type the broker decodes (msgspec takes no abstract iterable)."""


class JobOptions(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What describes a job (see the module docstring): one field per ``job`` row of
    :data:`gpualloc.job_options.JOB_OPTIONS`, in the table's order, named as on the command
    line, with the row's default (``tests/test_job_options.py`` holds the two equal; the rows
    stay the one description of the options' spellings, help and bounds). Bounds (``-n`` at
    least 1, ``--min-utility`` within 0..1, ...) are checked when it is made, whoever makes it:
    the command line, the Python API or the broker (which decodes a client's options into it,
    unknown fields refused)."""

    count: int | None = None
    pattern: str = "ring"
    sensitive: bool | None = None
    exclude: GpuList = None
    require: GpuList = None
    policy: str | None = None
    score: str = "auto"
    drb_weights: str | tuple[float, float, float] | None = None
    gpus: GpuList = None
    min_utility: float | None = None
    min_bandwidth: float | None = None
    mig: str | None = None
    mem: str | int | None = None
    share: bool = False
    shareable: bool = False
    background: bool = False
    sm_share: int | None = None

    def __post_init__(self) -> None:
        check_bounds(self, _ROWS)

    @classmethod
    def pick(cls, values: Mapping[str, Any]) -> tuple[JobOptions, dict[str, Any]]:
        """The job's options out of a command's option values, and the rest (the command's
        own: ``--numa``, ``--wait``, ...)."""
        fields = set(cls.__struct_fields__)
        job = cls(**{key: value for key, value in values.items() if key in fields})
        return job, {key: value for key, value in values.items() if key not in fields}

    def memory_bytes(self) -> int | None:
        """``mem`` in bytes, or None."""
        if self.mem is None:
            return None
        return self.mem if isinstance(self.mem, int) else parse_size(self.mem, "--mem")

    def declared_memory_bytes(self) -> int | None:
        """The memory a ``--shareable`` job declares it uses (``--mem``), else None."""
        return self.memory_bytes() if self.shareable else None

    def want(self, config: Config) -> Want:
        """The engine's request; usage errors for bad combinations.

        ``--mem`` asks for a MIG device, except with ``--share`` (the shared job's memory) and
        ``--shareable`` (what the job declares it uses: :meth:`declared_memory_bytes`)."""
        self._check_sharing()
        if self.share:
            return self._share_want(config)
        mem = None if self.shareable else self.mem  # declared, not a MIG request
        if self.mig is not None or mem is not None:
            clash = self._whole_gpu_options(self.gpus is not None)
            if clash:
                raise RequestError(
                    f"{clash[0]} applies to whole GPUs, not to a MIG device (--mig/--mem)",
                    hint="a CUDA process uses one MIG device; leave out " + ", ".join(clash),
                )
        from gpualloc.model.request import JobRequest
        from gpualloc.placement.mapa.patterns import build_pattern
        from gpualloc.placement.policies.registry import configured_policy
        from gpualloc.placement.want import Want

        chosen = self._explicit()
        count = self.count
        if chosen is not None:
            if not chosen:
                raise RequestError("--gpus is empty", hint="e.g. --gpus 0,1")
            if count is not None and count != len(chosen):
                raise RequestError(
                    f"-n {count} but --gpus names {count_of(len(chosen), 'GPU')}",
                    hint="give one of them",
                )
            if self.exclude or self.require:
                raise RequestError(
                    "--gpus takes exactly the GPUs named; --exclude and --require do not apply",
                    hint="leave them out",
                )
            count = len(chosen)
        count = count or 1
        request = JobRequest(
            gpus=count,
            pattern=build_pattern(self.pattern, count),
            sensitive=self.sensitive if self.sensitive is not None else count >= 2,
            required=_gpu_set(self.require, "--require"),
            excluded=_gpu_set(self.exclude, "--exclude"),
        )
        return Want(
            request=request,
            policy=configured_policy(config, self.policy),
            explicit=chosen,
            effective_model=effective_model(self.score),
            weights=utility_weights(self.drb_weights),
            min_utility=self.min_utility,
            min_bandwidth_gbps=self.min_bandwidth,
            mig=(
                mig_request(self.mig, self.memory_bytes())
                if self.mig is not None or mem is not None
                else None
            ),
        )

    # ---- the parts of want() ---------------------------------------------------------------

    def _explicit(self) -> tuple[int, ...] | None:
        if self.gpus is None:
            return None
        if isinstance(self.gpus, str):
            return gpu_sequence(self.gpus, "--gpus")
        return _indices(self.gpus, "--gpus")

    def _whole_gpu_options(self, gpus: bool) -> list[str]:
        """The options given that only a request of whole GPUs can use (a MIG device or a
        shared place is one device; ``gpus``: whether --gpus names more than it allows)."""
        given = {
            "-n": self.count is not None and self.count != 1,
            "--gpus": gpus,
            "--exclude": self.exclude is not None,
            "--require": self.require is not None,
            "--min-utility": self.min_utility is not None,
            "--min-bandwidth": self.min_bandwidth is not None,
        }
        return [option for option, present in given.items() if present]

    def _check_sharing(self) -> None:
        if (self.background or self.sm_share is not None) and not self.share:
            option = "--background" if self.background else "--sm-share"
            raise RequestError(f"{option} applies to a shared job", hint="add --share")
        if self.share and self.shareable:
            raise RequestError(
                "--share and --shareable: a shared job already lets other shared jobs beside it",
                hint="give one of them",
            )
        if (self.share or self.shareable) and self.mig is not None:
            option = "--share" if self.share else "--shareable"
            raise RequestError(
                f"{option} applies to whole GPUs, not to a MIG device (--mig)",
                hint="a MIG device is a slice of a GPU already; leave out one of them",
            )

    def _share_want(self, config: Config) -> Want:
        """The request of ``run --share``: one GPU, shared."""
        from gpualloc.model.request import JobRequest
        from gpualloc.model.share import ShareRequest
        from gpualloc.placement.mapa.patterns import build_pattern
        from gpualloc.placement.policies.registry import configured_policy
        from gpualloc.placement.want import Want

        chosen = self._explicit() or ()
        clash = self._whole_gpu_options(len(chosen) > 1)
        if clash:
            raise RequestError(
                f"{clash[0]} does not apply to a shared job (--share), which runs on one GPU",
                hint="leave out " + ", ".join(clash) + " (--gpus N names the one GPU to share)",
            )
        request = ShareRequest(
            memory_bytes=self.memory_bytes(),
            background=self.background,
            sm_percent=self.sm_share,
            gpu=chosen[0] if chosen else None,
        )
        return Want(
            request=JobRequest(gpus=1, pattern=build_pattern("ring", 1), sensitive=False),
            policy=configured_policy(config),
            share=request,
        )


_ROWS = job_fields()


def check_bounds(values: object, rows: tuple[JobOption, ...]) -> None:
    """Refuse a number outside its row's bounds, a bool where a number belongs, or a number
    that is not finite (the API and the wire reach here without the command line's checks)."""
    for row in rows:
        value = getattr(values, row.dest)
        if value is None or row.kind not in ("int", "float"):
            continue
        option = row.spellings[0]
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or (row.kind == "int" and not isinstance(value, int)):
            raise RequestError(f"{option} {value!r} is not {_a(row.kind)}", hint=row.help)
        if isinstance(value, float) and not math.isfinite(value):  # said without 'inf' or 'nan':
            what = "is not a number" if math.isnan(value) else "is too large (not finite)"
            raise RequestError(f"{option} {what}", hint=row.help)  # 1e309 was said back 'inf'

        low, high = row.minimum, row.maximum
        if (low is not None and value < low) or (high is not None and value > high):
            span = f"at least {low:g}" if high is None else f"{low:g} to {high:g}"
            raise RequestError(
                f"{option} {_shown(value)} is out of range ({span})", hint=f"give {span}"
            )


def _shown(value: float) -> str:
    """``value`` for an error line: a 5,000-digit int is neither printable (CPython refuses
    ``str`` past 4,300 digits) nor worth printing."""
    if isinstance(value, int) and abs(value) >= 10**40:
        return f"({'-' if value < 0 else ''}a {value.bit_length()}-bit number)"
    return repr(value)


def _a(kind: str) -> str:
    return "a whole number" if kind == "int" else "a number"


def _gpu_set(value: GpuSelection, option: str) -> frozenset[int]:
    if value is None:
        return frozenset()
    if isinstance(value, str):
        return gpu_list(value, option)
    return frozenset(_indices(value, option))


def _indices(values: Iterable[int], option: str) -> tuple[int, ...]:
    """The API's indices (any iterable, even ``range(10**17)``), read no further than
    :data:`~gpualloc.job_options.MAX_GPUS` of them, as a typed list is bounded."""
    taken = tuple(int(g) for g in itertools.islice(values, MAX_GPUS + 1))
    if len(taken) > MAX_GPUS:
        raise RequestError(
            f"{option} names more GPUs than a host has (at most {MAX_GPUS})",
            hint="name each GPU once, e.g. gpus=[0, 1]",
        )
    return taken


def effective_model(score: str) -> EffectiveModel:
    from gpualloc.placement.mapa.scores import EffectiveModel

    try:
        return EffectiveModel(score)
    except ValueError:
        from gpualloc.model.option_values import unknown_choice

        raise unknown_choice("--score", score, [m.value for m in EffectiveModel]) from None


def utility_weights(value: str | tuple[float, float, float] | None) -> UtilityWeights:
    """``--drb-weights C,I,F`` as weights summing to 1; a usage error saying which of the
    three rules it breaks (three numbers, none negative, not all zero)."""
    from gpualloc.model.printable import printable
    from gpualloc.placement.sets.utility import UtilityWeights

    if value is None:
        return UtilityWeights()
    said = f"--drb-weights '{printable(str(value), 60)}'"
    try:
        values = [float(part) for part in value.split(",")] if isinstance(value, str) else value
        if len(values) != 3 or not all(math.isfinite(v) for v in values):
            raise ValueError
    except (ValueError, TypeError):
        raise RequestError(
            f"{said} is not three non-negative numbers",
            hint="they weigh each part against the others: 2,1,1 counts communication double",
        ) from None
    if min(values) < 0:
        raise RequestError(
            f"{said}: a weight is negative ({min(values):g})",
            hint="a weight is a share of the utility: 0 leaves that part out",
        )
    if not any(values):
        raise RequestError(
            f"{said}: all three weights are zero; at least one must be positive",
            hint="e.g. --drb-weights 1,0,0 to weigh communication alone",
        )
    return UtilityWeights(*values).normalised()
