"""MIG: which existing MIG device a job gets, and where a new GPU instance should be created.

- :mod:`.fit`: among the free MIG devices that satisfy a request (a profile, a device, or a
  memory size), the smallest, on the GPU whose MIG devices are most in use, then the lowest
  indices; one device a job, as a CUDA process uses one (NVIDIA MIG User Guide, "CUDA Device
  Enumeration");
- :mod:`.slots`: where a new instance fragments the free slices least: FGD (Weng et al., USENIX
  ATC'23, sections 4.1-4.3) on NVIDIA's slice placement rules (:mod:`gpualloc.model.mig_slices`,
  ``nvidia-smi mig -lgipp``) instead of fractions of a GPU;
- :mod:`.rules`: the MIG creation rules behind one registry (``fgd``, ``best-fit``,
  ``first-fit``), as the whole-GPU policies and the share rules are.

What it proves: a new instance is only ever proposed where NVIDIA's rules let it start (the
rules checked against real recorded layouts and the bundled MIG hosts), and under ``fgd`` where
the expected fragmentation of the free slices grows least: on an empty H100 a 3g at slice 4,
which leaves slice 0 to a 4g, where ``first-fit`` takes slice 0 (``tests/test_mig_slots.py``;
``tests/test_mig_leases.py`` for MIG leases end to end).
"""
