"""The placement engine: where a job's GPUs go, on a :class:`~gpualloc.model.Topology` and a
view of what is free (no ledger, no discovery, no exec: house style, ``placement/``).

The front door and the decision, at the top:

- :mod:`.choose`: the front door, one :func:`~.choose.choose` for every caller (``run``,
  ``alloc``, ``plan``, the queue, the broker, the Slurm prolog, the simulator): a MIG device, a
  place on a shared GPU, the GPUs named, or the policy's choice, each held to the job's
  thresholds (DRB, Amaral et al. SC'17, section 4.4: TOPO-AWARE-P's postponement);
- :mod:`.want` what a job asks for, built from :mod:`.options` (the job's options as one struct);
- :mod:`.decide` a whole-GPU decision (``plan``, ``--compare``, ``--explain``) on a
  :class:`~.context.DecisionContext` (:mod:`.context`: the request checked once, the host's
  matrices, the scores every policy reports), :mod:`.explain` the runner-ups, :mod:`.greedy`
  the answer when the time budget (:mod:`.deadline`) runs out, :mod:`.ties` gpualloc's one tie
  rule among the placements a policy's objective rates equal.

The rooms, each named for its algorithm and saying in its docstring what it proves:

- :mod:`.policies`: the :class:`~.policies.policy.Policy` interface, the registry of names, one
  module per policy;
- :mod:`.mapa`: MAPA's pattern scoring and the exact order search that replaces its listing of
  every match (Ranganath et al. SC'21);
- :mod:`.sets`: the candidate sets, DRB's utility and the exact search for the best set (Amaral
  et al. SC'17);
- :mod:`.besteffort`: go-gpuallocator's best-effort partition, found without listing every
  partition;
- :mod:`.sharing`: where a job that shares a GPU goes (FGD, Weng et al. ATC'23; DeepPool's best
  fit);
- :mod:`.mig`: which MIG device a job gets, and where a new GPU instance should be created.

Below every room, three small modules they share: :mod:`.host_graph` (the host as dense lists
and bitmasks), :mod:`.deadline` (a decision's time budget) and :mod:`.rule_lookup` (a rule
found by name). Imports go one way, front door -> policies -> the algorithms' rooms -> those
three; ``tests/test_architecture.py`` holds each room to the rooms it may import.

No package here imports anything: a module loads what it uses and no more (house style, habit
9: start-up is a feature).
"""
