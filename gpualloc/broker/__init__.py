"""One owner for a shared host's ledger: ``gpualloc serve`` and its clients.

A ledger file every user can write cannot be trusted by any of them: whoever can write it can
delete another user's live lease, plant a directory where root's prolog writes, or hold its
lock forever. So on a host shared by many Unix users, one privileged process owns the state
directory and every change goes through it, the way slurmd, kubelet, dockerd and
nvidia-persistenced do it. The kernel says who is asking (``SO_PEERCRED`` on a Unix socket);
no request names its own user.

- :mod:`gpualloc.wire`: what both ends speak: the wire format (one JSON object per line,
  versioned) and its limits, where the broker listens, and the client.
- :mod:`.peers`: who a peer is, and whether a pid is theirs.
- :mod:`.watch`: the processes each lease lives with (pidfd, ``/proc``), watched by the broker.
- :mod:`.fair_share`: how much each user has had lately (decaying GPU-seconds).
- :mod:`.requests`: what a client may send, checked as if hostile.
- :mod:`.service`: what each request does to the ledger.
- :mod:`.slurm_requests`: root's Prolog and Epilog. The client side is
  :mod:`gpualloc.host.brokered` (the models) and :mod:`gpualloc.launcher.verify_brokered`
  (``run``'s verifier through the broker).
- :mod:`.server`: the socket loop, its limits, and the queue's turns.

The embedded file ledger stays the default for one user (and for tests, CI and ``--topology``
trials); the broker is used when its socket exists or the configuration names it.
"""
