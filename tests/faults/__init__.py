"""The fault campaign (issue 6): killed and paused workers, lost replies, Redis restarts,
Cluster and Sentinel failovers, a store that is down, load, and hostile input.

``python -m pytest tests/faults`` runs the CI subset (small figures, a few minutes);
``python -m tests.faults`` (or ``python -m pytest tests/faults --campaign``) runs the long
version and writes the figures table to ``tests/faults/RESULTS.md``.
"""
