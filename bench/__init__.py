"""jailbox benchmarks: each figure side by side with a baseline, measured interleaved in one run.

Run ``python -m bench`` from the repository root (``--quick`` for a smoke run, ``--json PATH`` to keep
the numbers). Medians and deciles, never means: one slow run must not move a figure.
"""
