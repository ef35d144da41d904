"""The one family of jailbox's exceptions: its root, the jail's errors (every kind, here), and the
roots of the agent's and the servers' errors, whose kinds live beside the code that raises them.

Each message says what failed and, where the cause is the host's configuration, the exact
command or setting that fixes it.
"""

from __future__ import annotations


class JailboxError(Exception):
    """Base class of every error jailbox raises: ``except JailboxError`` catches them all."""


class SandboxError(JailboxError):
    """Base class of the jail's errors (``jailbox.sandbox``)."""


class AgentError(JailboxError):
    """Base class of the agent's errors (``jailbox.agent``): a model endpoint, a task, a tool, a score."""


class ServerError(JailboxError):
    """Base class of the servers' errors (``jailbox serve``, ``jailbox mcp``, the per-user service)."""


class ConfigError(SandboxError, ValueError):
    """A configuration value is invalid or names something that does not exist."""


class RootfsNotFound(ConfigError):
    """The root filesystem directory does not exist or is not a directory."""


class RootfsError(SandboxError):
    """Storing, pulling, importing or unpacking a root filesystem failed."""


class UnsafeArchive(RootfsError):
    """An archive member tries to leave its tree, or is absurd; the message names the member."""


class RootfsBuildError(RootfsError):
    """mmdebstrap failed, or a recipe cannot be built here; the message carries its last lines."""


class RegistryError(RootfsError):
    """An OCI registry refused or answered something unusable (auth, missing tag, bad manifest)."""


class DownloadInterrupted(RegistryError):
    """A blob download broke off; what arrived is kept and the next attempt resumes it."""


class DigestMismatch(RegistryError):
    """Downloaded bytes do not hash to the digest the manifest promised; nothing was kept."""


class KernelRefused(SandboxError):
    """The kernel (or a security module) refused a namespace, mount or id-map step."""


class SandboxSetupError(SandboxError):
    """Building the jail failed for a reason other than a kernel refusal."""


class SandboxClosed(SandboxError):
    """The sandbox was closed, or its init died, before or during the call."""


class SandboxPaused(SandboxError):
    """The sandbox is paused: nothing runs in it until ``resume()`` (CLI: ``jailbox resume ID``)."""


class PauseFailed(SandboxError):
    """``pause()`` could not stop every process of the jail in time; the sandbox was left running."""


class BranchError(SandboxError):
    """A checkpoint, rollback, fork or snapshot was refused or failed; the sandbox is as it was before the call."""


class SnapshotNotFound(BranchError):
    """No durable snapshot has that id or name; the message lists some that exist."""


class ProtocolError(SandboxError):
    """The jail's init sent something malformed, oversized or unexpected."""


class InterpreterError(SandboxError):
    """The code interpreter could not run the code: no kernel in the jail, an unknown context, or a
    gateway that broke its protocol or a bound (it is killed; the next call starts a fresh one)."""


class InterpreterTimeout(InterpreterError, TimeoutError):
    """``run_code`` ran past its timeout; the kernel was interrupted and the context still works."""


class ExecError(SandboxError):
    """A command could not be started or supervised (not: the command failed)."""


class SandboxFileError(SandboxError, OSError):
    """A file operation inside the jail failed; ``errno`` and ``filename`` say which and where."""


class SecurityWarning(UserWarning):
    """A configuration weakens the jail (for example ``seccomp=None``)."""


class LimitNotEnforced(UserWarning):
    """A requested resource limit cannot be enforced on this host (see ``Sandbox.enforcement``)."""
