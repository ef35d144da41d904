"""Host side: the jail's scratch memory, its one tmpfs and its SysV IPC, sized as it is planned.

Runs in the host process (``plan.py``). The tmpfs holds the jail's /tmp, /dev/shm and a tmpfs
writable layer: one mount with a size and an inode count. SysV IPC objects outlive the processes that
made them, so their memory is one no process's pages show; the init sets its IPC namespace's
``kernel.*`` sysctls before any command runs (``/proc/sys`` is read-only to commands after that).
"""

from __future__ import annotations

from ..config import SandboxConfig
from .enforcement import Enforcement, held
from .proc import PAGE

IPC_MESSAGE_QUEUES = 256  # SysV message queues of a jail (at the default 16 KiB each: 4 MiB)
IPC_SEMAPHORES = "250 32000 32 128"  # kernel.sem: per set, in all, per semop call, sets (the pre-5.x defaults)


def tmpfs(config: SandboxConfig) -> tuple[int, int]:
    """(bytes, inodes) of the one tmpfs that holds the jail's /tmp, /dev/shm and a tmpfs writable
    layer. tmpfs is memory that no process holds, so it gets at most half the memory limit: the
    other half is left to commands and to the init, which a tmpfs at the whole limit would leave
    the OOM killer nothing else to take. Never more than the disk limit either."""
    limits = config.limits
    bounds = [b for b in (None if limits.memory is None else limits.memory // 2, limits.disk) if b is not None]
    if config.upper == "tmpfs":
        bounds.append(config.tmpfs_size)
    size = min(bounds) if bounds else config.tmpfs_size
    return size, limits.inodes or 0  # 0: the kernel's default count (half the host's pages)


def ipc(tmpfs_size: int) -> dict[str, str]:
    """``kernel.*`` sysctls of the jail's own IPC namespace. The kernel's defaults allow about 16 EiB
    of shared memory, 32,000 message queues of 16 KiB and a billion semaphores. Shared memory gets
    what /dev/shm gets, the one tmpfs's size; message queues and semaphores the small counts
    programs use."""
    return {
        "shmmax": str(tmpfs_size),
        "shmall": str(max(1, tmpfs_size // PAGE)),
        "msgmni": str(IPC_MESSAGE_QUEUES),
        "sem": IPC_SEMAPHORES,
    }


def plan(config: SandboxConfig, size: int, inodes: int, values: dict[str, str]) -> list[Enforcement]:
    """How the tmpfs (``size``, ``inodes``) and the IPC namespace (``values``) are held."""
    queues, (_, semaphores, _, sets) = values["msgmni"], values["sem"].split()
    layer = " and the writable layer" if config.upper == "tmpfs" else ""
    return [
        held("tmpfs", f"/tmp, /dev/shm{layer}: one tmpfs of {size} bytes" + (f", {inodes} inodes" if inodes else "")),
        held(
            "ipc",
            f"SysV IPC of the jail's own namespace: shared memory {values['shmmax']} bytes in all (kernel.shmall), "
            f"{queues} message queues (kernel.msgmni), {semaphores} semaphores in {sets} sets (kernel.sem); "
            "set by the init before any command runs, /proc/sys read-only",
        ),
    ]
