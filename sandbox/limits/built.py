"""Host side: the bounds a jail holds by how it is built and served, stated as it is planned.

Runs in the host process (``plan.py``). Nothing here is enforced at run time by jailbox's host side
beyond what the jail's build fixed: its devpts and /dev, its init's request size and OOM order, what
the host reads and keeps for it, its teardown, AIO (refused by seccomp) and, for an ``allow`` jail,
the proxy it shares with every other sandbox of the process.
"""

from __future__ import annotations

from ..child.requests import MAX_REQUEST, MAX_WALK_ENTRIES
from ..child.spec import DEV_INODES, DEV_SIZE, PTYS
from ..files import READ_LIMIT
from ..seccomp.policy import SeccompPolicy
from .enforcement import Enforcement, Verdict, held


def plan(output_limit: int, proxied: bool, policy: SeccompPolicy | None) -> list[Enforcement]:
    """How the jail's devices, init, transfers, teardown, AIO and proxy are bounded."""
    records = [
        held(
            "ptys",
            f"a devpts of its own with max={PTYS}: every devpts instance but the host's first draws on "
            "kernel.pty.max less its reserve, one count for all sandboxes and containers",
        ),
        held("dev", f"/dev: a tmpfs of {DEV_SIZE} bytes, {DEV_INODES} inodes (device nodes are binds of the host's)"),
        held(
            "init",
            f"requests over {MAX_REQUEST} bytes refused by the host (ExecError) and dropped by the init, which "
            "survives; the init at the lowest oom_score_adj its namespace allows, every command at 1000",
        ),
        held(
            "output",
            f"{output_limit} bytes kept of each stream of an exec (its head and tail), the rest dropped as read",
        ),
        held(
            "transfers",
            f"get() and put() keep holes (a sparse file costs what it holds); read_file() refuses a file over "
            f"{READ_LIMIT} bytes unless max_bytes says more; a listing is at most {MAX_WALK_ENTRIES} entries; the "
            "init's replies are read with a bound per message",
        ),
        held(
            "teardown",
            "close() removes the jail's tree in the closing thread, what the jail's other ids own in a child of "
            "the launcher: no new sandbox waits for a removal",
        ),
        _aio(policy),
    ]
    if proxied:
        from ..net import proxy  # loaded with the first allow jail only (its import costs the fast path)

        records.append(
            held(
                "proxy",
                f"the allow proxy: at most {proxy.MAX_CONNECTIONS} connections for all sandboxes, "
                f"{proxy.MAX_PER_SANDBOX} for one, {proxy.RESERVED} kept for each; a tunnel idle for "
                f"{proxy.IDLE_TIMEOUT:g} s is cut, a request head must come within {proxy.HEAD_TIMEOUT:g} s",
            )
        )
    return records


def _aio(policy: SeccompPolicy | None) -> Enforcement:
    """The host's AIO events (``seccomp/bpf.py``): one count for every process of the host."""
    if policy is not None and "io_setup" not in policy.allow:
        return held(
            "aio",
            "io_setup is ENOSYS (seccomp): the host's AIO events (fs.aio-max-nr) are one count for every process "
            "of the host, which no namespace, cgroup or rlimit divides; SeccompPolicy(allow=('io_setup',)) gives it",
        )
    why = "seccomp=None" if policy is None else "the seccomp policy allows io_setup"
    how = f"{why}, and the host's AIO events (fs.aio-max-nr) are one count for all its processes"
    return Enforcement("aio", Verdict.NOT_BOUNDED, how)
