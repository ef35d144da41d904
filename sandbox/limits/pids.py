"""Host side: how a jail's processes and threads are bounded, alone and with all other sandboxes.

Runs in the host process, as a jail is planned (``plan.py``). Per sandbox: the pids cgroup where
there is one, else ``RLIMIT_NPROC`` of the sandbox's user namespace, which the kernel counts over all
the sandbox's uids together. All sandboxes on the host together (``budget.pids_budget``), in parts
per user (``budget.pids_share``), each part: ``pids.max`` of the ``jailbox`` group every sandbox's
group is made in, and the ``RLIMIT_NPROC`` the launcher sets before it creates each jail's user
namespace, which the kernel keeps as that namespace's cap.
"""

from __future__ import annotations

from .. import hostids
from . import budget
from .enforcement import Enforcement, Verdict, held, unbounded


def plan(pids: int | None, cgroup: str | None, userns: bool) -> tuple[dict[str, int], Enforcement]:
    """(the rlimits the init sets, how one sandbox's processes are bounded)."""
    if pids is None:
        return {}, unbounded("pids", "pids")
    if cgroup:
        return {}, held("pids", f"{cgroup} pids")
    if not userns:
        why = "no cgroup, and without a user namespace the jail's processes are host root's"
        return {}, Enforcement("pids", Verdict.NOT_ENFORCED, why)
    how = "rlimit RLIMIT_NPROC: all processes of this sandbox's user namespace, every uid (no cgroup)"
    return {"RLIMIT_NPROC": pids}, held("pids", how)


def nproc_budget(pids_budget: int, userns: bool) -> int | None:
    """The RLIMIT_NPROC the launcher sets before it creates the jail's user namespace, if it binds.
    It binds every process of the jail, whose host uids are never 0 (root's jails run as subordinate
    ids), against the count of the namespace's creator: root's too, so as root it holds all of root's
    sandboxes on the host together, whichever cgroup each caller runs in. Without a user namespace the
    jail's processes are host root's, which the kernel exempts; the pids cgroup bounds them instead."""
    return pids_budget if userns else None


def plan_budget(pids_budget: int, cgroup: str | None, userns: bool) -> Enforcement:
    """How this user's sandboxes together are held to ``pids_budget``, their part of the host's budget."""
    by = []
    if cgroup:
        by.append(f"{cgroup} pids.max={pids_budget} on the jailbox group all sandboxes are created in")
    if nproc_budget(pids_budget, userns) is not None:
        by.append(
            f"RLIMIT_NPROC={pids_budget} of the user namespace's creator: forks fail while this user has that many, "
            "its own processes on the host included"
            if hostids.namespace_creator() is None
            else f"RLIMIT_NPROC={pids_budget} of the host uid every root jail's user namespace is created as: forks "
            "fail while all root's sandboxes on this host together have that many, whichever process or cgroup made "
            "them"
        )
    part = budget.describe_share(budget.pids_budget(), budget.caller())
    if not by:
        why = f"no pids cgroup, and without a user namespace its processes are root's ({part})"
        return Enforcement("pids_budget", Verdict.NOT_ENFORCED, why)
    return held("pids_budget", f"{'; '.join(by)} ({part})")
