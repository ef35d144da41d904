"""Turn a refused setup step into an error that names the cause and the exact fix.

Host side. Decides by the step that failed and its errno (``child/protocol.py``), never by the
wording of a message, and uses the same probes as ``jailbox doctor``, so the error and the doctor
always agree.
"""

from __future__ import annotations

import errno
import platform

from ..child.protocol import Failed, Step
from ..errors import KernelRefused, SandboxError, SandboxSetupError
from .doctor import Host, userns_settings

REFUSED = (errno.EPERM, errno.EACCES)


def explain(failed: Failed) -> SandboxError:
    """Map a failure reported by the launcher or the jail's setup to a helpful exception."""
    message, err = failed.error[:2000], failed.errno
    settings = userns_settings(Host())
    if settings.status == "failing" and (failed.step is Step.USERNS or err in REFUSED):
        return KernelRefused(f"{message}. {settings.detail}. Fix: {settings.fix}")
    if failed.step is Step.USERNS:
        if err == errno.ENOSPC:
            return KernelRefused(
                f"{message}. The user namespace limit is exhausted. Fix: sudo sysctl -w user.max_user_namespaces=28633"
            )
        return KernelRefused(
            f"{message}. The kernel refused a user namespace; inside a container this usually means a "
            "seccomp profile blocks unshare(2). Fix: run the container with --security-opt "
            "seccomp=unconfined (or --privileged), or run jailbox on the host."
        )
    if failed.step is Step.OVERLAY:
        return KernelRefused(
            f"{message}. overlayfs refused the writable layer (rootless overlayfs needs Linux >= 5.11; "
            f"this is {platform.release()}; the state directory must be on a local filesystem such as ext4, "
            "xfs or btrfs). Fix: set JAILBOX_STATE_DIR to a directory on a local disk, or use upper='tmpfs'."
        )
    if failed.step is Step.ID_MAP:
        return KernelRefused(
            f"{message}. Writing the user namespace's id map failed. Fix: check /etc/subuid and "
            "/etc/subgid for this user, or use idmap='single'."
        )
    if err in REFUSED:
        return KernelRefused(f"{message} (the kernel refused this step inside the user namespace)")
    return SandboxSetupError(message)
