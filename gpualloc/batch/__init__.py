"""Batch jobs: ``gpualloc submit`` and what follows it (``jobs``, ``log``, ``cancel``, ``show``).

A submitted job is run by its **supervisor**, a process of the submitting user that the client
starts detached from the terminal (its own session, SIGHUP ignored) and then leaves
(:mod:`.spawn`). The supervisor waits in the host's queue as ``run --wait`` does, holds the
lease, forks the job with ``run``'s environment, binding and verification, writes its output
to the job's log and records how it ended (:mod:`.supervisor`). No root process runs user
code and no process changes uid: through a broker the broker only places, watches and, at a
time limit, signals.

Each job has a directory of its user's (:mod:`.record`): ``job.json``, the record the
supervisor keeps, and the log, which only the user's own processes read (``gpualloc log`` is
the client; the broker never opens it). The job's id is its lease's id, so root and the
broker find a job in the ledger by the id its user sees.
"""
