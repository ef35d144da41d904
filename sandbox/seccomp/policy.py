"""``SeccompPolicy``: which syscalls a jail may make, by name (a pydantic model, validated on the host).

Names are checked against this machine's syscall table when the policy is made, so a typo is a
``ConfigError`` at configuration time rather than a filter that silently refuses nothing.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .syscalls import arch, syscall_numbers


class SeccompPolicy(BaseModel):
    """Which syscalls a jail may make, by name. The default is Docker's default profile.

    ``default``: what happens to a syscall in neither list. ``deny`` wins over ``allow``. Refused
    calls fail with ``errno``; each ``ExecResult`` names them (``refused_syscalls``) where the jail's
    init lives under the policy: ``default="allow"`` with none of the init's own calls denied. A
    policy the init cannot live under (``default="deny"``, say) is installed by each command's own
    child before it runs, and its refusals are not named. A runtime's essentials left out of
    ``allow`` (``mmap``, ``futex``, ...) end programs as they end anywhere such a call fails:
    often by SIGSEGV or SIGABRT, not by an error message. Every policy keeps
    the jail's argument rules (``clone`` with namespace flags, AF_ALG/AF_VSOCK/NETLINK_USERSOCK sockets, TIOCSTI,
    ``prctl(PR_SET_TIMERSLACK)``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    default: Literal["allow", "deny"] = "allow"
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    errno: int = Field(1, ge=1, le=4095, description="errno of a refused call (1 = EPERM)")
    docker_defaults: bool = Field(True, description="also refuse Docker's default denylist")

    @field_validator("allow", "deny")
    @classmethod
    def _known(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        syscall_numbers(list(names), arch(), strict=True)
        return names
