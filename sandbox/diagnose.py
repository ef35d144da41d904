"""Turn a refused setup step into an error that names the cause and the exact fix."""

from __future__ import annotations

import errno
import os
import platform

from sandbox.errors import KernelRefused, SandboxError, SandboxSetupError


def _sysctl(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def explain(message: str, err: int) -> SandboxError:
    """Map a failure reported by the launcher or the jail's setup to a helpful exception."""
    kernel = platform.release()
    if _sysctl("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == "1" and os.getuid() != 0:
        return KernelRefused(
            f"{message}. AppArmor restricts unprivileged user namespaces on this host "
            "(kernel.apparmor_restrict_unprivileged_userns=1). Fix: sudo sysctl -w "
            "kernel.apparmor_restrict_unprivileged_userns=0 (persist it in /etc/sysctl.d/), or install an "
            "AppArmor profile that grants 'userns,' to this Python interpreter."
        )
    if "user namespace" in message:
        if _sysctl("/proc/sys/kernel/unprivileged_userns_clone") == "0":
            return KernelRefused(
                f"{message}. Unprivileged user namespaces are disabled. Fix: sudo sysctl -w "
                "kernel.unprivileged_userns_clone=1"
            )
        if _sysctl("/proc/sys/user/max_user_namespaces") == "0" or err == errno.ENOSPC:
            return KernelRefused(
                f"{message}. The user namespace limit is exhausted or zero. Fix: sudo sysctl -w "
                "user.max_user_namespaces=28633"
            )
        return KernelRefused(
            f"{message}. The kernel refused a user namespace; inside a container this usually means a "
            "seccomp profile blocks unshare(2). Fix: run the container with --security-opt "
            "seccomp=unconfined (or --privileged), or run jailbox on the host."
        )
    if "mount overlay" in message:
        return KernelRefused(
            f"{message}. overlayfs refused the writable layer (rootless overlayfs needs Linux >= 5.11; "
            f"this is {kernel}; the state directory must be on a local filesystem such as ext4, xfs or "
            "btrfs). Fix: set JAILBOX_STATE_DIR to a directory on a local disk, or use upper='tmpfs'."
        )
    if "uid_map" in message or "gid_map" in message or "newuidmap" in message or "newgidmap" in message:
        return KernelRefused(
            f"{message}. Writing the user namespace's id map failed. Fix: check /etc/subuid and "
            "/etc/subgid for this user, or use idmap='single'."
        )
    if err in (errno.EPERM, errno.EACCES):
        return KernelRefused(f"{message} (the kernel refused this step inside the user namespace)")
    return SandboxSetupError(message)
