"""Global options of the current invocation, and the topology they select."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

    from gpualloc.config import Config
    from gpualloc.model.bandwidth import BandwidthTable
    from gpualloc.model.topology import Topology


class GlobalState:
    """A plain class, not a msgspec Struct: ``--help`` and completion load this module, and
    import no msgspec (tests/test_cli_help.py::test_help_imports_nothing_heavy)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Back to the defaults (tests run several invocations in one process)."""
        self.topology: str | None = None
        self.bandwidth_table: Path | None = None
        self.refresh = False
        self.debug = False
        self._config: Config | None = None
        self._topology: tuple[tuple[object, ...], Topology] | None = None

    def apply_global_options(
        self,
        *,
        topology: str | None = None,
        bandwidth_table: Path | None = None,
        refresh: bool = False,
        debug: bool = False,
    ) -> None:
        """The options before the command, as :func:`gpualloc.cli.main.run` read them."""
        from gpualloc.user_files import names_a_file, why_not_a_file

        if topology is not None and not topology.strip():  # given so: an empty variable is
            from gpualloc.errors import RequestError  # read as none at all (parser.py)

            raise RequestError(
                "--topology is empty",
                hint="name a bundled topology (gpualloc topo list) or a file; leave the option "
                "out for $GPUALLOC_TOPOLOGY, else this host's GPUs",
            )
        if bandwidth_table is not None and not names_a_file(bandwidth_table):
            raise why_not_a_file(bandwidth_table, "bandwidth table")
        self.topology = topology
        self.bandwidth_table = bandwidth_table
        self.refresh = refresh
        self.debug = debug or self.debug
        self.config()  # every setting read and checked before the command does anything

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
        from gpualloc.discovery.resolve import configured_bandwidth_table

        return configured_bandwidth_table(self.config(), self.bandwidth_table)

    def topology_file(self) -> Path | None:
        """The topology file --topology / $GPUALLOC_TOPOLOGY names, when it names one (not a
        bundled topology, not this host): what a watcher reads again for its processes."""
        import os

        from gpualloc.discovery.resolve import TOPOLOGY_ENV
        from gpualloc.topologies import bundled_names
        from gpualloc.user_files import expand_user, names_a_file

        spec = self.topology or os.environ.get(TOPOLOGY_ENV)
        if not spec or spec in bundled_names():
            return None
        path = expand_user(spec).resolve()  # loaded from it already: the user exists
        return path if names_a_file(path) else None

    def input_files(self) -> list[Path]:
        """The files every command may read through the global options: the topology file and
        the bandwidth table (the flag's, the variable's or a config file's), which no output
        may overwrite (:func:`gpualloc.user_files.refuse_overwriting_inputs`)."""
        from pathlib import Path

        table = self.config().value("bandwidth_table", self.bandwidth_table)
        named = [self.topology_file(), table if isinstance(table, (str, Path)) else None]
        return [Path(path) for path in named if path is not None]

    def load_topology(self) -> Topology:
        """The topology named by --topology / $GPUALLOC_TOPOLOGY, else this host's: read once
        an invocation (``run`` asks whether it is this host's before it opens its ledger)."""
        import os

        from gpualloc.discovery.resolve import TOPOLOGY_ENV, resolve_topology

        key = (self.topology, os.environ.get(TOPOLOGY_ENV), self.refresh, self.bandwidth_table)
        if self._topology is None or self._topology[0] != key:
            topology = resolve_topology(
                self.topology, refresh=self.refresh, table=self.bandwidth_override()
            )
            self._topology = (key, topology)
        return self._topology[1]


STATE = GlobalState()
