"""Side-by-side benchmarks: per-call overhead and throughput, near the round-trip floor.

Run ``python -m benchmarks`` (full run, writes ``benchmarks/results/latest.{md,json}``) or
``python -m benchmarks --quick`` (under a minute, for the CI smoke test). The runner starts
its own ``redis-server`` on a free loopback port, pins it and the client with CPU affinity
(same vCPU and different vCPUs), runs every latency case interleaved in shuffled rounds in
one run, and reports medians, p90 and ratios against ``r.ping()`` from the same rounds.

Speed is measured here, never asserted in tests: the smoke test checks only that the run
completes and that execution counts are right.
"""
