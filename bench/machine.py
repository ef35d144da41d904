"""The machine a run happened on: figures from different machines are not comparable."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Hardware", "cpu model"):
                    return value.strip()
    except OSError:
        pass
    return "unknown"


def bwrap_version() -> str:
    path = shutil.which("bwrap")
    if path is None:
        return "bwrap not installed"
    try:
        return subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"


def machine_info() -> dict[str, object]:
    return {
        "kernel": os.uname().release,
        "nproc": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "uid": os.getuid(),
        "bwrap": bwrap_version(),
    }
