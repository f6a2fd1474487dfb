"""MIG instances: the slices of a GPU that NVIDIA's Multi-Instance GPU mode hands out.

With MIG on, an A100/H100/H200 is split into GPU instances (GI: a share of the memory and of
the streaming multiprocessors, in *slices* of one seventh) and each GI into compute instances
(CI). What CUDA sees, and what ``nvidia-smi -L`` lists as ``MIG <profile> Device N``, is one CI:
a *MIG device*, named by its ``MIG-<uuid>``. A CUDA process uses one MIG device at most (NVIDIA
MIG User Guide, "CUDA Device Enumeration"), so gpualloc leases them one at a time.

A profile name says the size: ``3g.20gb`` is a 3-slice GI with about 20 GB; ``1c.3g.20gb`` one
compute slice of such a GI (the GI's memory is then shared with its other CIs); suffixes like
``+me`` (media engines) or ``-me`` leave the size as it is.
"""

import re

from msgspec import Struct

from gpualloc.model.validation import NonNegativeInt, PositiveInt
from gpualloc.user_files import shown_text, shown_value

GIB = 1024**3

_PROFILE = (
    r"^(?:(?P<compute>[1-9]\d*)c\.)?(?P<slices>[1-9]\d*)g\.(?P<memory>[1-9]\d*)gb"
    r"(?P<extras>(?:[+-][a-z]+)*)$"
)
"""The patterns of this module are compiled by :mod:`re` when first used (``re.match(pattern,
...)``), not as every command loads it: most hosts have no MIG device."""


class MigProfile(Struct, frozen=True, kw_only=True):
    """A parsed MIG profile name."""

    name: str
    slices: int
    """GPU slices of the GPU instance (the ``3`` of ``3g.20gb``)."""
    compute_slices: int
    """Compute slices of the compute instance (``1`` of ``1c.3g.20gb``; all of the GI when the
    name has no ``c.`` part)."""
    nominal_memory_gb: int
    """The ``20`` of ``3g.20gb``: a rounded figure; NVML reports the exact memory."""


def parse_mig_profile(text: str) -> MigProfile:
    """``3g.20gb`` / ``1c.3g.20gb`` / ``1g.10gb+me`` -> :class:`MigProfile`.

    Raises ValueError naming the expected form for anything else.
    """
    name = text.strip()
    match = re.match(_PROFILE, name.lower())
    if match is None:
        raise ValueError(
            f"{shown_value(text)} is not a MIG profile; expected a form like 1g.5gb, 3g.20gb or "
            "1c.3g.20gb"
        )
    if max(len(match["slices"]), len(match["compute"] or ""), len(match["memory"])) > 4:
        raise ValueError(f"{shown_value(text)} is not a MIG profile: no GPU has that many slices")
    slices = int(match["slices"])
    compute = int(match["compute"]) if match["compute"] else slices
    if compute > slices:
        raise ValueError(f"MIG profile {shown_value(text)} has more compute slices than GPU slices")
    return MigProfile(
        name=name.lower(),
        slices=slices,
        compute_slices=compute,
        nominal_memory_gb=int(match["memory"]),
    )


class MigInstance(Struct, kw_only=True, forbid_unknown_fields=True):
    """One MIG device (a compute instance of a GPU instance) of a GPU with MIG enabled."""

    gpu: NonNegativeInt
    """Index of the parent GPU."""
    device: NonNegativeInt
    """MIG device index on the parent, as ``nvidia-smi -L`` numbers it (``Device N``) and
    NVML's ``nvmlDeviceGetMigDeviceHandleByIndex`` takes it."""
    profile: str
    """The profile name, e.g. ``3g.20gb``."""
    uuid: str | None = None
    """``MIG-<uuid>``: what ``CUDA_VISIBLE_DEVICES`` takes. None when the source did not show it
    (``nvidia-smi mig -lgi``); such an instance can be shown but not leased."""
    gpu_instance: NonNegativeInt | None = None
    """GPU instance id (GI)."""
    compute_instance: NonNegativeInt | None = None
    """Compute instance id within the GI (CI)."""
    memory_total_bytes: NonNegativeInt | None = None
    """The instance's memory as NVML or nvidia-smi reports it (None: only the nominal size of
    the profile is known)."""
    placement_start: NonNegativeInt | None = None
    """First memory slice of the GI on the GPU (``Start`` of ``nvidia-smi mig -lgi``)."""
    placement_size: PositiveInt | None = None

    def __post_init__(self) -> None:
        parse_mig_profile(self.profile)  # a file with a malformed profile is refused

    @property
    def parsed_profile(self) -> MigProfile:
        return parse_mig_profile(self.profile)

    @property
    def slices(self) -> int:
        return self.parsed_profile.slices

    @property
    def label(self) -> str:
        """How gpualloc names the instance to people: ``GPU0/MIG3``."""
        return mig_label(self.gpu, self.device)

    @property
    def memory_bytes(self) -> int:
        """Reported memory, else the profile's nominal size (in GiB, as NVIDIA rounds it)."""
        if self.memory_total_bytes is not None:
            return self.memory_total_bytes
        return self.parsed_profile.nominal_memory_gb * GIB


def mig_label(gpu: int, device: int) -> str:
    """``GPU<gpu>/MIG<device>``: the name gpualloc prints and accepts for a MIG device."""
    return f"GPU{gpu}/MIG{device}"


_LABEL = r"(?i)^(?:gpu)?(\d+)\s*[/:]\s*(?:mig)?(\d+)$"


def parse_mig_label(text: str) -> tuple[int, int] | None:
    """``GPU0/MIG3``, ``0/3`` or ``0:3`` -> (0, 3); None when ``text`` is not such a label."""
    match = re.match(_LABEL, text.strip())
    return (int(match[1]), int(match[2])) if match else None


MIG_UUID = r"[A-Za-z0-9][A-Za-z0-9._:/-]*"
"""A MIG device's UUID as ``CUDA_VISIBLE_DEVICES`` takes it: ``MIG-<uuid>``, or before driver
R470 ``MIG-GPU-<uuid>/<gi>/<ci>``. An empty one, or one a comma, a space or a control character
would split or garble, is refused with the topology, before any lease is made of the device: a
job's variables are only made once its lease is written
(tests/test_fuzz_findings.py::test_a_mig_device_cuda_cannot_name_is_refused_before_any_lease)."""


def check_mig_layout(instances: list[MigInstance], gpu_count: int) -> None:
    """Refuse a layout no GPU can have: a parent that does not exist, a device index or a UUID
    used twice, a UUID no job could be given. Raises ValueError (the topology's validation
    turns it into a clear error)."""
    seen: set[tuple[int, int]] = set()
    uuids: set[str] = set()
    for instance in instances:
        if instance.gpu >= gpu_count:
            raise ValueError(f"MIG device {instance.label} is on a GPU that does not exist")
        key = (instance.gpu, instance.device)
        if key in seen:
            raise ValueError(f"MIG device {instance.label} is listed twice")
        seen.add(key)
        if instance.uuid is not None:
            if not re.fullmatch(MIG_UUID, instance.uuid):
                from gpualloc.model.printable import printable

                raise ValueError(
                    f"MIG device {instance.label}'s UUID '{printable(instance.uuid, 60)}' is not "
                    "one CUDA_VISIBLE_DEVICES can hold (null where it is not known)"
                )
            if instance.uuid in uuids:
                raise ValueError(f"MIG UUID {instance.uuid} is listed twice")
            uuids.add(instance.uuid)


class MigRequest(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What MIG device a job wants (``--mig``, ``--mem``); at least one field is set. Stored
    whole in a waiting job's queue entry."""

    profile: str | None = None
    """Exactly this profile (``3g.20gb``)."""
    device: tuple[NonNegativeInt, NonNegativeInt] | None = None
    """Exactly this MIG device: (parent GPU, device index)."""
    uuid: str | None = None
    """Exactly the MIG device with this ``MIG-`` UUID."""
    memory_bytes: PositiveInt | None = None
    """At least this much memory."""

    def describe(self) -> str:
        parts = []
        if self.device is not None:
            parts.append(mig_label(*self.device))
        if self.uuid is not None:
            parts.append(shown_text(self.uuid))
        if self.profile:
            parts.append(shown_text(self.profile))
        if self.memory_bytes is not None:
            parts.append(f">= {format_size(self.memory_bytes)}")
        return " ".join(parts) or "any MIG device"

    def accepts(self, instance: MigInstance) -> bool:
        if self.device is not None and (instance.gpu, instance.device) != self.device:
            return False
        if self.uuid is not None and (instance.uuid or "").lower() != self.uuid.lower():
            return False
        if self.profile is not None and instance.profile != self.profile:
            return False
        return self.memory_bytes is None or instance.memory_bytes >= self.memory_bytes


def format_size(size: int) -> str:
    """Bytes as ``4.75 GiB`` / ``20 GiB``."""
    gib = size / GIB
    return f"{gib:.0f} GiB" if abs(gib - round(gib)) < 0.005 else f"{gib:.2f} GiB"
