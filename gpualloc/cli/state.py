"""Global options of the current invocation, and the topology they select."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpualloc.config import Config
    from gpualloc.model.bandwidth import BandwidthTable
    from gpualloc.model.topology import Topology


@dataclass
class GlobalState:
    topology: str | None = None
    bandwidth_table: Path | None = None
    refresh: bool = False
    debug: bool = False
    _config: Config | None = None

    def reset(self) -> None:
        """Back to the defaults (tests run several invocations in one process)."""
        self.__init__()  # type: ignore[misc]

    def config(self) -> Config:
        """The configuration files and environment of this invocation (read once)."""
        if self._config is None:
            from gpualloc.config import Config

            self._config = Config.load()
        return self._config

    def setting(self, key: str, flag: object = None) -> Any:
        """A flag's value when given, else the configured default (see :mod:`gpualloc.config`)."""
        return self.config().value(key, flag)

    def bandwidth_override(self) -> BandwidthTable | None:
        """The table of --bandwidth-table / GPUALLOC_BANDWIDTH_TABLE / config.toml, or None for
        the built-in one."""
        return self.config().bandwidth_table(self.bandwidth_table)

    def load_topology(self) -> Topology:
        """The topology named by --topology / $GPUALLOC_TOPOLOGY, else this host's."""
        from gpualloc.discovery.resolve import resolve_topology

        return resolve_topology(
            self.topology, refresh=self.refresh, table=self.bandwidth_override()
        )


STATE = GlobalState()
