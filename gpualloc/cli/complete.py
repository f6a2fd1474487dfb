"""Values for shell completion: policy names, bundled topologies, lease ids, option choices.

The completion scripts are static (:mod:`gpualloc.cli.completion_scripts` calls these functions
when ``scripts/build_docs.py`` writes them), except for the lease ids, which a Tab asks of
gpualloc: so this module imports nothing heavy at its top (no parser, networkx, NVML or psutil;
a test checks it), and lease ids come from the ledger files read as plain JSON without taking
their lock. Each function returns ``(value, help)`` pairs, which zsh and fish show beside the
value. Every option whose value is one of a fixed set names its function here as its
``completion`` (:class:`gpualloc.cli.declare.Opt`); a test walks every option of every
command and fails on one that has neither, is not a path, and is not known as free text.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

PATTERNS = (
    ("ring", "NCCL's ring collectives"),
    ("all", "all-to-all"),
    ("tree", "a binary tree"),
    ("star", "one rank talks to every other"),
)
NUMA_MODES = (
    ("auto", "bind when this is the host and numactl works"),
    ("bind", "bind, or fail"),
    ("none", "no binding"),
)
SCORES = (
    ("auto", "MAPA Table 2 on DGX-1-like links and 2-5 edges, else the bottleneck"),
    ("mapa", "MAPA Table 2 for 2-5 edges, else the bottleneck"),
    ("bottleneck", "the slowest link of the pattern"),
)
PRIORITIES = (("high", ""), ("normal", ""), ("low", ""))
SHELLS = (("bash", ""), ("zsh", ""), ("fish", ""))

MIG_PROFILES = (
    ("1g.5gb", "A100 40GB"), ("1g.10gb", "A100 40GB, A100/H100 80GB"), ("2g.10gb", "A100 40GB"),
    ("3g.20gb", "A100 40GB"), ("4g.20gb", "A100 40GB"), ("7g.40gb", "A100 40GB"),
    ("1g.20gb", "A100/H100 80GB"), ("2g.20gb", "A100/H100 80GB"), ("3g.40gb", "A100/H100 80GB"),
    ("4g.40gb", "A100/H100 80GB"), ("7g.80gb", "A100/H100 80GB"),
    ("1g.6gb", "A30"), ("2g.12gb", "A30"), ("4g.24gb", "A30"),
    ("1g.18gb", "H200"), ("1g.35gb", "H200"), ("2g.35gb", "H200"), ("3g.71gb", "H200"),
    ("4g.71gb", "H200"), ("7g.141gb", "H200"),
)  # fmt: skip
"""The MIG profiles of NVIDIA's data-centre GPUs (its MIG user guide); ``gpualloc topo show``
lists the devices a host has. A device label (GPU0/MIG3) or a MIG- UUID is typed by hand."""


def _matching(
    pairs: tuple[tuple[str, str], ...] | list[tuple[str, str]], incomplete: str
) -> list[tuple[str, str]]:
    return [(value, about) for value, about in pairs if value.startswith(incomplete)]


def patterns(incomplete: str) -> list[tuple[str, str]]:
    return _matching(PATTERNS, incomplete)


def numa_modes(incomplete: str) -> list[tuple[str, str]]:
    return _matching(NUMA_MODES, incomplete)


def scores(incomplete: str) -> list[tuple[str, str]]:
    return _matching(SCORES, incomplete)


def priorities(incomplete: str) -> list[tuple[str, str]]:
    return _matching(PRIORITIES, incomplete)


def graph_formats(incomplete: str) -> list[tuple[str, str]]:
    return _matching(
        [("graphml", "yEd, Cytoscape, Gephi"), ("gexf", "Gephi"), ("json", "node-link, d3")],
        incomplete,
    )


def shells(incomplete: str) -> list[tuple[str, str]]:
    return _matching(SHELLS, incomplete)


def alloc_formats(incomplete: str) -> list[tuple[str, str]]:
    from gpualloc.cli.open_ledger import ALLOC_FORMATS

    return _matching(ALLOC_FORMATS, incomplete)


def queue_rules(incomplete: str) -> list[tuple[str, str]]:
    from gpualloc.simulate.engine import QUEUES

    about = {"fifo": "no job passes another", "backfill": "a job may pass one that cannot start"}
    return _matching([(name, about.get(name, "")) for name in QUEUES], incomplete)


def runtime_models(incomplete: str) -> list[tuple[str, str]]:
    from gpualloc.simulate.runtime import RUNTIMES

    return _matching([(name, "") for name in RUNTIMES], incomplete)


def share_placements(incomplete: str) -> list[tuple[str, str]]:
    from gpualloc.placement.sharing.rules import share_policies

    return _matching([(rule.name, rule.description) for rule in share_policies()], incomplete)


def generators(incomplete: str) -> list[tuple[str, str]]:
    """The workloads of ``simulate --generate`` (their settings follow a colon)."""
    from gpualloc.simulate.generate import DEFAULTS

    return _matching([(name, "") for name in DEFAULTS], incomplete)


def mig_profiles(incomplete: str) -> list[tuple[str, str]]:
    return _matching(MIG_PROFILES, incomplete)


def policies(incomplete: str) -> list[tuple[str, str]]:
    from gpualloc.placement.policies.registry import DEFAULT_POLICY, policy_names

    return _matching(
        [(name, "the default" if name == DEFAULT_POLICY else "") for name in policy_names()],
        incomplete,
    )


def topologies(incomplete: str) -> list[tuple[str, str]]:
    """Bundled topology names (a path is left to the shell's file completion)."""
    if "/" in incomplete:
        return []
    directory = Path(__file__).resolve().parent.parent / "topologies"
    names = sorted(path.stem for path in directory.glob("*.json"))
    return _matching([(name, "bundled") for name in names], incomplete)


COMPLETION_BROKER_S = 1.0
"""How long a Tab waits for the broker's answer naming its ledger: a stuck broker must not hang
the user's shell for the commands' own deadline. A broker whose socket is missing or refuses
the connection is not waited for at all (the commands wait for one restarting)."""
_WORD = re.compile(r"[\w.,+=@%-]+")
"""A name offered on Tab: one word every shell's completion takes as it is (no space, quote,
``$``, glob or ``:``, which zsh's descriptions split on)."""


def lease_ids(incomplete: str) -> list[tuple[str, str]]:
    """What ``release`` takes, for Tab: the ids of the caller's leases (everyone's for root,
    who may release any) and the names that name one of them alone, with what each holds;
    from every ledger of the state directory and, on a host with a broker, the broker's."""
    import os

    from gpualloc.config import Config
    from gpualloc.errors import ConfigError

    try:
        config = Config.load()
        directory = Path(config.value("state_dir"))
        broker = config.value("host.broker")
    except ConfigError:
        return []
    paths = [p for p in sorted(directory.glob("ledger*.json")) if not p.name.endswith(".good.json")]
    paths += _broker_ledger(broker)
    uid = os.geteuid()
    ids: dict[str, str] = {}
    names: dict[str, list[str]] = {}
    for path in paths:
        for lease in _leases(path):
            if uid != 0 and lease.get("uid") != uid:
                continue
            try:
                gpus = ",".join(str(gpu["index"]) for gpu in lease["gpus"])
                lease_id, name = str(lease["id"]), lease.get("name")
            except (KeyError, TypeError):
                continue
            ids[lease_id] = f"GPU {gpus}, {lease.get('user', '?')}" + (
                f" ({name})" if isinstance(name, str) else ""
            )
            if isinstance(name, str) and _WORD.fullmatch(name):
                names.setdefault(name, []).append(lease_id)
    offered = sorted(ids.items())
    offered += sorted(
        (name, f"lease {found[0]}")
        for name, found in names.items()
        if len(set(found)) == 1 and name not in ids  # an ambiguous name is refused
    )
    return _matching(offered, incomplete)


def _leases(path: Path) -> list:
    """The leases of the ledger file ``path`` as plain JSON, or none (read without its lock,
    and without blocking: a FIFO planted as a ledger must not hang the user's shell)."""
    from gpualloc.errors import GpuallocError
    from gpualloc.ledger.shared_files import read_shared

    try:
        leases = json.loads(read_shared(path)[0]).get("leases", [])
    except (OSError, ValueError, AttributeError, GpuallocError):
        return []
    return (
        [lease for lease in leases if isinstance(lease, dict)] if isinstance(leases, list) else []
    )


def _broker_ledger(configured: Path | None) -> list[Path]:
    """The broker's ledger file, which every user may read, as its broker names it; none on a
    host without a broker or when it does not answer within :data:`COMPLETION_BROKER_S`."""
    from gpualloc.errors import GpuallocError
    from gpualloc.wire.address import broker_socket

    socket = broker_socket(configured)
    if socket is None:
        return []
    from gpualloc.wire.client import BrokerClient

    client = BrokerClient(socket, reconnect_s=0.0, answer_s=COMPLETION_BROKER_S)
    try:
        with client:
            ledger = client.call("hello", retry=False).get("ledger")
    except (OSError, GpuallocError, AttributeError):
        return []
    return [Path(ledger)] if isinstance(ledger, str) else []
