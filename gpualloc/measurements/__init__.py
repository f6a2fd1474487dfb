"""Recorded outputs of the bandwidth benchmarks users already run, read into one shape.

``nvbandwidth`` (text and ``-j`` JSON), CUDA samples' ``p2pBandwidthLatencyTest`` and
``nccl-tests`` (``all_reduce_perf`` and the other collectives) are recognised by their content
(:mod:`.recognise`), each by a module of its own, into a :class:`.records.Recording`: the
pairwise matrices (copy bandwidth, latency, P2P connectivity; host links kept apart) and the
collective runs with the GPUs they ran on. What placement needs from a recording, one GB/s
figure per GPU pair, is chosen by :func:`.recognise.pairwise_copy`, which says which matrix it
took.
"""
