"""Global options of the current invocation, and the topology they select."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpualloc.model.bandwidth import BandwidthTable
    from gpualloc.model.topology import Topology


@dataclass
class GlobalState:
    topology: str | None = None
    bandwidth_table: Path | None = None
    refresh: bool = False
    debug: bool = False

    def reset(self) -> None:
        """Back to the defaults (tests run several invocations in one process)."""
        self.__init__()  # type: ignore[misc]

    def bandwidth_override(self) -> BandwidthTable | None:
        """The table given with --bandwidth-table, or None for the built-in one."""
        from gpualloc.model.bandwidth import load_bandwidth_table

        return load_bandwidth_table(self.bandwidth_table) if self.bandwidth_table else None

    def load_topology(self) -> Topology:
        """The topology named by --topology / $GPUALLOC_TOPOLOGY, else this host's."""
        from gpualloc.discovery.resolve import resolve_topology

        return resolve_topology(
            self.topology, refresh=self.refresh, table=self.bandwidth_override()
        )


STATE = GlobalState()
