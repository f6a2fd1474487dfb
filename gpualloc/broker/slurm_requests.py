"""Root's Slurm Prolog and Epilog through the broker.

The hooks send the job's Slurm variables; the broker records or releases the job's lease in
its own transaction (:mod:`gpualloc.host.slurm_hooks`), so nothing a user does to a state directory
can make a Prolog skip a job: the broker's directory is its own, and its lock no user can open.
Only root may send these (the server checks the peer).
"""

from __future__ import annotations

from typing import Any

from gpualloc.errors import RequestError
from gpualloc.host.local import LocalHost

SLURM_VARIABLES = ("SLURM_JOB_ID", "SLURM_JOB_GPUS", "SLURM_JOB_UID", "SLURM_JOB_USER")
MAX_VALUE_CHARS = 4096


def slurm_request(host: LocalHost, args: dict[str, Any]) -> dict[str, Any]:
    """``{"hook": "prolog"|"epilog", "env": {SLURM_*: text}}`` -> the hook's log lines."""
    from gpualloc.host.slurm_hooks import epilog, prolog

    hook, env = args.get("hook"), args.get("env")
    if hook not in ("prolog", "epilog") or not isinstance(env, dict):
        raise RequestError("a Slurm request names hook prolog or epilog, and env")
    values = {}
    for name in SLURM_VARIABLES:
        value = env.get(name)
        if value is None:
            continue
        if not isinstance(value, str) or len(value) > MAX_VALUE_CHARS:
            raise RequestError(f"{name} must be a short text")
        values[name] = value
    return {"lines": (prolog if hook == "prolog" else epilog)(host, values)}
