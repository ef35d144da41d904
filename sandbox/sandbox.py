"""``Sandbox``: a jail that lives until closed and runs many commands."""

from __future__ import annotations

import itertools
import os
import posixpath
import signal
import socket
import threading
import uuid
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sandbox import files, hostroot, idmap, state, wire
from sandbox.channel import Channel
from sandbox.config import SandboxConfig, check_env, jail_path
from sandbox.diagnose import explain
from sandbox.errors import ConfigError, ExecError, ProtocolError, RootfsNotFound, SandboxClosed, SandboxSetupError
from sandbox.execution import ExecRun, TtyCommand, run_sync
from sandbox.launcher import LAUNCHER
from sandbox.messages import Ready
from sandbox.results import ExecResult

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BASE_ENV = {"PATH": DEFAULT_PATH, "HOME": "/root", "LANG": "C.UTF-8", "TERM": "xterm"}
EXIT_WAIT = 2.0

Command = str | list[str] | tuple[str, ...]


class Sandbox:
    """A jail: ``with Sandbox() as sb: sb.exec("echo hi")``. Thread-safe; ``close()`` is idempotent."""

    def __init__(self, config: SandboxConfig | None = None, **options: Any) -> None:
        if config is not None and options:
            config = config.model_copy(update=options)
            config = SandboxConfig.model_validate(config.model_dump())
        self.config = config if config is not None else SandboxConfig(**options)
        self.id = uuid.uuid4().hex[:12]
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._closed = False
        self._spec, self.dir = self._prepare()
        self._finalizer = weakref.finalize(self, _teardown, None, -1, self.dir, self._spec)
        channel_sock, self._pidfd, self.init_pid = self._launch()
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _teardown, channel_sock, self._pidfd, self.dir, self._spec)
        self._channel = Channel(channel_sock)

    # --- creation -----------------------------------------------------------------------------

    def _prepare(self) -> tuple[dict, Path | None]:
        cfg = self.config
        base = state.state_dir(cfg.state_dir)
        host = cfg.rootfs == "host"
        if host:
            lower, system_binds = hostroot.layout(base)
        else:
            root = Path(cfg.rootfs).expanduser().absolute()
            if not root.is_dir():
                raise RootfsNotFound(
                    f"root filesystem {root} does not exist or is not a directory; "
                    'use rootfs="host" or give the path of an unpacked root filesystem'
                )
            lower, system_binds = str(root), []
        if not cfg.userns and os.getuid() != 0:
            raise ConfigError("userns=False needs root; unprivileged jails always use a user namespace")
        user_binds = [
            {"src": str(m.src), "dst": m.dst, "is_dir": m.src.is_dir(), "readonly": m.readonly}
            for m in sorted(cfg.mounts, key=lambda m: m.dst.count("/"))
        ]
        sandbox_dir = None
        if cfg.upper == "disk":  # a tmpfs writable layer leaves nothing on disk
            sandbox_dir = base / "sandboxes" / self.id
            sandbox_dir.mkdir(mode=0o700)
        spec = {
            "id": self.id,
            "dir": None if sandbox_dir is None else str(sandbox_dir),
            "stage": str(base / "stage"),
            "lower": lower,
            "trusted_lower": host,
            "system_binds": system_binds,
            "user_binds": user_binds,
            "generated": hostroot.generated_files(cfg.hostname, host),
            "upper": cfg.upper,
            "tmpfs_size": cfg.tmpfs_size,
            "hostname": cfg.hostname,
            "network": cfg.network.mode,
            "workdir": cfg.workdir,
            "keep_caps": cfg.keep_caps,
            "userns": cfg.userns,
            "idmap": idmap.plan(cfg.idmap),
        }
        return spec, sandbox_dir

    def _launch(self) -> tuple[socket.socket, int, int]:
        try:
            reply, fds = LAUNCHER.request({"op": "create", "spec": self._spec})
            if not reply.get("ok"):
                raise explain(str(reply.get("error", "jail setup failed"))[:2000], int(reply.get("errno") or 0))
            if len(fds) != 2:
                raise SandboxSetupError("the launcher answered without the jail's descriptors")
        except BaseException:
            _teardown(None, -1, self.dir, self._spec)
            raise
        sock, pidfd = socket.socket(fileno=fds[0]), fds[1]
        try:
            ready = self._await_ready(sock)
            if ready.error is not None:
                raise explain(ready.error, ready.errno)
        except BaseException:
            _teardown(sock, pidfd, self.dir, self._spec)
            raise
        init_pid = int(reply["init_pid"])
        if self.dir is not None:
            state.write_meta(
                self.dir,
                host_pid=os.getpid(),
                host_start=state.own_start(),
                init_pid=init_pid,
                init_start=state.process_start(init_pid),
                idmap=self._spec["idmap"],
            )
        return sock, pidfd, init_pid

    def _await_ready(self, sock: socket.socket) -> Ready:
        if not wire.wait_readable(sock, self.config.setup_timeout):
            raise SandboxSetupError(f"the jail was not ready within {self.config.setup_timeout}s")
        try:
            msg = wire.recv(sock, max_fds=0)
        except wire.WireError as exc:
            raise ProtocolError(f"bad message from the jail during setup: {exc}") from exc
        if msg is None:
            raise SandboxSetupError("the jail's init exited during setup")
        return Ready.model_validate(msg[0])

    # --- commands -----------------------------------------------------------------------------

    def _begin_exec(
        self,
        cmd: Command,
        cwd: str | None,
        env: dict[str, str] | None,
        stdin: bytes | str | None,
        on_stdout: Callable[[bytes], None] | None,
        on_stderr: Callable[[bytes], None] | None,
    ) -> ExecRun:
        self._check_open()
        request: dict[str, Any] = {"op": "exec", "id": next(self._ids)}
        if isinstance(cmd, str):
            request["shell"] = cmd
        else:
            argv = list(cmd)
            if not argv or not all(isinstance(a, str) for a in argv):
                raise ExecError("cmd must be a shell string or a non-empty list of strings")
            request["argv"] = argv
        if "\0" in (request.get("shell") or "".join(request.get("argv", []))):
            raise ExecError("command contains a NUL byte")
        request["cwd"] = self._abs(cwd) if cwd else self.config.workdir
        request["env"] = {**BASE_ENV, **self.config.env, **check_env(dict(env or {}))}
        data = stdin.encode() if isinstance(stdin, str) else stdin
        return ExecRun(self._channel, request, data, self.config.output_limit, on_stdout, on_stderr)

    def exec(
        self,
        cmd: Command,
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        stdin: bytes | str | None = None,
        on_stdout: Callable[[bytes], None] | None = None,
        on_stderr: Callable[[bytes], None] | None = None,
    ) -> ExecResult:
        """Run ``cmd`` (a shell string for bash/sh, or an argv list) and wait for its own process.

        On ``timeout`` the command's whole tree is killed, daemonised descendants included, and the
        result says ``timed_out``. Background processes it starts on purpose keep running.
        """
        run = self._begin_exec(cmd, cwd, env, stdin, on_stdout, on_stderr)
        return run_sync(run, timeout)

    def exec_tty(self, argv: list[str], env: dict[str, str] | None = None) -> TtyCommand:
        """Start ``argv`` as session leader on a new pty inside the jail (for interactive shells)."""
        self._check_open()
        request = {
            "op": "exec",
            "id": next(self._ids),
            "argv": argv,
            "tty": True,
            "cwd": self.config.workdir,
            "env": {**BASE_ENV, **self.config.env, **check_env(dict(env or {}))},
        }
        return TtyCommand(self._channel.open_call(request))

    # --- files --------------------------------------------------------------------------------

    def _abs(self, path: str) -> str:
        return jail_path(path if path.startswith("/") else posixpath.join(self.config.workdir, path))

    def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        """Read a regular file as the jail sees it (symlinks resolve inside the jail)."""
        self._check_open()
        return files.read_file(self._channel, self._abs(path), max_bytes)

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        """Create or replace a file inside the jail, creating parent directories."""
        self._check_open()
        files.write_file(self._channel, self._abs(path), data.encode() if isinstance(data, str) else data, mode)

    def put(self, src: str | os.PathLike[str], dst: str) -> None:
        """Copy a host file or directory tree to ``dst`` (the path the copy gets) in the jail."""
        self._check_open()
        files.put(self._channel, Path(src), self._abs(dst))

    def get(self, src: str, dst: str | os.PathLike[str]) -> None:
        """Copy a jail file or directory tree to ``dst`` (the path the copy gets) on the host."""
        self._check_open()
        files.get(self._channel, self._abs(src), Path(dst))

    # --- lifetime -----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxClosed("the sandbox is closed")

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Kill every process of the jail and remove its mounts, writable layer and state."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._finalizer()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Sandbox {self.id} rootfs={self.config.rootfs!r} {'closed' if self._closed else 'open'}>"


def _teardown(sock: socket.socket | None, pidfd: int, sandbox_dir: Path | None, spec: dict) -> None:
    """Close the control socket (the init exits on EOF), make sure it died, remove the state."""
    if sock is not None:
        sock.close()
    if pidfd >= 0:
        if not wire.wait_readable(pidfd, EXIT_WAIT):
            try:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass
            wire.wait_readable(pidfd, EXIT_WAIT)
        os.close(pidfd)
    if sandbox_dir is not None:
        remove_sandbox_dir(sandbox_dir, spec.get("idmap"))


def remove_sandbox_dir(sandbox_dir: Path, id_map: dict | None) -> None:
    try:
        state.force_rmtree(sandbox_dir)
    except OSError:
        if not id_map or not id_map.get("helper"):
            raise
        reply, _ = LAUNCHER.request({"op": "rmtree", "spec": {"idmap": id_map}, "path": str(sandbox_dir)}, max_fds=0)
        if not reply.get("ok"):
            raise SandboxSetupError(f"could not remove {sandbox_dir}: {reply.get('error')}") from None
