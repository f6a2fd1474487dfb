"""``gpualloc doctor``'s checks: what is set up is what is working.

- **NVLink**: every NVLink connection the topology has (``NV4`` between two GPUs, or a GPU's
  links into an NVSwitch fabric) has that many ports up, at the topology's NVLink generation.
- **PCIe**: every GPU's link runs at its full width (a GPU at x8 in an x16 slot has half the
  host bandwidth: a badly seated card, a riser, a slot shared by bifurcation). A generation
  below the maximum is only a note: idle GPUs lower it to save power.
- **Peer-to-peer**: the GPUs of every lease can reach each other directly (NVML's P2P status,
  over NVLink too where they are NVLink peers); a sharing layer or a driver setting that turns
  it off makes NCCL stage every transfer through host memory.
- **Leases**: every lease's processes run on its GPUs only, and nobody else's on them (see
  :mod:`gpualloc.ledger.attribution`); no GPU is unhealthy (see
  :mod:`gpualloc.discovery.health`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from msgspec import Struct

from gpualloc.discovery.links import P2P_MEANING, GpuLinks, LinksNow
from gpualloc.ledger.attribution import Attribution
from gpualloc.ledger.schema import Lease
from gpualloc.model.printable import count_of
from gpualloc.model.topology import GpuFault, Topology

Severity = Literal["ok", "note", "problem"]


class Finding(Struct, frozen=True):
    check: str
    """``nvlink``, ``pcie``, ``p2p``, ``lease``, ``health``, ``ledger``, ``bandwidth`` or
    ``mig`` (a MIG mode that changes at the GPU's next reset)."""
    where: str
    severity: Severity
    detail: str


def link_findings(topology: Topology, links: LinksNow, leases: Iterable[Lease]) -> list[Finding]:
    """NVLink, PCIe and peer-to-peer findings for ``links`` (read from the host now)."""
    nvlink = _nvlink_findings(topology, links)
    flagged = {
        int(gpu)
        for f in nvlink
        if f.severity == "problem"
        for gpu in f.where.removeprefix("GPU ").split(",")
        if gpu.strip().isdigit()
    }
    ports = [f for gpu, f in _port_findings(topology, links) if gpu not in flagged]
    if ports:  # "every link up" would contradict them
        nvlink = [f for f in nvlink if f.severity != "ok"]
    return [
        *nvlink,
        *ports,
        *_pcie_findings(links),
        *_p2p_findings(links, leases),
    ]


def lease_findings(
    attribution: Attribution, faults: Iterable[GpuFault], *, processes_seen: bool = True
) -> list[Finding]:
    """Jobs off their GPUs, strangers on leased ones, and unhealthy GPUs; ``processes_seen``:
    whether the GPUs' process lists could be read at all (else nothing is said of the jobs)."""
    from gpualloc.ledger.attribution import describe_intruder, describe_misplaced

    found = [
        Finding("lease", f"lease {m.lease.id}", "problem", describe_misplaced(m))
        for m in attribution.misplaced
    ]
    found += [
        Finding("lease", f"GPU {i.process.gpu}", "problem", describe_intruder(i))
        for i in attribution.intruders
    ]
    if not processes_seen:
        found.append(
            Finding("lease", "all leases", "note", "the GPUs' process lists cannot be read here")
        )
    elif not found:
        found.append(Finding("lease", "all leases", "ok", "every job runs on its own GPUs only"))
    found += [Finding("health", f"GPU {fault.gpu}", "problem", fault.detail) for fault in faults]
    return found


# ---- NVLink ----------------------------------------------------------------------------------


def _nvlink_findings(topology: Topology, links: LinksNow) -> list[Finding]:
    from gpualloc.discovery.nvml import normalise_bus_id

    if links.source == "nvidia-smi":
        return _nvlink_counts(topology, links)  # 'nvlink -s' does not name the far end
    bus_of = {
        gpu.index: normalise_bus_id(gpu.pci_bus_id) for gpu in topology.gpus if gpu.pci_bus_id
    }
    gpu_buses = set(bus_of.values())
    found: list[Finding] = []
    healthy = 0
    switch_checked: set[int] = set()
    for link in topology.links:
        if not link.nvlinks:
            continue
        expected_generation = link.nvlink_generation
        if link.nvswitch:
            for gpu in (link.a, link.b):
                state = links.gpus.get(gpu)
                if gpu in switch_checked or state is None or state.ports is None:
                    continue
                switch_checked.add(gpu)
                up = [p for p in state.ports if p.active and p.remote_bus_id not in gpu_buses]
                problem = _short(f"GPU {gpu}", "NVSwitch", up, link.nvlinks, expected_generation)
                found += [problem] if problem else []
                healthy += problem is None
            continue
        state = links.gpus.get(link.a)
        if state is None or state.ports is None or link.b not in bus_of:
            continue
        up = [p for p in state.ports if p.active and p.remote_bus_id == bus_of[link.b]]
        where = f"GPU {link.a},{link.b}"
        problem = _short(where, f"GPU {link.b}", up, link.nvlinks, expected_generation)
        found += [problem] if problem else []
        healthy += problem is None
    if healthy:
        found.append(
            Finding(
                "nvlink",
                "all GPUs",
                "ok",
                f"{count_of(healthy, 'NVLink connection')} with every link up at its generation",
            )
        )
    return found


def _port_findings(topology: Topology, links: LinksNow) -> list[tuple[int, Finding]]:
    """What is wrong with the ports whatever the topology says
    (tests/test_verified_launch.py::test_links_already_down_at_discovery_are_found_without_an_earlier_picture):
    a topology discovered with a link already down records the fault as the truth, so two checks
    need no earlier picture. A port down below the GPU's highest port up (ports are used from 0: a
    dead link or a loose bridge); and a GPU with fewer NVSwitch links up than its peers on the same
    switches (every GPU of an NVSwitch board has the same count). Each with its GPU."""
    from gpualloc.discovery.nvml import normalise_bus_id

    gpu_buses = {normalise_bus_id(g.pci_bus_id) for g in topology.gpus if g.pci_bus_id}
    switched = {g for link in topology.links if link.nvswitch for g in (link.a, link.b)}
    found: list[tuple[int, Finding]] = []
    into_switch: dict[int, int] = {}
    for gpu, state in sorted(links.gpus.items()):
        if not state.ports:
            continue
        up = [p.link for p in state.ports if p.active]
        gaps = [p.link for p in state.ports if not p.active and up and p.link < max(up)]
        if gaps:
            ports = ", ".join(map(str, gaps))
            remedy = (
                "a dead link (check the board and the fabric manager; 'nvidia-smi nvlink -s')"
                if gpu in switched
                else "a dead link or a loose bridge (reseat it, or ask the vendor; "
                "'nvidia-smi nvlink -s')"
            )
            detail = f"NVLink port {ports} down while port {max(up)} is up: {remedy}"
            found.append((gpu, Finding("nvlink", f"GPU {gpu}", "problem", detail)))
        if gpu in switched and links.source != "nvidia-smi":
            into_switch[gpu] = sum(
                1 for p in state.ports if p.active and p.remote_bus_id not in gpu_buses
            )
    if into_switch:
        most = max(into_switch.values())
        for gpu, count in sorted(into_switch.items()):
            if count < most:
                detail = (
                    f"{count} NVSwitch links up where its peers have {most}: its all-to-all "
                    "traffic runs slower (check the board and the fabric manager)"
                )
                found.append((gpu, Finding("nvlink", f"GPU {gpu}", "problem", detail)))
    return found


def _nvlink_counts(topology: Topology, links: LinksNow) -> list[Finding]:
    """Per GPU: as many NVLink ports up as the topology's connections of that GPU need."""
    expected: dict[int, int] = {}
    into_switch: set[int] = set()
    for link in topology.links:
        for gpu in (link.a, link.b):
            if link.nvswitch and gpu in into_switch:
                continue
            if link.nvswitch:
                into_switch.add(gpu)
            expected[gpu] = expected.get(gpu, 0) + link.nvlinks
    found: list[Finding] = []
    healthy = 0
    for gpu, want in sorted(expected.items()):
        state = links.gpus.get(gpu)
        if not want or state is None or state.ports is None:
            continue
        up = [p for p in state.ports if p.active]
        problem = _short(f"GPU {gpu}", "its peers", up, want, None)
        found += [problem] if problem else []
        healthy += problem is None
    if healthy:
        found.append(
            Finding("nvlink", "all GPUs", "ok", f"{count_of(healthy, 'GPU')} with every NVLink up")
        )
    return found


def _short(
    where: str, towards: str, up: list, expected: int, generation: int | None
) -> Finding | None:
    """A finding when fewer than ``expected`` ports are up, or they run below ``generation``."""
    if len(up) < expected:
        return Finding(
            "nvlink",
            where,
            "problem",
            f"{len(up)} of {expected} NVLinks to {towards} are up (the topology has {expected})"
            ": a link is down; 'nvidia-smi nvlink -s' shows which, "
            + (
                "a GPU reset may bring it back (else check the board and the fabric manager)"
                if towards == "NVSwitch"
                else "a GPU reset or a reseat of the bridge may bring it back"
            ),
        )
    slow = sorted({p.generation for p in up if p.generation is not None})
    if generation is not None and slow and slow[0] < generation:
        return Finding(
            "nvlink",
            where,
            "problem",
            f"NVLinks to {towards} run at generation {slow[0]}, below their class "
            f"(NVLink {generation})",
        )
    return None


# ---- PCIe ------------------------------------------------------------------------------------


def _pcie_findings(links: LinksNow) -> list[Finding]:
    found: list[Finding] = []
    full: list[int] = []
    for gpu, state in sorted(links.gpus.items()):
        width, widest = state.pcie_width, state.pcie_width_max
        if width is not None and widest is not None and width < widest:
            found.append(
                Finding(
                    "pcie",
                    f"GPU {gpu}",
                    "problem",
                    f"PCIe link at x{width}, below its x{widest}: half the host bandwidth or "
                    "less (check the card's seating, the slot and any riser)",
                )
            )
        elif width is not None:
            full.append(gpu)
        note = _generation_note(state)
        found += [Finding("pcie", f"GPU {gpu}", "note", note)] if note else []
    if full:
        found.append(
            Finding(
                "pcie", "all GPUs", "ok", f"{count_of(len(full), 'GPU')} at their full PCIe width"
            )
        )
    return found


def _generation_note(state: GpuLinks) -> str | None:
    now, best = state.pcie_generation, state.pcie_generation_max
    if now is None or best is None or now >= best:
        return None
    return (
        f"PCIe generation {now} of {best} now: idle GPUs lower it to save power; run doctor "
        "while the GPU is busy to check it"
    )


# ---- peer-to-peer ----------------------------------------------------------------------------


def _p2p_findings(links: LinksNow, leases: Iterable[Lease]) -> list[Finding]:
    found: list[Finding] = []
    leased: set[tuple[int, int]] = set()
    for lease in leases:
        gpus = sorted(lease.indices)
        pairs = [(a, b) for i, a in enumerate(gpus) for b in gpus[i + 1 :]]
        for pair in pairs:
            leased.add(pair)
            found += _pair_findings(pair, links, f"lease {lease.id} ({lease.user})")
    others = sorted(pair for pair, code in links.p2p.items() if code != "OK" and pair not in leased)
    if others:
        codes = sorted({links.p2p[pair] for pair in others})
        found.append(
            Finding(
                "p2p",
                "host",
                "note",
                f"peer-to-peer is off between {count_of(len(others), 'GPU pair')} no lease holds "
                f"({', '.join(f'{c}: {P2P_MEANING[c]}' for c in codes)}): jobs spanning them "
                "copy through host memory",
            )
        )
    working = [p for p, code in links.p2p.items() if code == "OK"]
    if working:
        found.append(
            Finding(
                "p2p",
                "host",
                "ok",
                f"peer-to-peer works between {count_of(len(working), 'GPU pair')}",
            )
        )
    return found


def _pair_findings(pair: tuple[int, int], links: LinksNow, holder: str) -> list[Finding]:
    a, b = pair
    found = []
    code = links.p2p.get(pair)
    if code is not None and code != "OK":
        found.append(
            Finding(
                "p2p",
                f"GPU {a},{b}",
                "problem",
                f"{holder}: peer-to-peer between GPU {a} and {b} is off ({code}: "
                f"{P2P_MEANING[code]}); NCCL copies through host memory",
            )
        )
    over_nvlink = links.p2p_nvlink.get(pair)
    if over_nvlink is not None and over_nvlink != "OK" and code == "OK":
        found.append(
            Finding(
                "p2p",
                f"GPU {a},{b}",
                "problem",
                f"{holder}: GPU {a} and {b} are NVLink peers but peer-to-peer over NVLink is "
                f"off ({over_nvlink}: {P2P_MEANING[over_nvlink]}); traffic goes over PCIe",
            )
        )
    return found
