"""The whole-GPU placement policies: one interface, one registry of names, one module each.

- :mod:`.policy`: :class:`~.policy.Policy`, which turns a
  :class:`~gpualloc.placement.context.DecisionContext` into a placement; a set objective's
  lexicographically first best set, ordered for the job's pattern, then gpualloc's tie rule
  (:mod:`gpualloc.placement.ties`), except in the policies that reproduce another tool;
- :mod:`.registry`: the names the command line, the configuration, the simulator and the tests
  share, each policy imported when first asked for;
- :mod:`.mapa` (MAPA Preserve, Ranganath et al. SC'21, section 3.5.2, Algorithm 1) and
  :mod:`.mapa_greedy` (MAPA's Greedy, section 4), on the order search of
  :mod:`gpualloc.placement.mapa`;
- :mod:`.drb` (Amaral et al. SC'17, section 4.4, Algorithms 2 and 3 with Eq. 2-5) and
  :mod:`.pack` (the same paper's best fit, sections 3.2 and 5.2), on the set search of
  :mod:`gpualloc.placement.sets`; :mod:`.spread` (section 3.2), by socket counts;
- :mod:`.besteffort`: NVIDIA go-gpuallocator's best-effort policy, as the Kubernetes device
  plugin runs it, on the partition search of :mod:`gpualloc.placement.besteffort`;
- :mod:`.slurm_cons_tres` (Slurm's ``cons_tres`` for one node) and :mod:`.baseline` (the lowest
  free indices, MAPA section 4's Baseline).

What they prove: each policy returns the true optimum of its own objective under its documented
tie-break: ``tests/test_placement_optimality.py`` compares every policy with a brute force over
every candidate set (and, for a pattern's objective, every order) on the bundled hosts, and
``besteffort`` with go-gpuallocator's own enumeration; ``tests/test_placement_papers.py`` checks
the papers' figures (MAPA Fig. 4 and Table 2, the Kubernetes GPU-topology proposal's 48.33 GB/s
bottleneck, DRB's utility scale) and Slurm's verified choice.
"""
