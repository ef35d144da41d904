"""Interleaved timing: every contender runs once per repetition, so drift and noise hit all alike."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

Thunk = Callable[[], dict[str, float]]


@dataclass(frozen=True)
class Summary:
    """Median (p50), deciles and p99: the median is robust to the odd slow run that a mean would
    smear over the figure, and p99 shows the tail a user meets once in a hundred calls."""

    median: float
    p10: float | None
    p90: float | None
    p99: float
    n: int

    @classmethod
    def of(cls, samples: Sequence[float]) -> Summary:
        if not samples:
            raise ValueError("no samples to summarise")
        if len(samples) == 1:
            return cls(samples[0], samples[0], samples[0], samples[0], 1)
        centiles = statistics.quantiles(samples, n=100, method="inclusive")
        return cls(statistics.median(samples), centiles[9], centiles[89], centiles[98], len(samples))

    @classmethod
    def of_percentiles(cls, p50: float, p99: float, n: int) -> Summary:
        """From a measurement that kept only p50 and p99 (no deciles)."""
        return cls(p50, None, None, p99, n)


def timed(name: str, fn: Callable[[], object]) -> Thunk:
    """A thunk that reports the wall time of ``fn()`` in milliseconds under ``name``."""

    def run() -> dict[str, float]:
        start = time.perf_counter_ns()
        fn()
        return {name: (time.perf_counter_ns() - start) / 1e6}

    return run


def interleave(reps: int, thunks: Sequence[Thunk], warmup: int = 0) -> dict[str, list[float]]:
    """Run each thunk once per repetition, reversing the order every other time so neither always
    goes first (caches, frequency scaling); the first ``warmup`` repetitions are discarded."""
    samples: dict[str, list[float]] = {}
    for i in range(warmup + reps):
        for thunk in thunks if i % 2 == 0 else reversed(thunks):
            for name, value in thunk().items():
                if i >= warmup:
                    samples.setdefault(name, []).append(value)
    return samples


def rate(workers: Sequence[Callable[[], object]], seconds: float) -> float:
    """Calls per second of all ``workers`` together, each looping in its own thread for ``seconds``."""
    start_line = threading.Barrier(len(workers) + 1)
    stop = threading.Event()
    counts = [0] * len(workers)
    errors: list[BaseException] = []

    def loop(index: int, work: Callable[[], object]) -> None:
        start_line.wait()
        try:
            while not stop.is_set():
                work()
                counts[index] += 1
        except Exception as exc:  # re-raised in the caller's thread below
            errors.append(exc)

    threads = [threading.Thread(target=loop, args=(i, w), daemon=True) for i, w in enumerate(workers)]
    for thread in threads:
        thread.start()
    start_line.wait()
    start = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    return sum(counts) / elapsed
