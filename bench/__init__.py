"""jailbox benchmarks: each figure side by side with a baseline, measured interleaved in one run.

Run ``python -m bench`` from the repository root (``--quick`` for a smoke run, ``--json PATH`` to keep
the numbers). p50 and p99, never means: one slow run must not move a figure, and the tail is shown.
"""
