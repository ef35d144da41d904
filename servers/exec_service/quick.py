"""The fast path of ``jailbox exec [--] CMD...`` with no option before CMD, in the user's process (the
``jailbox`` console script, ``console.py``, calls it first): the command runs through the per-user
service, which keeps default sandboxes warm; anything else is handed back to the full CLI untouched.

Stdlib and ``floor/wire.py`` only: the point is to skip click and pydantic (``tests/test_cli_imports.py``
pins it). Nothing here decides what a sandbox is: the service runs the command in a fresh sandbox of the
default configuration and refuses (then the command runs here, in-process, as the full CLI runs it) when
this process's context differs from its own in anything a jail inherits (``context()``). Before the
service says the command started, nothing of it has run: any refusal, error or lost service until then
falls back to the full CLI (``fallback``, which never returns). Every reply is bounded
(``MAX_MESSAGE``) and checked for shape.

Also here, for the service's other clients and the service itself: the lock clients connect under and
the service retires under, and the plain connect.
"""

from __future__ import annotations

import atexit
import base64
import binascii
import contextlib
import fcntl
import os
import resource
import socket
import sys
from collections.abc import Callable
from typing import NoReturn

from ...sandbox.floor import wire

# The protocol's constants (``protocol.py`` imports them from here: this module may not import pydantic).
MAX_MESSAGE = 1 << 20
CHUNK = 32 * 1024  # raw bytes per data message: base64 of it still fits one inline seqpacket message
SOCKET_NAME = "service.sock"
LOCK_NAME = "service.lock"
START_LOCK_NAME = "service.start"  # held by a service this module started, for its whole life
LOG_NAME = "service.log"
LOG_MAX = 1 << 20  # bytes of log past which a new service starts a fresh one
MAX_ARG = 128 * 1024
MAX_ARGS = 4096
WARM = 2  # default sandboxes the service keeps ready for the fast path

OFF_ENV = "JAILBOX_NO_SERVICE"
IDLE_ENV = "JAILBOX_SERVICE_IDLE"
DEFAULT_IDLE = 300.0
LOCAL_ENV = (OFF_ENV, IDLE_ENV, "JAILBOX_STATE_DIR")  # how a client finds the service: not what a jail gets
SETTINGS_NAMES = ("config.yaml", "config.yml", "config.toml")  # cli/settings.py's _settings_path() reads the first
INTERRUPTED_EXIT = 1  # what click does on Ctrl-C: "Aborted!" and 1


def main(argv: list[str], fallback: Callable[[], NoReturn]) -> None:
    """Run ``jailbox ARGV`` through the service, or call ``fallback`` (the full CLI, in-process)."""
    command = fast_command(argv)
    base = _usable_state_dir() if command is not None and _may_go_fast() else None
    if command is None or base is None:
        fallback()
    try:
        try:
            with ServiceLock(base):
                sock = try_connect(base)
        except OSError:
            sock = None  # the full CLI's own checks name what is wrong
        if sock is None:
            # This call runs in-process; the service starts as it exits, for the calls after it (started
            # now, its imports and warm jails would compete with this call for the CPU).
            atexit.register(_start_detached, base)
            fallback()
        run(sock, command, base, fallback)
    except KeyboardInterrupt:  # we hang up by exiting: the service kills the command's whole tree
        with contextlib.suppress(OSError):
            _write(2, b"\nAborted!\n")
        os._exit(INTERRUPTED_EXIT)


def fast_command(argv: list[str]) -> list[str] | None:
    """The command of ``exec -- CMD...`` or ``exec CMD...`` when no option comes before it, else None. As
    the full CLI reads the line (options stop at the first word that is not one), everything from CMD on
    is the command's, dashes and all; an option before it, known or not, is the full CLI's to read."""
    if len(argv) < 2 or argv[0] != "exec":
        return None
    if argv[1] == "--":
        command = argv[2:]
    elif argv[1].startswith("-"):
        return None
    else:
        command = argv[1:]
    if not command or len(command) > MAX_ARGS:
        return None
    for arg in command:
        if len(arg) > MAX_ARG:
            return None
        try:
            arg.encode()  # an undecodable byte from the shell: the full CLI handles it as it always has
        except UnicodeEncodeError:
            return None
    return command


def _may_go_fast() -> bool:
    """Not turned off, no settings file (it may set exec's defaults), stdin a non-terminal (exec treats a
    terminal specially) and all three streams open."""
    if os.environ.get(OFF_ENV):
        return False
    config_home = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    if any(os.path.lexists(os.path.join(config_home, "jailbox", name)) for name in SETTINGS_NAMES):
        return False
    try:
        for fd in (0, 1, 2):
            os.fstat(fd)
    except OSError:
        return False
    return not os.isatty(0)


def _usable_state_dir() -> str | None:
    """``state.state_dir()``'s answer when it exists and is private; None sends the call to the full CLI,
    which makes it or says what is wrong with it."""
    if os.environ.get("JAILBOX_STATE_DIR"):
        base = os.environ["JAILBOX_STATE_DIR"]
    else:
        xdg = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
        base = os.path.join(xdg, "jailbox")
    base = os.path.abspath(base)  # the service it may start works from /
    try:
        st = os.stat(base)
    except OSError:
        return None
    if st.st_uid != os.getuid() or st.st_mode & 0o022 or len(os.fsencode(os.path.join(base, SOCKET_NAME))) > 107:
        return None
    return base


def context() -> dict[str, object]:
    """What a jail inherits from the process that makes it, beyond its configuration: the settings
    (``JAILBOX_*``), the cgroup it nests under, resource limits, umask, groups, CPUs and niceness. The
    service runs a fast command only when its own context is this one."""
    status = _read("/proc/self/status")
    umask = next((line.split()[1] for line in status.splitlines() if line.startswith("Umask:")), "")
    limits = sorted(name for name in dir(resource) if name.startswith("RLIMIT_"))
    return {
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("JAILBOX_") and k not in LOCAL_ENV},
        "cgroup": _read("/proc/self/cgroup"),
        "rlimits": {name: _limit(name) for name in limits},
        "umask": umask,
        "ids": [os.getuid(), os.getgid(), sorted(os.getgroups())],
        "cpus": sorted(os.sched_getaffinity(0)),
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
    }


def _limit(name: str) -> list[int]:
    soft, hard = resource.getrlimit(getattr(resource, name))
    if name in ("RLIMIT_NOFILE", "RLIMIT_OFILE"):
        return [hard]  # every holder lifts its soft limit to this before its first jail (launcher.py)
    return [soft, hard]


def _read(path: str) -> str:
    with open(path) as file:
        return file.read(64 * 1024)


# --- the run --------------------------------------------------------------------------------------


class Lost(Exception):
    """The service went away or answered nonsense after the command started."""


def run(sock: socket.socket, command: list[str], base: str, fallback: Callable[[], NoReturn]) -> NoReturn:
    """Send the command, stream stdin in and output out, exit as the full CLI would."""
    try:
        wire.send(sock, {"op": "run", "argv": command, "context": context()})
        started = _receive(sock)
    except (OSError, Lost):
        started = None
    if started is None or started.get("ok") is not True:
        sock.close()
        fallback()  # refused (another context), an error or no answer: nothing ran, so run it here
    import threading  # only now: a refused call never pays for it

    threading.Thread(target=_pump, args=(sock,), daemon=True).start()
    try:
        code = _drain(sock)
    except BrokenPipeError:
        sock.close()
        os._exit(141)  # our own stdout or stderr closed (| head): as the in-process run ends
    except Lost as exc:
        sock.close()
        _write(2, f"jailbox: lost the jailbox service ({exc}); see {os.path.join(base, LOG_NAME)}\n".encode())
        os._exit(125)
    os._exit(code)  # nothing is buffered: every write went straight to its descriptor


def _drain(sock: socket.socket) -> int:
    while True:
        try:
            reply = _receive(sock)
        except OSError as exc:
            raise Lost(str(exc)) from None
        if reply is None:
            raise Lost("it closed the connection")
        stream = reply.get("stream")
        if stream in ("stdout", "stderr") and isinstance(reply.get("data"), str):
            _write(1 if stream == "stdout" else 2, _decode(reply["data"]))
        elif type(reply.get("exit")) is int and -255 <= reply["exit"] <= 511:
            return int(reply["exit"])
        elif reply.get("ok") is False and isinstance(reply.get("error"), str):
            _write(2, f"jailbox: {reply['error'][:4096]}\n".encode())
            return 125
        else:
            raise Lost(f"unexpected message with keys {sorted(reply)[:8]}")


def _receive(sock: socket.socket) -> dict | None:
    try:
        got = wire.recv(sock, max_fds=0, max_bytes=MAX_MESSAGE)
    except wire.WireError as exc:
        raise Lost(str(exc)) from None
    return None if got is None else got[0]


def _decode(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise Lost("output that is not base64") from None


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _pump(sock: socket.socket) -> None:
    """Stdin to the service in bounded chunks; each send blocks until the service took the last one,
    which it does only once the command has read it, so memory stays bounded on both sides."""
    try:
        while True:
            data = os.read(0, CHUNK)
            if not data:
                break
            wire.send(sock, {"op": "stdin", "data": base64.b64encode(data).decode()})
        wire.send(sock, {"op": "eof"})
    except (OSError, ValueError):
        pass  # the command ended, or the connection did: the exit status says which


# --- finding and starting the service -------------------------------------------------------------


class ServiceLock:
    """``flock`` on the state directory's lock file; ``with`` gives whether it was taken."""

    def __init__(self, base: str | os.PathLike[str], blocking: bool = True, name: str = LOCK_NAME) -> None:
        self.path = os.path.join(base, name)
        self.blocking = blocking
        self.fd = -1

    def __enter__(self) -> bool:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | (0 if self.blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            return False
        return True

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)  # releases the lock, unless a started service holds a copy
        self.fd = -1


def try_connect(base: str | os.PathLike[str]) -> socket.socket | None:
    """A connection to the service listening in ``base``; None when none does. Other errors raise."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        sock.connect(os.path.join(base, SOCKET_NAME))
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    except OSError:
        sock.close()
        raise
    return sock


def service_argv(idle: float, warm: bool) -> list[str]:
    return [sys.executable, "-m", "jailbox.cli", "_service", "--idle", str(idle), *(["--warm"] if warm else [])]


def _start_detached(base: str) -> None:
    """Start the service for the calls after this one, unless one this module started still lives (it
    holds the start lock; it may be importing, or retiring): never a crowd of them from parallel calls.
    Its own session, no terminal, stdio to the log; the start lock goes along and is held until it exits."""
    raw = os.environ.get(IDLE_ENV, "")
    try:
        idle = float(raw) if raw else DEFAULT_IDLE
    except ValueError:
        return  # the full CLI's service commands say what is wrong with it
    if not 0 < idle <= 1e7:
        return
    start = ServiceLock(base, blocking=False, name=START_LOCK_NAME)
    try:
        if not start.__enter__():
            return
        import subprocess  # only on the call that starts the service

        path = os.path.join(base, LOG_NAME)
        try:
            if os.lstat(path).st_size > LOG_MAX:
                os.replace(path, path + ".1")  # the last service's log is kept, one before it is dropped
        except FileNotFoundError:
            pass
        log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            subprocess.Popen(
                service_argv(idle, warm=True),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                pass_fds=(start.fd,),
                start_new_session=True,
                env={**os.environ, "JAILBOX_STATE_DIR": base},
            )
        finally:
            os.close(log)
    except OSError:
        pass  # no service this time; this call runs in-process all the same
    finally:
        if start.fd >= 0:
            start.__exit__()
