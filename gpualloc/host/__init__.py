"""The application layer: one front door to a host's GPUs and ledger.

- :mod:`.protocol`: :class:`~.protocol.Host`, what every caller asks (allocate, with or without
  waiting; confirm, release, evict, collect garbage, snapshot).
- :mod:`.open`: the one place that decides which host a request is on.
- :mod:`.local`: the embedded ledger, changed in this process under ``flock``.
- :mod:`.brokered`: the broker's ledger, changed by ``gpualloc serve``.
- :mod:`.view`: what both hold alike (topology, processes, faults, share settings).
- :mod:`.terms`: a lease's terms and the results a host answers with.
- :mod:`.queue`, :mod:`.queue_policy`, :mod:`.wait`: the host queue's rule, its configured
  policy, and the waiting loop of the embedded ledger.
- :mod:`.eviction`: marking shared jobs for eviction.
- :mod:`.slurm_hooks`: Slurm's Prolog and Epilog, recording its jobs' GPUs in the ledger.

The command line (:mod:`gpualloc.cli`), the Python API (:mod:`gpualloc.api`) and the broker
(:mod:`gpualloc.broker.service`) are adapters over it; :mod:`gpualloc.launcher` binds and execs
the job once a host has answered.
"""
