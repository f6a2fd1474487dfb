"""Discovery: build a Topology from NVML, nvidia-smi, numactl/sysfs, or recorded files.

``nvml.py`` is the only importer of pynvml; the text parsers are pure; ``resolve.py`` decides
which source a command uses.
"""
