"""Sets of GPUs, where the order does not count: the candidate sets, DRB's utility and the exact
search for the best set (DRB: Amaral et al., SC'17, seed 000).

- :mod:`.candidates`: every k-set of the free GPUs that holds the required ones, in
  lexicographic order, the order every policy's tie-break relies on;
- :mod:`.utility`: DRB's utility of a set (section 4.4, Eq. 2-5, on the paper's scale:
  communication cost over the physical graph of section 4.1.2, interference, fragmentation),
  which is ``drb``'s objective, gives ``pack`` its cost ``t`` (Eq. 3), and is reported with
  every placement for a job's minimum utility (TOPO-AWARE-P, section 4.4);
- :mod:`.search`: :class:`~.search.SetSearch`, a branch and bound over classes of twin GPUs
  (Land and Doig's, for min-sum k-subsets), which evaluates Algorithm 3's choice exactly instead
  of one task at a time.

What it proves: the set search returns the lexicographically first set of the best key, the
set that scoring every candidate set in order and keeping the first strict improvement returns
(``tests/test_set_search.py``: ``pack``, ``drb`` and the cheapest set ``t_min`` against that
brute force on meshes without twins and PCIe hosts full of them, with running jobs, required
and excluded GPUs; ``tests/test_placement_papers.py``: the utility is on the paper's scale).
"""
