"""What an exec returns."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field, computed_field


def decode(data: bytes, head: int, dropped: int) -> str:
    """UTF-8 with replacement; a note marks where the middle of a capped stream was dropped."""
    if not dropped:
        return data.decode("utf-8", errors="replace")
    first = data[:head].decode("utf-8", errors="replace")
    last = data[head:].decode("utf-8", errors="replace")
    return f"{first}\n[... {dropped} bytes dropped by jailbox's output limit ...]\n{last}"


class ExecResult(BaseModel):
    """Outcome of one command. ``stdout``/``stderr`` are text; the ``*_bytes`` fields are exact.

    ``refused_syscalls``: what the seccomp policy refused this command's processes, by name.
    ``cpu_user``/``cpu_system`` (seconds) and ``peak_memory`` (bytes, largest resident set) cover the
    command and the descendants it waited for. ``oom_killed``, ``pids_limit_hit`` and
    ``disk_limit_hit`` come from the sandbox's cgroup counters, or the host's watcher (memory and
    a disk writable layer without a cgroup), while the command ran; ``None`` where nothing counts them.
    """

    model_config = ConfigDict(frozen=True)

    exit_code: int
    signal: int | None = None
    stdout_bytes: bytes = b""
    stderr_bytes: bytes = b""
    stdout_dropped: int = 0
    stderr_dropped: int = 0
    output_limit: int = 1 << 20
    timed_out: bool = False
    wall_time: float = 0.0
    refused_syscalls: dict[str, int] = Field(default_factory=dict)
    cpu_user: float = 0.0
    cpu_system: float = 0.0
    peak_memory: int = 0
    oom_killed: bool | None = None
    pids_limit_hit: bool | None = None
    disk_limit_hit: bool | None = None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def stdout(self) -> str:
        return decode(self.stdout_bytes, self.output_limit // 2, self.stdout_dropped)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def stderr(self) -> str:
        return decode(self.stderr_bytes, self.output_limit // 2, self.stderr_dropped)

    @property
    def stdout_truncated(self) -> bool:
        return self.stdout_dropped > 0

    @property
    def stderr_truncated(self) -> bool:
        return self.stderr_dropped > 0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


class SandboxStats(BaseModel):
    """What a sandbox's commands cost so far (``Sandbox.stats()``)."""

    execs: int = 0
    wall_time: float = 0.0
    cpu_user: float = 0.0
    cpu_system: float = 0.0
    peak_memory: int = 0
    timeouts: int = 0
    oom_kills: int = 0
    pids_limit_hits: int = 0
    refused_syscalls: dict[str, int] = Field(default_factory=dict)

    def add(self, r: ExecResult) -> None:
        self.execs += 1
        self.wall_time += r.wall_time
        self.cpu_user += r.cpu_user
        self.cpu_system += r.cpu_system
        self.peak_memory = max(self.peak_memory, r.peak_memory)
        self.timeouts += r.timed_out
        self.oom_kills += bool(r.oom_killed)
        self.pids_limit_hits += bool(r.pids_limit_hit)
        for name, count in r.refused_syscalls.items():
            self.refused_syscalls[name] = self.refused_syscalls.get(name, 0) + count


class SandboxUsage(BaseModel):
    """What a sandbox uses at one instant (``Sandbox.usage()``): from its cgroup where it has one that
    counts it, else summed over its processes in ``/proc``."""

    timestamp: datetime
    cpu_count: int
    """CPUs it may use: its ``cpus`` limit rounded up, else the host's."""
    cpu_seconds: float
    """CPU time of all its processes since its jail started (``reset()`` starts a new one)."""
    cpu_used_pct: float
    """Its CPU time over that span as a share of ``cpu_count`` CPUs, in percent, since the sandbox's
    previous ``usage()`` (since its jail started, at the first)."""
    memory_used: int
    """Bytes its processes hold, page cache left out (resident anonymous memory without a cgroup)."""
    memory_cache: int
    """Bytes of page cache its cgroup is charged (0 without a cgroup that counts memory)."""
    memory_total: int
    """Its ``memory`` limit, else the host's memory."""
    disk_used: int | None
    """Bytes its writable layer holds (None: a layer on disk without a ``disk`` limit is not walked)."""
    disk_total: int | None
    """Its ``disk`` limit."""
