"""Where a job that shares a GPU goes (``run --share``): the GPUs it may share, and the rule
that picks one.

- :mod:`.candidates`: the GPUs a shared job could go to (a ``--shareable`` lease's, one only
  shared jobs use, or a free one, under the host's limit of shared jobs per GPU), with the
  memory and the part of the GPU still left;
- :mod:`.rules`: the share placement rules behind one registry (the system config's
  ``share.placement``): ``fgd``, the default, ``best-fit`` (DeepPool's placement of background
  jobs, seed 004, section 3), ``first-fit`` and ``spread``;
- :mod:`.fragmentation`: Fragmentation Gradient Descent (Weng et al., "Beware of Fragmentation:
  Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC'23,
  sections 4.1-4.3): the free capacity each task type of the workload cannot use, weighed by its
  share, and where a task makes that grow least;
- :mod:`.fit`: the choice itself, and why none fits: a job that could never fit the host is
  refused at once, one that could later is told who holds what.

What it proves: a shared job lands only on a GPU with its declared memory free and its part of
the GPU not held by other shared jobs, at most the limit of shared jobs on it, the one the
host's rule ranks first (``tests/test_shared_gpus.py``, ``tests/test_shared_gpu_fractions.py``;
``tests/test_placement_rules.py`` for the rules' registry and the host read through
:class:`~gpualloc.model.occupancy_view.OccupancyView` alone).
"""
