"""Density: many live jails at once, what they cost the host, and whether any fails to start."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import psutil

from bench.results import CaseResult, Row, Target
from bench.settings import Settings
from bench.timing import Summary
from jailbox.sandbox import Sandbox
from jailbox.sandbox.launcher import LAUNCHER

TARGET_COUNT = 512
TARGET_MB = 4.0
MB = 1e6
GIVE_UP_AFTER = 10
TARGET_TEXT = f"{TARGET_COUNT} live, 0 failures, < {TARGET_MB:g} MB each"


@dataclass(frozen=True)
class Memory:
    """Proportional set sizes (bytes): shared pages are split among the processes that map them."""

    launcher: int
    per_jail: list[int]
    processes: int
    unreadable: int

    @property
    def total(self) -> int:
        return self.launcher + sum(self.per_jail)


def _pss(procs: list[psutil.Process]) -> tuple[int, int, int]:
    """(bytes, processes counted, processes whose memory could not be read)."""
    total = counted = unreadable = 0
    for proc in procs:
        try:
            total += proc.memory_full_info().pss
            counted += 1
        except psutil.AccessDenied:
            unreadable += 1
        except psutil.NoSuchProcess:
            continue
    return total, counted, unreadable


def jail_memory(launcher_pid: int) -> Memory:
    """The launcher's processes (the first and its workers) plus every jail: each init is the child
    of the launcher process that made it (its subreaper)."""
    first = psutil.Process(launcher_pid)
    launchers = [first, *(p for p in first.children() if p.name() == first.name())]
    launcher_pss, processes, unreadable = _pss(launchers)
    per_jail = []
    for init in (child for launcher in launchers for child in launcher.children() if child not in launchers):
        try:
            tree = [init, *init.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        pss, counted, denied = _pss(tree)
        per_jail.append(pss)
        processes += counted
        unreadable += denied
    return Memory(launcher_pss, per_jail, processes, unreadable)


def _create(count: int, boxes: list[Sandbox]) -> tuple[list[float], list[str]]:
    """Create up to ``count`` jails one after another into ``boxes``: (ms each, failure messages)."""
    times: list[float] = []
    failures: list[str] = []
    streak = 0
    for made in range(count):
        start = time.perf_counter_ns()
        try:
            boxes.append(Sandbox())
        except Exception as exc:  # a jail that fails to start is a result here, not the end of the case
            failures.append(f"{type(exc).__name__}: {exc}")
            streak += 1
            if streak >= GIVE_UP_AFTER:
                failures.append(f"gave up after {streak} failures in a row; {count - made - 1} not attempted")
                break
            continue
        times.append((time.perf_counter_ns() - start) / 1e6)
        streak = 0
    return times, failures


def _close_all(boxes: list[Sandbox]) -> tuple[float, list[str]]:
    """Close every jail even when some ``close()`` raises: (seconds, failure messages)."""
    failures: list[str] = []
    start = time.perf_counter()
    for sb in boxes:
        try:
            sb.close()
        except Exception as exc:  # the others must still be closed; a failed close is a result here
            failures.append(f"{type(exc).__name__}: {exc}")
    return time.perf_counter() - start, failures


def _failure_note(failed: int, of: int, what: str, messages: list[str]) -> str:
    return f"{failed} of {of} {what}" + (f"; first: {messages[0][:200]}" if messages else "")


def _memory_target(count: int, failed: int, per_sandbox: float, memory: Memory) -> Target:
    if count < TARGET_COUNT:
        return Target.check(TARGET_TEXT, None, f"only {count} sandboxes")
    if memory.unreadable and not failed and per_sandbox < TARGET_MB:
        return Target.check(TARGET_TEXT, None, f"{memory.unreadable} processes unreadable")
    return Target.check(TARGET_TEXT, failed == 0 and per_sandbox < TARGET_MB)


def density(settings: Settings) -> CaseResult:
    count = settings.density
    boxes: list[Sandbox] = []
    try:
        start = time.perf_counter()
        times, create_failures = _create(count, boxes)
        create_all = time.perf_counter() - start
        launcher_pid = LAUNCHER.pid
        memory = jail_memory(launcher_pid) if boxes and launcher_pid is not None else None
    finally:
        close_all, close_failures = _close_all(boxes)
    if memory is None:
        raise RuntimeError(f"no sandbox could be created: {create_failures[0]}")
    live = len(boxes)
    failed = count - live + len(close_failures)
    per_sandbox = memory.total / live / MB
    notes = [_failure_note(count - live, count, "failed to start", create_failures)]
    if close_failures:
        notes.append(_failure_note(len(close_failures), live, "close() calls raised", close_failures))
        notes.append("`jailbox cleanup` removes what the failed close() calls left behind")
    if memory.unreadable:
        notes.append(f"{memory.unreadable} processes unreadable, their memory is not counted")
    extra: dict[str, object] = {
        "requested": count,
        "live": live,
        "create_failures": count - live,
        "close_failures": len(close_failures),
        "failure_messages": (create_failures + close_failures)[:10],
        "processes": memory.processes,
        "unreadable_processes": memory.unreadable,
        "launcher_pss_mb": memory.launcher / MB,
        "per_jail_pss_mb": asdict(Summary.of([pss / MB for pss in memory.per_jail])) if memory.per_jail else None,
    }
    rows = [
        Row(f"density: create each of {count}, sequential", "ms", Summary.of(times)),
        Row(f"density: create all {count}", "s", Summary.of([create_all])),
        Row(
            f"density: host PSS per sandbox, {live} live",
            "MB",
            Summary.of([per_sandbox]),
            target=_memory_target(count, failed, per_sandbox, memory),
            notes=notes,
            extra=extra,
        ),
        Row(f"density: close all {live}", "s", Summary.of([close_all])),
    ]
    return CaseResult(rows)
