"""Programs the tests run as jobs under gpualloc (``python SCRIPT ARGS``, written to a file)."""

from __future__ import annotations

DECLARE = """\
import json, os, sys
path = sys.argv[1]
data = json.load(open(path))
data["processes"] = [{"gpu": int(g), "pid": os.getpid(), "name": "job"} for g in sys.argv[2:]]
json.dump(data, open(path + ".new", "w"))
os.replace(path + ".new", path)
print(os.getpid(), flush=True)
sys.stdin.read()
"""
"""A job that declares itself (in the topology file the host is read from) on the GPUs named
by its arguments, as NVML would list it there, and then waits."""

REPORT = """\
import json, os, sys
print(json.dumps({
    "pid": os.getpid(),
    "env": {k: v for k, v in os.environ.items() if k.startswith(("CUDA_", "GPUALLOC_"))},
    "affinity": sorted(os.sched_getaffinity(0)),
}), flush=True)
if "--wait" in sys.argv:
    sys.stdin.read()
"""
"""A job that prints, as one JSON line, its pid, its ``CUDA_*`` and ``GPUALLOC_*`` variables and
the CPUs it may run on; with ``--wait`` it then waits for its stdin to close."""
