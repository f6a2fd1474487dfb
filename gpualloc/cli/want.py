"""From the option values of ``plan``, ``run`` and ``alloc`` to the placement engine's request.

No typer here: the command-line fast path (:mod:`gpualloc.cli.fastpath`) calls these as the
typer commands do, so both paths turn the same values into the same request and the same usage
errors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpualloc.cli.state import STATE
from gpualloc.errors import RequestError

if TYPE_CHECKING:
    from gpualloc.launcher.queue import WaitOptions
    from gpualloc.model.mig import MigRequest
    from gpualloc.placement.scores import EffectiveModel
    from gpualloc.placement.utility import UtilityWeights
    from gpualloc.placement.want import Want


def parse_duration(text: str, option: str = "--timeout") -> float:
    """``90``, ``30s``, ``5m``, ``2h``, ``1h30m``, ``1.5h`` -> seconds."""
    from gpualloc.durations import parse_duration_text

    try:
        return parse_duration_text(text)
    except ValueError:
        raise RequestError(
            f"{option} {text!r} is not a duration", hint=f"e.g. {option} 90, 30s, 5m, 1h30m"
        ) from None


def gpu_list(text: str | None, option: str) -> frozenset[int]:
    """A ``0,2,4-7`` list of GPU indices, or a usage error naming ``option``."""
    return frozenset(gpu_sequence(text, option))


def gpu_sequence(text: str | None, option: str) -> tuple[int, ...]:
    """Like :func:`gpu_list`, keeping the order given (``3,1`` is not ``1,3``)."""
    from gpualloc.model.cpuset import is_cpulist, parse_cpulist

    if text is None or text.strip() == "":
        return ()
    parts = [part.strip() for part in text.split(",")]
    if not all(is_cpulist(part) for part in parts):
        raise RequestError(
            f"{option} {text!r} is not a GPU list",
            hint=f"write indices and ranges, e.g. {option} 0,2,4-7",
        )
    try:
        return tuple(g for part in parts for g in parse_cpulist(part))
    except ValueError as exc:
        raise RequestError(f"{option} {text!r}: {exc}", hint=f"e.g. {option} 0,2,4-7") from None


def effective_model(score: str) -> EffectiveModel:
    from gpualloc.placement.scores import EffectiveModel

    try:
        return EffectiveModel(score)
    except ValueError:
        raise RequestError(
            f"unknown --score {score!r}", hint="choose auto, mapa or bottleneck"
        ) from None


def utility_weights(text: str | None) -> UtilityWeights:
    from gpualloc.placement.utility import UtilityWeights

    if text is None:
        return UtilityWeights()
    try:
        values = [float(part) for part in text.split(",")]
        if len(values) != 3:
            raise ValueError
        return UtilityWeights(*values).normalised()
    except ValueError:
        raise RequestError(
            f"--drb-weights {text!r} is not three non-negative numbers",
            hint="e.g. --drb-weights 0.5,0.25,0.25 (communication, interference, fragmentation)",
        ) from None


def build_want(
    *,
    count: int | None,
    pattern: str,
    sensitive: bool | None,
    exclude: str | None,
    require: str | None,
    policy: str | None,
    score: str,
    drb_weights: str | None,
    explicit: str | None = None,
    min_utility: float | None = None,
    min_bandwidth: float | None = None,
    mig: str | None = None,
    mem: str | None = None,
    share: bool = False,
    shareable: bool = False,
    background: bool = False,
    sm_share: int | None = None,
) -> Want:
    """The engine's request from the option values; usage errors for bad combinations.

    ``--mem`` asks for a MIG device, except with ``--share`` (the shared job's memory) and
    ``--shareable`` (what the job declares it uses: see :func:`declared_memory`)."""
    _check_sharing(share, shareable, background, sm_share, mig)
    if share:
        return _share_want(
            count, explicit, exclude, require, min_utility, min_bandwidth, mem, background, sm_share
        )
    if shareable:
        mem = None  # declared, not a MIG request
    if mig is not None or mem is not None:
        clash = _whole_gpu_options(
            count, explicit is not None, exclude, require, min_utility, min_bandwidth
        )
        if clash:
            raise RequestError(
                f"{clash[0]} applies to whole GPUs, not to a MIG device (--mig/--mem)",
                hint="a CUDA process uses one MIG device; leave out " + ", ".join(clash),
            )
    from gpualloc.model.request import JobRequest
    from gpualloc.placement.patterns import build_pattern
    from gpualloc.placement.registry import configured_policy
    from gpualloc.placement.want import Want

    chosen = gpu_sequence(explicit, "--gpus") if explicit is not None else None
    if chosen is not None:
        if not chosen:
            raise RequestError("--gpus is empty", hint="e.g. --gpus 0,1")
        if count is not None and count != len(chosen):
            raise RequestError(
                f"-n {count} but --gpus names {len(chosen)} GPU(s)", hint="give one of them"
            )
        if exclude or require:
            raise RequestError(
                "--gpus takes exactly the GPUs named; --exclude and --require do not apply",
                hint="leave them out",
            )
        count = len(chosen)
    count = count or 1
    policy = configured_policy(STATE.config(), policy)
    request = JobRequest(
        gpus=count,
        pattern=build_pattern(pattern, count),
        sensitive=sensitive if sensitive is not None else count >= 2,
        required=gpu_list(require, "--require"),
        excluded=gpu_list(exclude, "--exclude"),
    )
    return Want(
        request=request,
        policy=policy,
        explicit=chosen,
        effective_model=effective_model(score),
        weights=utility_weights(drb_weights),
        min_utility=min_utility,
        min_bandwidth_gbps=min_bandwidth,
        mig=mig_request(mig, mem) if mig is not None or mem is not None else None,
    )


def _whole_gpu_options(
    count: int | None,
    gpus: bool,
    exclude: str | None,
    require: str | None,
    min_utility: float | None,
    min_bandwidth: float | None,
) -> list[str]:
    """The options given that only a request of whole GPUs can use (a MIG device or a shared
    place is one device; ``gpus``: whether --gpus names more than it allows)."""
    given = {
        "-n": count is not None and count != 1,
        "--gpus": gpus,
        "--exclude": exclude is not None,
        "--require": require is not None,
        "--min-utility": min_utility is not None,
        "--min-bandwidth": min_bandwidth is not None,
    }
    return [option for option, present in given.items() if present]


def _check_sharing(
    share: bool, shareable: bool, background: bool, sm_share: int | None, mig: str | None
) -> None:
    if (background or sm_share is not None) and not share:
        option = "--background" if background else "--sm-share"
        raise RequestError(f"{option} applies to a shared job", hint="add --share")
    if share and shareable:
        raise RequestError(
            "--share and --shareable: a shared job already lets other shared jobs beside it",
            hint="give one of them",
        )
    if (share or shareable) and mig is not None:
        option = "--share" if share else "--shareable"
        raise RequestError(
            f"{option} applies to whole GPUs, not to a MIG device (--mig)",
            hint="a MIG device is a slice of a GPU already; leave out one of them",
        )


def _share_want(
    count: int | None,
    explicit: str | None,
    exclude: str | None,
    require: str | None,
    min_utility: float | None,
    min_bandwidth: float | None,
    mem: str | None,
    background: bool,
    sm_share: int | None,
) -> Want:
    """The request of ``run --share``: one GPU, shared."""
    from gpualloc.model.request import JobRequest
    from gpualloc.model.share import ShareRequest
    from gpualloc.placement.patterns import build_pattern
    from gpualloc.placement.registry import configured_policy
    from gpualloc.placement.want import Want

    chosen = gpu_sequence(explicit, "--gpus") if explicit is not None else ()
    clash = _whole_gpu_options(count, len(chosen) > 1, exclude, require, min_utility, min_bandwidth)
    if clash:
        raise RequestError(
            f"{clash[0]} does not apply to a shared job (--share), which runs on one GPU",
            hint="leave out " + ", ".join(clash) + " (--gpus N names the one GPU to share)",
        )
    request = ShareRequest(
        memory_bytes=parse_size(mem, "--mem") if mem is not None else None,
        background=background,
        sm_percent=sm_share,
        gpu=chosen[0] if chosen else None,
    )
    return Want(
        request=JobRequest(gpus=1, pattern=build_pattern("ring", 1), sensitive=False),
        policy=configured_policy(STATE.config()),
        share=request,
    )


def declared_memory(mem: str | None, shareable: bool) -> int | None:
    """The memory a ``--shareable`` job declares it uses (``--mem``), else None."""
    return parse_size(mem, "--mem") if shareable and mem is not None else None


def mig_request(mig: str | None, mem: str | None) -> MigRequest:
    """``--mig PROFILE|GPU0/MIG3|MIG-uuid`` and ``--mem SIZE`` -> the MIG request."""
    from gpualloc.model.mig import MigRequest, parse_mig_label, parse_mig_profile

    memory = parse_size(mem, "--mem") if mem is not None else None
    if mig is None:
        return MigRequest(memory_bytes=memory)
    text = mig.strip()
    if text.upper().startswith("MIG-"):
        return MigRequest(uuid=text, memory_bytes=memory)
    if (device := parse_mig_label(text)) is not None:
        return MigRequest(device=device, memory_bytes=memory)
    try:
        return MigRequest(profile=parse_mig_profile(text).name, memory_bytes=memory)
    except ValueError:
        raise RequestError(
            f"--mig {mig!r} is neither a MIG profile nor a MIG device",
            hint="e.g. --mig 1g.5gb, --mig GPU0/MIG3 or --mig MIG-<uuid> (gpualloc topo show)",
        ) from None


_SIZE_UNITS = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def parse_size(text: str, option: str) -> int:
    """``10G``, ``4.5GiB``, ``512M``, ``20GB`` -> bytes (K/M/G/T are binary, as nvidia-smi's
    MiB; a bare number is bytes)."""
    import re

    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*", text.upper())
    value = float(match[1]) * _SIZE_UNITS[match[2]] if match else 0.0
    if value < 1:
        raise RequestError(
            f"{option} {text!r} is not a memory size", hint=f"e.g. {option} 10G, 4.5G or 512M"
        )
    return int(value)


def wait_options(
    *, wait: bool, timeout: str | None, priority: str | None, max_bypass: int | None
) -> WaitOptions | None:
    """The queue options, or None without --wait (usage errors for options that need it)."""
    from gpualloc.launcher.queue import WaitOptions

    if priority is not None and priority not in ("high", "normal", "low"):
        raise RequestError(f"unknown --priority {priority!r}", hint="choose high, normal or low")
    if not wait:
        if timeout is not None or priority is not None or max_bypass is not None:
            raise RequestError(
                "--timeout, --priority and --max-bypass apply to --wait", hint="add --wait"
            )
        return None
    return WaitOptions.from_config(
        STATE.config(),
        timeout_s=parse_duration(timeout) if timeout is not None else None,
        priority=priority,  # type: ignore[arg-type]
        max_bypass=max_bypass,
    )
