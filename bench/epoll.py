"""What the epoll maker costs a jail's program: each ``epoll_create1`` of a default sandbox is made
by its init's maker (``sandbox/child/epoll.py``), one round trip through the init, so that the
jail's watches are never its root's host uid's. Timed inside the jail, call by call, against the same
calls in a sandbox without seccomp (no maker), in the same run.

Two rows: the bare call, and what a program meets, an asyncio event loop made and closed (one epoll
instance each, plus the loop's own socket pair)."""

from __future__ import annotations

import json

from bench.results import CaseResult, Row, Target, ratio
from bench.settings import Settings
from bench.timing import Summary
from jailbox.sandbox import Sandbox

# Run by python3 in the jail: one JSON line of per-call times in microseconds.
PROBE = """
import asyncio, json, select, sys, time
reps = int(sys.argv[1])
def each(fn):
    out = []
    for _ in range(reps):
        start = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - start) / 1e3)
    return out
print(json.dumps({
    "epoll": each(lambda: select.epoll().close()),
    "loop": each(lambda: asyncio.new_event_loop().close()),
}))
"""
LOOP_TARGET = 2.0  # an event loop's start, through the maker, against without it


def _probe(sb: Sandbox, reps: int) -> dict[str, list[float]]:
    result = sb.exec(["python3", "-c", PROBE, str(reps)], timeout=120)
    if result.exit_code != 0:
        raise RuntimeError(f"the epoll probe exited with {result.exit_code}: {result.stderr[-500:]}")
    times: dict[str, list[float]] = json.loads(result.stdout)
    return times


def epoll(settings: Settings) -> CaseResult:
    """Rounds alternate between the two sandboxes so drift hits both alike; the first is warmup."""
    made: dict[str, list[float]] = {"epoll": [], "loop": []}
    direct: dict[str, list[float]] = {"epoll": [], "loop": []}
    with Sandbox() as maker, Sandbox(seccomp=None) as plain:
        held = maker.enforcement["epoll"]
        for round_ in range(settings.epoll_rounds + 1):
            order = [(maker, made), (plain, direct)]
            for sb, into in order if round_ % 2 == 0 else reversed(order):
                times = _probe(sb, settings.epoll_reps)
                if round_:
                    for key, values in times.items():
                        into[key].extend(values)
    notes = [] if held.startswith("held") else [f"the maker is not in use here: {held}"]
    bare = Row("epoll_create1+close in a jail (maker)", "us", Summary.of(made["epoll"]),
               "the same, seccomp=None (no maker)", Summary.of(direct["epoll"]), notes=notes)  # fmt: skip
    loop, loop_direct = Summary.of(made["loop"]), Summary.of(direct["loop"])
    vs = ratio(loop, loop_direct)
    target = Target.check(f"ratio vs seccomp=None <= {LOOP_TARGET:g}", vs is not None and vs <= LOOP_TARGET)
    start = Row("asyncio event loop new+close in a jail (maker)", "us", loop,
                "the same, seccomp=None (no maker)", loop_direct, target, notes=notes)  # fmt: skip
    return CaseResult([bare, start])
