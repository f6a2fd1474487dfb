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
