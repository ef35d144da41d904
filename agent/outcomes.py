"""Whose failure a result is: the task's (a non-zero exit, a wrong answer) or the infrastructure's (a jail
that could not start or died, a Ray worker lost, the model's endpoint down). The one home of that
vocabulary: ``bench``'s ``TaskResult``, the RL ``Environment``, ``jailbox.rl`` and its Ray backend read it
from here, so a trainer never computes a reward from an infrastructure failure.

Runs in host processes (the driver, a trainer, a Ray worker); pure functions, nothing bounded.
"""

from __future__ import annotations

from typing import Literal

from ..sandbox.errors import AgentError, ConfigError, SandboxError, SandboxFileError

Failure = Literal["task", "infra"]
"""Whose failure: ``"task"`` (what the task or the model did), ``"infra"`` (what it ran on)."""

INFRASTRUCTURE = frozenset({"llm_error", "sandbox_error", "worker_lost"})
"""Exit statuses that blame what the task ran on (the endpoint, the jail, the Ray worker), not the model's work."""


class InfraError(AgentError):
    """The infrastructure failed, not the task: the jail did not start or died, its worker was lost.
    The episode measured nothing; retry it or drop it, never score it."""


def is_infra(exc: BaseException) -> bool:
    """Whether ``exc``, raised by a jail call, is the infrastructure's. A bad argument (``ConfigError``) and
    a file the task did or did not make (``SandboxFileError``: missing, too large) are the caller's; every
    other jailbox error (a jail that would not start, a dead init, a broken protocol) and ``InfraError``
    are the infrastructure's."""
    if isinstance(exc, InfraError):
        return True
    return isinstance(exc, SandboxError) and not isinstance(exc, (ConfigError, SandboxFileError))


def of_status(exit_status: str, score: float) -> Failure | None:
    """A finished task's failure, from its exit status and score: the infrastructure's when the status
    blames it; else the task's when it scored nothing; else none."""
    if exit_status in INFRASTRUCTURE:
        return "infra"
    return "task" if score <= 0 else None
