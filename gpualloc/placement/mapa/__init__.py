"""MAPA's pattern scoring and the exact order search that replaces its enumeration of matches
(Ranganath et al., "MAPA: Multi-Accelerator Pattern Allocation Policy for Multi-Tenant GPU
Servers", SC'21, seed 003).

MAPA matches a job's communication pattern (section 3.1, Fig. 8: :mod:`.patterns`) into the
host's link graph by subgraph matching (section 3.3), scores every match (section 3.4: the
aggregated bandwidth, Eq. 1, and the predicted effective bandwidth, Eq. 2 with Table 2;
:mod:`.scores`, with the preserved bandwidth of section 3.5.1, Eq. 3, and the bottleneck
bandwidth of the Kubernetes GPU-topology proposal, seed 001, "Pick GPUs of Node") and keeps the
best. Every match is every order of every candidate set (k! orders of each: half a billion for 8
of 16 GPUs). This room finds the best one without listing them:

- :mod:`.objectives`: the edge objectives the search maximises, and :func:`~.objectives.
  evaluate_order`, the one-placement scorer the tests hold the search to;
- :mod:`.search`: the search (:class:`~.search.PlacementSearch`): pairs of GPUs fall into a few
  link classes (:mod:`.link_classes`), every objective is a function of how many of the
  pattern's edges land in each, so count vectors are tried best first and the first that some
  order realises is optimal;
- :mod:`.search_bounds`, :mod:`.pattern_graphs`, :mod:`.treebound` and :mod:`.set_capacity`:
  the necessary conditions that refute a vector or cut a branch without listing orders
  (capacities from components, degrees, parity and paths; a subtree bound for tree patterns,
  tightened with Lagrangian penalties as Held and Karp did for the travelling salesman);
- :mod:`.realise`: the depth-first realisation of one vector (a dynamic program over subsets
  on a ring, Held and Karp's); :mod:`.symmetry`: the host's link-preserving permutations, so
  one set per orbit is searched; :mod:`.all_pairs`: all-to-all, where a set's pairs alone count;
- :mod:`.exact`: what the rest of gpualloc asks of it: the best ordered placement of a pattern,
  the best among a family of sets, the best order of a set another objective chose.

What it proves: the placement returned has the highest key of its objective over every
candidate set and every order, ties to the lowest sorted set and then the lowest order, which is
MAPA's enumeration's answer (``tests/test_placement_optimality.py`` compares it with a brute
force on the bundled hosts). Each bound is never below what a real placement carries
(``tests/test_search_bounds.py``, ``test_tree_bound.py``, ``test_lagrangian.py``,
``test_placement_speed_sets.py``), and searching one set per orbit loses no answer
(``tests/test_symmetry.py``). The problems are NP-hard (a ring is a travelling-salesman tour),
so the worst case stays exponential: a decision runs under :mod:`gpualloc.placement.deadline`.

No policy lives here: ``mapa`` and ``mapa-greedy`` (:mod:`gpualloc.placement.policies`) call
this room, as do the set policies (to order the set they chose) and the Slurm prolog (a job's
ring order).
"""
