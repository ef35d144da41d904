"""``Sandbox``: a jail that lives until closed and runs many commands."""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import math
import os
import posixpath
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from . import files, layers, snapshots
from .channel import Channel
from .child.requests import MAX_WALK_ENTRIES, ExecRequest, RunAs
from .config import SandboxConfig, check_env, jail_path
from .errors import BranchError, ConfigError, ExecError, SandboxClosed, SandboxPaused
from .execution import ExecRun, Stdin, TtyCommand, run_sync
from .jail import Jail
from .limits import PORT_CONNECT_WAIT
from .limits.enforcement import render
from .net.policy import NetworkPolicy, first_error
from .results import ExecResult, SandboxStats, SandboxUsage

if TYPE_CHECKING:
    from .interpreter import CodeContext, Execution, ExecutionError, Interpreter, OutputMessage, Record, Result
    from .net.proxy import NetworkLogEntry
    from .net.secrets import Vault
    from .snapshots import Snapshot

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BASE_ENV = {"PATH": DEFAULT_PATH, "HOME": "/root", "LANG": "C.UTF-8", "TERM": "xterm"}

Command = str | list[str] | tuple[str, ...]
FORK_THREADS = 8  # jails a fork builds at once


class JailSource(Protocol):
    """Where an adopted ``Sandbox`` gets a fresh jail on ``reset()`` and hands its jails back (a
    ``SandboxPool``, which builds them ahead of time and tears them down in the background)."""

    def acquire(self) -> Sandbox: ...

    def retire(self, jail: Jail) -> None: ...


class _Cuts:
    """Cuts under way (checkpoint, fork, snapshot): the jail is paused for each, and a call made
    meanwhile waits for them to end rather than failing as on a paused sandbox."""

    def __init__(self) -> None:
        self._under_way = 0
        self._ended = threading.Condition()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        with self._ended:
            self._under_way += 1
        try:
            yield
        finally:
            with self._ended:
                self._under_way -= 1
                self._ended.notify_all()

    def wait(self) -> None:
        with self._ended:
            self._ended.wait_for(lambda: self._under_way == 0)


class Sandbox:
    """A jail: ``with Sandbox() as sb: sb.exec("echo hi")``. Thread-safe; ``close()`` is idempotent."""

    def __init__(self, config: SandboxConfig | None = None, **options: Any) -> None:
        if config is not None and options:
            config = config.model_copy(update=options)
            config = SandboxConfig.model_validate(config.model_dump())
        self.config = config if config is not None else SandboxConfig(**options)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._closed = False
        self._source: JailSource | None = None
        self._stats = SandboxStats()
        self._checkpoints: list[layers.Checkpoint] = []  # oldest first
        self._cuts = _Cuts()
        self._interpreter: Interpreter | None = None
        self._jail = Jail(self.config)
        self.config = self._jail.config

    @classmethod
    def adopt(cls, jail: Jail, source: JailSource) -> Sandbox:
        """A sandbox around a jail ``source`` built ahead of time; its later jails come from
        ``source`` too, and go back to it when reset or closed."""
        sb = cls.__new__(cls)
        sb.config = jail.config
        sb._ids = itertools.count(1)
        sb._lock = threading.Lock()
        sb._closed = False
        sb._source = source
        sb._stats = SandboxStats()
        sb._checkpoints = []
        sb._cuts = _Cuts()
        sb._interpreter = None
        sb._jail = jail
        return sb

    @classmethod
    def _over(cls, config: SandboxConfig, below: tuple[layers.Layer, ...], vault: Vault | None) -> Sandbox:
        """A sandbox of ``config`` whose filesystem starts from ``below`` (a fork's child), with the
        secrets' placeholders and CA its files were made with."""
        sb = cls.__new__(cls)
        sb.config = config
        sb._ids = itertools.count(1)
        sb._lock = threading.Lock()
        sb._closed = False
        sb._source = None
        sb._stats = SandboxStats()
        sb._checkpoints = []
        sb._cuts = _Cuts()
        sb._interpreter = None
        sb._jail = Jail(config, below, vault)
        return sb

    @property
    def id(self) -> str:
        return self._jail.id

    @property
    def dir(self) -> Path | None:
        """The state directory holding the disk writable layer (None with a tmpfs layer)."""
        return self._jail.dir

    @property
    def init_pid(self) -> int:
        return self._jail.init_pid

    @property
    def enforcement(self) -> dict[str, str]:
        """How each resource limit is enforced on this host (or "not enforced: why")."""
        return render(self._jail.enforcement.values())

    @property
    def _channel(self) -> Channel:
        return self._jail.channel

    # --- commands -----------------------------------------------------------------------------

    def begin_exec(
        self,
        cmd: Command,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        stdin: str | Stdin | None = None,
        on_stdout: Callable[[bytes], None] | None = None,
        on_stderr: Callable[[bytes], None] | None = None,
        user: str | None = None,
    ) -> ExecRun:
        """Start ``cmd`` and return it in flight, for a driver of its own (``exec()`` polls it,
        ``AsyncSandbox`` drives it from the event loop). Its result counts in ``stats()`` once
        the driver has finished it. ``stdin`` may be the read end of an ``os.pipe()`` that the
        driver feeds as it goes (a copy goes to the command; the caller closes its own). ``user``:
        a user of the tree to run as instead of ``config.user`` (``root``, ``NAME``, ``UID:GID``)."""
        self._check_running()
        argv: tuple[str, ...] | None = None
        shell: str | None = None
        if isinstance(cmd, str):
            shell = cmd
        else:
            argv = tuple(cmd)
            if not argv or not all(isinstance(a, str) for a in argv):
                raise ExecError("cmd must be a shell string or a non-empty list of strings")
        if "\0" in (shell or "".join(argv or ())):
            raise ExecError("command contains a NUL byte")
        request = self._exec_request(
            argv, shell, self._abs(cwd) if cwd else self.config.workdir, env, tty=False, user=user
        )
        data = stdin.encode() if isinstance(stdin, str) else stdin
        counters = self._jail.counters
        return ExecRun(
            self._channel,
            request,
            data,
            self.config.output_limit,
            on_stdout,
            on_stderr,
            counters,
            on_result=self._account,
            paused=self._jail.pausing.paused_for,
        )

    def exec(
        self,
        cmd: Command,
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        stdin: str | Stdin | None = None,
        on_stdout: Callable[[bytes], None] | None = None,
        on_stderr: Callable[[bytes], None] | None = None,
        user: str | None = None,
    ) -> ExecResult:
        """Run ``cmd`` (a shell string for bash/sh, or an argv list) and wait for its own process.

        ``stdin``: text, bytes, or a host binary stream (a pipe, a file) copied to the command as it reads.

        On ``timeout`` the command's whole tree is killed, daemonised descendants included, and the
        result says ``timed_out``. Background processes it starts on purpose keep running.

        ``user``: run as this user of the tree instead of ``config.user`` (``root``, ``NAME``, ``UID:GID``).
        """
        return run_sync(self.begin_exec(cmd, cwd, env, stdin, on_stdout, on_stderr, user), timeout)

    def _account(self, result: ExecResult) -> None:
        with self._lock:
            self._stats.add(result)

    def stats(self) -> SandboxStats:
        """Totals over every command this sandbox has run (since the last ``reset()``)."""
        with self._lock:
            return self._stats.model_copy(deep=True)

    def usage(self) -> SandboxUsage:
        """What the sandbox uses now: CPU (time so far, and its share of ``cpu_count`` CPUs since the
        previous call), memory and its writable layer, each against its limit (the host's where it
        has none). From its cgroup where one counts it, else from its processes in ``/proc``; a
        paused sandbox reads as it stands. ``SandboxClosed`` once closed."""
        from .limits import usage as measure  # here: a command line that makes a jail never asks

        self._check_open()
        jail = self._jail
        reading = jail.usage()
        now = time.clock_gettime(time.CLOCK_BOOTTIME)
        limits = self.config.limits
        cpus = math.ceil(limits.cpus) if limits.cpus is not None else os.cpu_count() or 1
        with self._lock:
            since, before = jail.usage_mark or (measure.started(jail.init_pid) or now, 0.0)
            jail.usage_mark = (now, reading.cpu_seconds)
        share = (reading.cpu_seconds - before) / (now - since) / cpus if now > since else 0.0
        return SandboxUsage(
            timestamp=datetime.now(timezone.utc),
            cpu_count=cpus,
            cpu_seconds=reading.cpu_seconds,
            cpu_used_pct=round(min(100.0, max(0.0, share * 100)), 2),
            memory_used=reading.memory,
            memory_cache=reading.cache,
            memory_total=limits.memory or measure.host_memory(),
            disk_used=reading.disk,
            disk_total=limits.disk,
        )

    def exec_tty(self, argv: list[str], env: dict[str, str] | None = None, user: str | None = None) -> TtyCommand:
        """Start ``argv`` as session leader on a new pty inside the jail (for interactive shells),
        as ``user`` of the tree if given, else ``config.user``."""
        self._check_running()
        request = self._exec_request(tuple(argv), None, self.config.workdir, env, tty=True, user=user)
        return TtyCommand(self._channel.open_call(request))

    def _exec_request(
        self,
        argv: tuple[str, ...] | None,
        shell: str | None,
        cwd: str,
        env: dict[str, str] | None,
        tty: bool,
        user: str | None = None,
    ) -> ExecRequest:
        """A command for the init: the caller's environment over the sandbox's, as the jail's user
        or ``user`` (looked up in the tree; uid 0 is the init's own ids, no switch)."""
        if user is None:
            run_as, user_env = self._jail.user, self._jail.user_env
        else:
            if not isinstance(user, str) or not 0 < len(user) <= 64 or "\0" in user:
                raise ExecError(f"user must be a user of the root filesystem, e.g. 'root' or '1000:1000', not {user!r}")
            found = self._jail.run_as(user)
            run_as = None if (found.uid, found.gid) == (0, 0) else found
            user_env = {"HOME": found.home}
        return ExecRequest(
            id=next(self._ids),
            argv=argv,
            shell=shell,
            cwd=cwd,
            env={**BASE_ENV, **self._jail.env, **user_env, **self.config.env, **check_env(dict(env or {}))},
            tty=tty,
            user=None if run_as is None else RunAs(run_as.uid, run_as.gid, run_as.groups),
        )

    def set_network(self, policy: NetworkPolicy | str) -> None:
        """Change what an ``allow`` sandbox may reach while it runs (``"allow:pypi,!files.pythonhosted.org"``
        or a ``NetworkPolicy``): every request made from now on is decided by the new rules; connections
        already open stay open. The mode cannot change (a ``none`` sandbox cannot become ``allow``), and
        the new policy is kept through ``reset()``, ``rollback()`` and ``fork()``."""
        self._check_open()
        if not isinstance(policy, (str, NetworkPolicy)):
            raise ConfigError(f"set_network takes a NetworkPolicy or a string such as 'allow:pypi', not {policy!r:.60}")
        try:  # a policy made without validation (model_construct) is held to the same bounds
            policy = (
                NetworkPolicy.parse(policy) if isinstance(policy, str) else NetworkPolicy.model_validate(dict(policy))
            )
        except ValueError as exc:
            raise ConfigError(f"set_network: {first_error(exc)} (e.g. 'allow:pypi,github')") from None
        with self._lock:
            self._jail.set_network(policy)
            self.config = self.config.model_copy(update={"network": policy})

    def network_log(self) -> list[NetworkLogEntry]:
        """Every request through the ``allow`` proxy since the jail was made (or last ``reset()``):
        time, method, host, port, verdict, reason, bytes each way. Empty in other modes."""
        return self._jail.network.log()

    # --- code interpreter ----------------------------------------------------------------------

    def _code(self) -> Interpreter:
        """The sandbox's interpreter, made on first use; its gateway starts with the first call."""
        self._check_running()
        from .interpreter import Interpreter  # here: pydantic models the CLI's exec path never needs

        with self._lock:
            if self._interpreter is None:
                self._interpreter = Interpreter(self)
            return self._interpreter

    def start_interpreter(self) -> None:
        """Start the code interpreter (its gateway and the default context's kernel) now, in the
        background, so that the first ``run_code`` waits only for what is left of the start
        (``SandboxPool(interpreter=True)`` does this for its ready sandboxes). Does nothing if it
        runs already."""
        self._code().start()

    def run_code(
        self,
        code: str,
        language: str | None = None,
        context: CodeContext | str | None = None,
        on_stdout: Callable[[OutputMessage], Any] | None = None,
        on_stderr: Callable[[OutputMessage], Any] | None = None,
        on_result: Callable[[Result], Any] | None = None,
        on_error: Callable[[ExecutionError], Any] | None = None,
        envs: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> Execution:
        """Run ``code`` in a Jupyter kernel inside the jail, as a notebook cell: variables and imports
        stay for the next call in the same context (the default one if none is given). ``envs`` are
        set for this run only. Past ``timeout`` (300 s if None, no limit if 0) the kernel is interrupted and
        ``InterpreterTimeout`` raised; the context keeps working. The callbacks get each output as
        it comes. Needs ipykernel in the jail's root filesystem (docs/code-interpreter.md)."""
        return self._code().run(code, language, context, on_stdout, on_stderr, on_result, on_error, envs, timeout)

    def stream_code(
        self,
        code: str,
        language: str | None = None,
        context: CodeContext | str | None = None,
        envs: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> Iterator[Record]:
        """``run_code``'s records as they come, each one of e2b-code-interpreter's ``/execute`` lines
        (``interpreter.to_line(record)`` is its JSON), the last an ``end_of_execution``. Closing the
        iterator before that interrupts the code (a client that went away)."""
        return self._code().stream(code, language, context, envs, timeout)

    def interrupt_code(self, context: CodeContext | str | None = None) -> None:
        """SIGINT to the context's kernel (the default one if None), if the interpreter runs: the run
        in flight there raises ``KeyboardInterrupt`` and ends with that error; the context stays.
        For a run another thread waits on (a server whose client went away)."""
        interpreter = self._interpreter
        if interpreter is not None:
            interpreter.interrupt(context)

    def create_code_context(self, cwd: str | None = None, language: str | None = None) -> CodeContext:
        """A new kernel with state of its own, started in ``cwd`` (the sandbox's workdir if None)."""
        return self._code().create(cwd, language)

    def list_code_contexts(self) -> list[CodeContext]:
        """The contexts alive, the default one first."""
        return self._code().list()

    def restart_code_context(self, context: CodeContext | str) -> None:
        """Restart the context's kernel: its variables and imports are gone, its id stays."""
        self._code().control("restart", context)

    def remove_code_context(self, context: CodeContext | str) -> None:
        """End the context's kernel; its id is unknown afterwards."""
        self._code().control("remove", context)

    # --- ports --------------------------------------------------------------------------------

    def connect_port(self, port: int, timeout: float = PORT_CONNECT_WAIT) -> socket.socket:
        """A TCP connection to ``port`` on the jail's own loopback (what a server in the jail bound to
        127.0.0.1 or ::1, or to every address, listens on), in every network mode, ``none`` too: the
        jail's init connects from inside and hands the socket over, and it is checked here before it
        is returned (``ports.py``). Connected and non-blocking; the caller closes it.
        ``ConnectionRefusedError`` if nothing listens there, ``TimeoutError`` past ``timeout`` seconds."""
        from . import ports  # here: only what relays a port to the host needs it

        self._check_running()
        return ports.connect(self._channel, port, timeout)

    # --- files --------------------------------------------------------------------------------

    def _abs(self, path: str) -> str:
        return jail_path(path if path.startswith("/") else posixpath.join(self.config.workdir, path))

    def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        """Read a regular file as the jail sees it (symlinks resolve inside the jail); one larger than
        ``max_bytes`` (64 MiB if None) is refused with ``SandboxFileError`` (EFBIG)."""
        self._check_running()
        return files.read_file(self._channel, self._abs(path), max_bytes)

    def write_file(self, path: str, data: bytes | str | Iterable[bytes], mode: int = 0o644) -> None:
        """Create or replace a file inside the jail, creating parent directories. ``data`` may be an
        iterable of chunks, written as each comes."""
        self._check_running()
        files.write_file(self._channel, self._abs(path), data.encode() if isinstance(data, str) else data, mode)

    def put(
        self, src: str | os.PathLike[str], dst: str, max_entries: int = MAX_WALK_ENTRIES, max_bytes: int | None = None
    ) -> None:
        """Copy a host file or directory tree to ``dst`` (the path the copy gets) in the jail. ``src`` is
        followed as given, nothing below it: a link in the tree is copied as a link, and the tree is read
        from held descriptors, so a jail rewriting it meanwhile cannot swap a host directory in. At most
        ``max_entries`` entries and (if given) ``max_bytes`` bytes of files; over either, SandboxFileError."""
        self._check_running()
        files.put(self._channel, Path(src), self._abs(dst), max_entries, max_bytes)

    def get(self, src: str, dst: str | os.PathLike[str]) -> None:
        """Copy a jail file or directory tree to ``dst`` (the path the copy gets) on the host."""
        self._check_running()
        files.get(self._channel, self._abs(src), Path(dst))

    # --- branching ----------------------------------------------------------------------------

    def checkpoint(self) -> layers.Checkpoint:
        """The filesystem as it is now, to ``rollback()`` to later. Processes are not part of it.
        Its cost is a copy of what the sandbox wrote since it started (or last rolled back):
        the layers below are shared. Checkpoints nest."""
        self._check_open()
        with self._frozen():
            cut = layers.cut(self._jail)
            try:
                cp = layers.Checkpoint(cut, self)
            finally:
                cut[0].release()  # the checkpoint holds it now
            with self._lock:  # within the cut: close() waits for it, then drops what is listed
                self._checkpoints.append(cp)
        return cp

    def rollback(self, checkpoint: layers.Checkpoint) -> None:
        """Go back to ``checkpoint``'s filesystem: every process is ended, and fresh ones start over
        it, with the same configuration and bounds (as ``reset()``: the jail, and so ``id``, are
        new). Checkpoints taken after it are dropped; it stays valid, to roll back to again."""
        self._check_open()
        if checkpoint.owner is not self:
            raise BranchError("rollback: that checkpoint is of another sandbox; take one with sb.checkpoint()")
        if not checkpoint.valid:
            raise BranchError("rollback: that checkpoint was dropped (cp.drop(), a rollback to an older one, close())")
        fresh = Jail(self.config, checkpoint.layers, self._jail.vault)  # a failure leaves the sandbox as it was
        with self._lock:
            old, self._jail = self._jail, fresh
            self._ids = itertools.count(1)
            self._stats = SandboxStats()
            newer = self._checkpoints[self._checkpoints.index(checkpoint) + 1 :]
            del self._checkpoints[len(self._checkpoints) - len(newer) :]
        for dropped in newer:
            dropped.drop()
        self._retire(old)

    def fork(self, n: int) -> list[Sandbox]:
        """``n`` new sandboxes, each starting from this one's filesystem now, with its configuration;
        each a jail of its own (init, ids, bounds), closed on its own. This one keeps running.
        The children share the cut read-only; what each writes, only it sees (and its disk bound
        counts). All or nothing: a child that fails ends the others."""
        self._check_open()
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise BranchError(f"fork: n must be a positive count of children, e.g. fork(4), not {n!r}")
        with self._frozen():
            cut = layers.cut(self._jail)
        try:
            # built side by side: each jail's setup waits on its init, and the launcher takes requests
            # from any number of threads
            with concurrent.futures.ThreadPoolExecutor(min(n, FORK_THREADS), "jailbox-fork") as pool:
                futures = [pool.submit(Sandbox._over, self.config, cut, self._jail.vault) for _ in range(n)]
                concurrent.futures.wait(futures)
        finally:
            cut[0].release()  # the children hold it now
        children = [f.result() for f in futures if f.exception() is None]
        failed = next((f.exception() for f in futures if f.exception() is not None), None)
        if failed is not None:
            for child in children:
                child.close()
            raise failed
        return children

    def snapshot(self, name: str | None = None) -> Snapshot:
        """Keep the filesystem as it is now in the user's store, to start sandboxes from later
        (``Sandbox(snapshot=snap.id)``, or its ``name``), past this sandbox and this process.
        Processes are not part of it; read-write binds are the host's, not kept. A name given
        before moves to this snapshot. Listing and removal: ``jailbox.snapshots``."""
        self._check_open()
        if name is not None:
            snapshots.check_name(name)
        with self._frozen():
            return snapshots.take(self._jail, self._jail.id, name)

    @contextlib.contextmanager
    def _frozen(self) -> Iterator[None]:
        """The jail held still for a cut, so the copy is the filesystem at one instant: paused for
        it (``pause()``), and resumed after unless it was paused already. A jail that cannot be
        stopped whole raises ``PauseFailed`` and is cut nowhere."""
        with self._cuts.held():
            self._check_open()  # close() waits for cuts under way, and none starts after it
            pausing = self._jail.pausing
            stopped = pausing.pause()
            try:
                yield
            finally:
                if stopped:
                    pausing.resume()

    # --- lifetime -----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxClosed("the sandbox is closed")

    def _check_running(self) -> None:
        self._check_open()
        self._cuts.wait()  # a call made during a cut runs after it: the cut is the state before it
        if self._jail.pausing.paused:
            raise SandboxPaused(f"sandbox {self.id} is paused: call resume() first (CLI: jailbox resume {self.id})")

    @property
    def paused(self) -> bool:
        return self._jail.pausing.paused

    def pause(self) -> bool:
        """Stop every process of the jail: nothing in it runs or uses a CPU until ``resume()``; its
        processes, memory and files stay as they are. A command in flight waits, and its timeout
        does not count the pause; ``exec()`` and the file calls raise ``SandboxPaused`` meanwhile.
        The cgroup freezer where the sandbox has a cgroup, else SIGSTOP and ptrace from the host
        (``pause.py``); ``PauseFailed`` (the sandbox left running) if the jail could not be stopped
        whole in time, ``SandboxClosed`` if its init has died. Returns False, doing nothing, if it
        was paused already."""
        self._check_open()
        return self._jail.pausing.pause()

    def resume(self) -> bool:
        """Continue what ``pause()`` stopped; False, doing nothing, if the sandbox was not paused.
        ``close()`` and ``reset()`` of a paused sandbox need no ``resume()``."""
        self._check_open()
        return self._jail.pausing.resume()

    @property
    def closed(self) -> bool:
        return self._closed

    def reset(self) -> None:
        """Start over: every process killed, a fresh writable layer, same configuration.

        From a ``SandboxPool`` this swaps in the jail of one of its ready sandboxes (with its code
        interpreter, if the pool starts them ahead) and retires the old one in the background;
        otherwise it builds a new jail and tears the old one down.
        """
        self._check_open()
        started: Interpreter | None = None
        if self._source is not None:
            ready = self._source.acquire()  # handed out once: its jail and its interpreter are this one's now
            fresh, started = ready._jail, ready._interpreter
        else:
            fresh = Jail(self.config, vault=self._jail.vault)
        if fresh.config.network != self.config.network:  # a pool's jail, and this sandbox's rules were changed
            try:
                fresh.set_network(self.config.network)
            except BaseException:
                if started is not None:
                    started.close()
                self._retire(fresh)
                raise
        if started is not None:
            started.sb = self
        with self._lock:
            old, self._jail = self._jail, fresh
            previous, self._interpreter = self._interpreter, started
            self._ids = itertools.count(1)
            self._stats = SandboxStats()
        if previous is not None:  # its gateway ends before its jail is retired
            previous.close()
        self._retire(old)

    def _retire(self, old: Jail) -> None:
        self._cuts.wait()  # a cut under way may be reading ``old``'s writable layer
        if self._source is not None:
            self._source.retire(old)
        else:
            old.close()

    def close(self) -> None:
        """Kill every process of the jail and remove its mounts, writable layer and state."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._cuts.wait()  # a cut under way reads the jail's writable layer through its descriptor
        with self._lock:
            dropped, self._checkpoints = self._checkpoints, []
            interpreter, self._interpreter = self._interpreter, None
        self._retire(self._jail)
        if interpreter is not None:  # its gateway died with the jail: this joins the thread that read it
            interpreter.close()
        for checkpoint in dropped:
            checkpoint.drop()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Sandbox {self.id} rootfs={self.config.rootfs!r} {'closed' if self._closed else 'open'}>"
