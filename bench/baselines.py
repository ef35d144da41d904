"""Reference points, spawned with ``posix_spawn`` + ``waitpid`` as a C caller would, so Python's
``subprocess`` machinery (pipes, fd closing, error pipe) is not billed to the baseline."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence

ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
TRUE = ["/bin/true"]
SYSTEM_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
_QUIET = [
    (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
    (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
]


def spawn_wait(argv: Sequence[str], env: Mapping[str, str] = ENV, quiet: bool = False) -> None:
    """Spawn ``argv[0]`` (an absolute path), wait for it, and insist that it succeeded."""
    pid = os.posix_spawn(argv[0], list(argv), env, file_actions=_QUIET if quiet else ())
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise RuntimeError(f"{' '.join(argv)} exited with {code}")


def bwrap_argv() -> list[str] | None:
    """bwrap running ``true`` with the host's /usr and its merged-usr links (or real directories)."""
    path = shutil.which("bwrap")
    if path is None:
        return None
    argv = [path, "--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr"]
    for name in SYSTEM_DIRS:
        host = "/" + name
        if os.path.islink(host):
            argv += ["--symlink", os.readlink(host), host]
        elif os.path.isdir(host):
            argv += ["--ro-bind", host, host]
    return [*argv, "--proc", "/proc", "--dev", "/dev", "true"]


def failure(argv: Sequence[str], timeout: float, env: Mapping[str, str] = ENV) -> str | None:
    """Why ``argv`` does not run successfully here, or None when it does."""
    try:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return f"`{' '.join(argv[:3])}` did not finish within {timeout:g}s"
    except OSError as exc:
        return f"`{argv[0]}` cannot run: {exc}"
    if proc.returncode == 0:
        return None
    last = (proc.stderr.strip().splitlines() or ["no error output"])[-1]
    return f"`{' '.join(argv[:3])}` exited with {proc.returncode}: {last[:200]}"


def container_runs(image: str) -> tuple[dict[str, list[str]], list[str]]:
    """``run --rm --network=none IMAGE true`` per working runtime, and why each other one is skipped.

    A missing image is pulled once here, outside any timing."""
    runs: dict[str, list[str]] = {}
    skipped: list[str] = []
    env = dict(os.environ)
    for name in ("podman", "docker"):
        path = shutil.which(name)
        if path is None:
            skipped.append(f"{name}: not installed")
            continue
        reason = failure([path, "info"], 10, env)
        if reason is None and failure([path, "image", "inspect", image], 30, env) is not None:
            reason = failure([path, "pull", image], 300, env)
        if reason is not None:
            skipped.append(f"{name}: {reason}")
            continue
        runs[name] = [path, "run", "--rm", "--network=none", image, "true"]
    return runs, skipped
