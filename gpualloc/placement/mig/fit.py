"""Choosing a MIG device: best fit, packed onto the GPUs already in use.

A MIG request names a profile (``--mig 3g.20gb``), a device (``--mig GPU0/MIG3`` or its
``MIG-`` UUID), or only a memory size (``--mem 10G``). Among the free MIG devices that satisfy
it, the choice is the *smallest* (fewest slices, then least memory: best fit, so that a big
device stays for a request that needs it), then the one on the GPU whose MIG devices are most
in use already (so that the other split GPUs stay wholly free, for big requests or for an
administrator to re-split), then the lowest GPU and device index. A CUDA process uses one MIG
device (NVIDIA MIG User Guide, "CUDA Device Enumeration"), so a request gets exactly one.
"""

from __future__ import annotations

from collections.abc import Mapping

from msgspec import Struct

from gpualloc.errors import GpusBusy, NoFeasiblePlacement
from gpualloc.model.mig import MigInstance, MigRequest, format_size
from gpualloc.model.mig_profiles import MigModel, mig_model
from gpualloc.model.topology import Topology


class MigDevicesBusy(GpusBusy):
    """Every MIG device that fits the request is held now; ``held`` names them."""

    def __init__(self, message: str, *, hint: str, held: tuple[tuple[int, int], ...]) -> None:
        super().__init__(message, hint=hint)
        self.held = held


class MigChoice(Struct, frozen=True):
    """The chosen device, why, and the other fitting free devices in order of preference."""

    instance: MigInstance
    reason: str
    runners_up: tuple[MigInstance, ...] = ()


def choose_mig(
    topology: Topology,
    request: MigRequest,
    held: Mapping[tuple[int, int], object],
    *,
    unusable: frozenset[int] = frozenset(),
    mix: Mapping[str, float] | None = None,
) -> MigChoice:
    """The MIG device for ``request`` among those not in ``held`` (whose parents are not in
    ``unusable``: lost, or not this Slurm job's).

    Raises :class:`NoFeasiblePlacement` when no device of the host could ever satisfy the
    request, :class:`MigDevicesBusy` when every one that could is held now. For a named
    profile, their hint says where an administrator could create one: the free slices where it
    fragments the rest least (:mod:`.slots`, weighed by ``mix``, the
    host's recent MIG requests by profile).
    """
    devices = [m for m in topology.mig_instances if m.gpu not in unusable]
    _check_profile_exists(topology, request, devices, unusable)
    all_mig = all_in_mig_mode(topology, unusable)
    if not devices:
        raise NoFeasiblePlacement(
            "this host has no MIG device"
            if not topology.mig_instances
            else "no MIG device of this host is usable here",
            hint=creation_hint(topology, request, mix, unusable)
            or (
                "every GPU here is in MIG mode, and MIG devices exist once an administrator "
                "makes them (nvidia-smi mig -cgi PROFILES -C)"
                if all_mig
                else "ask for whole GPUs (-n), or for room on a shared GPU (--share --mem "
                "SIZE); MIG devices exist once an administrator makes them (nvidia-smi -mig 1, "
                "then nvidia-smi mig -cgi PROFILES -C)"
            ),
        )
    fitting = [m for m in devices if request.accepts(m)]
    if not fitting:
        raise NoFeasiblePlacement(
            f"no MIG device here is {request.describe()} (this host has {inventory(devices)})",
            hint=creation_hint(topology, request, mix, unusable)
            or "choose one of those (gpualloc topo show lists them)"
            + ("" if all_mig else ", or ask for a whole GPU"),
        )
    nameless = [m for m in fitting if m.uuid is None]
    fitting = [m for m in fitting if m.uuid is not None]
    if not fitting:
        raise NoFeasiblePlacement(
            f"the MIG devices that fit ({', '.join(m.label for m in nameless)}) have no known "
            "UUID, so CUDA_VISIBLE_DEVICES cannot name them",
            hint="record the topology with 'nvidia-smi -L' (topo import --mig) or on the host",
        )
    free = [m for m in fitting if (m.gpu, m.device) not in held]
    if not free:
        more = creation_hint(topology, request, mix, unusable)
        raise MigDevicesBusy(
            f"every MIG device that is {request.describe()} is held now "
            f"({', '.join(m.label for m in fitting)})",
            hint="wait for one (--wait; 'gpualloc status' shows who holds them)"
            + (f"; {more}" if more else ""),
            held=tuple((m.gpu, m.device) for m in fitting),
        )
    in_use = {gpu: sum(1 for key in held if key[0] == gpu) for gpu in {m.gpu for m in devices}}
    ranked = sorted(
        free, key=lambda m: (m.slices, m.memory_bytes, -in_use.get(m.gpu, 0), m.gpu, m.device)
    )
    best = ranked[0]
    reason = _reason(best, request, in_use, len(topology.mig_on(best.gpu)))
    return MigChoice(best, reason, tuple(ranked[1:]))


def _reason(best: MigInstance, request: MigRequest, in_use: dict[int, int], count: int) -> str:
    what = f"{best.label} ({best.profile}, {format_size(best.memory_bytes)})"
    if request.device is not None or request.uuid is not None:
        return f"{what}: the MIG device asked for"
    text = f"{what}: the smallest free MIG device that is {request.describe()}"
    used = in_use.get(best.gpu, 0)
    if used:
        text += f"; packed onto GPU{best.gpu}, {used} of whose {count} MIG devices are in use"
    return text


def creation_hint(
    topology: Topology,
    request: MigRequest,
    mix: Mapping[str, float] | None,
    unusable: frozenset[int] = frozenset(),
) -> str:
    """Where a GPU instance of the requested profile (or, for ``--mem``, of the smallest
    profile with that much memory) could be created now, in words ("" when the request names
    a device, or no GPU has room for one)."""
    from gpualloc.placement.mig.slots import creation_slots

    if request.device is not None or request.uuid is not None:
        return ""
    if request.profile is not None:
        profile, why = request.profile, ""
    elif request.memory_bytes is not None:
        found = _smallest_with(topology, request.memory_bytes, unusable)
        if found is None:
            return _too_big(topology, request.memory_bytes, unusable)
        profile, why = found, f" (it holds {format_size(request.memory_bytes)} or more)"
    else:
        return ""
    slots = [s for s in creation_slots(topology, profile, mix) if s.gpu not in unusable]
    if not slots:
        return ""
    best = slots[0]
    return (
        f"an administrator can create a {profile}{why} in GPU {best.gpu}'s free memory "
        f"slices {best.slices}, where it fragments the rest least (nvidia-smi mig -i "
        f"{best.gpu} -cgi {profile} -C; the driver picks the start, NVML's "
        f"nvmlDeviceCreateGpuInstanceWithPlacement takes {best.start})"
    )


def _mig_models(topology: Topology, unusable: frozenset[int]) -> dict[str, MigModel | None]:
    """GPU name -> its MIG model, for the GPUs in MIG mode that can be used."""
    return {
        gpu.name or "?": mig_model(gpu.name, gpu.memory_total_bytes)
        for gpu in topology.gpus
        if gpu.mig_enabled and gpu.index not in unusable
    }


def _smallest_with(topology: Topology, memory: int, unusable: frozenset[int]) -> str | None:
    """The smallest profile of the MIG-mode GPUs' models that surely holds ``memory``."""
    from gpualloc.model.mig_profiles import usable_bytes

    sizes = [
        (shape[1], shape[0], profile)
        for model in _mig_models(topology, unusable).values()
        if model is not None
        for profile in model.profiles
        if (shape := model.shape(profile)) and usable_bytes(profile) >= memory
    ]
    return min(sizes)[2] if sizes else None


def _too_big(topology: Topology, memory: int, unusable: frozenset[int]) -> str:
    """What to say when no MIG profile of the host's models holds ``memory``: a whole GPU, if
    one holds it, on an all-MIG host (elsewhere the caller's hint offers whole GPUs)."""
    from gpualloc.model.mig_profiles import usable_bytes

    models = [m for m in _mig_models(topology, unusable).values() if m is not None]
    if not models or not all_in_mig_mode(topology, unusable):
        return ""
    largest = max((m.profiles[-1] for m in models), key=usable_bytes)
    surely = f"a {largest}, the largest profile here, holds {format_size(usable_bytes(largest))}"
    whole = max((g.memory_total_bytes or 0) for g in topology.gpus if g.index not in unusable)
    if whole >= memory:
        return (
            f"{surely} for sure; a whole GPU holds {format_size(memory)} once an administrator "
            "turns its MIG mode off (nvidia-smi -i N -mig 0)"
        )
    return f"{surely} for sure, and a whole GPU {format_size(whole)}"


def all_in_mig_mode(topology: Topology, unusable: frozenset[int] = frozenset()) -> bool:
    """Whether every GPU that could be used is in MIG mode: then no whole GPU can be had."""
    usable = [gpu for gpu in topology.gpus if gpu.index not in unusable]
    return bool(usable) and all(gpu.mig_enabled for gpu in usable)


def _check_profile_exists(
    topology: Topology,
    request: MigRequest,
    devices: list[MigInstance],
    unusable: frozenset[int],
) -> None:
    """Refuse a profile that no GPU of the host has (NVIDIA's profiles are per model:
    :mod:`gpualloc.model.mig_profiles`), naming those they have: waiting for one, or creating
    one, can never succeed. The GPUs asked are those in MIG mode, else every GPU of a model
    with MIG; a GPU in MIG mode of a model gpualloc does not know might have it, and a profile
    some MIG device already has exists."""
    from gpualloc.model.mig import parse_mig_profile
    from gpualloc.model.mig_profiles import base_profile
    from gpualloc.user_files import shown_text

    if request.profile is None or request.device is not None or request.uuid is not None:
        return
    if any(m.profile == request.profile for m in topology.mig_instances):
        return
    models = _mig_models(topology, unusable)
    if not models:
        models = {
            gpu.name or "?": model
            for gpu in topology.gpus
            if (model := mig_model(gpu.name, gpu.memory_total_bytes)) is not None
        }
    wanted = base_profile(parse_mig_profile(request.profile))
    if not models or any(m is None or wanted in m.profiles for m in models.values()):
        return
    listing = "; ".join(f"{name}: {', '.join(m.profiles)}" for name, m in models.items() if m)
    raise NoFeasiblePlacement(
        f"no GPU here has MIG profile {shown_text(request.profile)} ({listing})",
        hint=f"this host has {inventory(devices)} now; ask for one of those"
        if devices
        else "ask for one of those, or for the memory the job needs (--mem SIZE)",
    )


def inventory(devices: list[MigInstance]) -> str:
    """``7 x 1g.5gb, 2 x 3g.20gb``: the profiles of ``devices`` with their counts."""
    counts: dict[str, int] = {}
    for device in sorted(devices, key=lambda m: (m.slices, m.memory_bytes)):
        counts[device.profile] = counts.get(device.profile, 0) + 1
    return ", ".join(f"{count} x {profile}" for profile, count in counts.items())
