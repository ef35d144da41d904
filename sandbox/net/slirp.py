"""Host side of ``full`` mode: slirp4netns gives the jail's namespace a user-mode TCP/IP stack.

slirp4netns runs as the calling user and joins the jail's user and network namespaces through
descriptors the init handed over (``/proc/self/fd/N``: the init is not dumpable, so its
``/proc/PID/ns`` links are out of reach of an unprivileged host process). It creates ``tap0``
(10.0.2.100/24, gateway 10.0.2.2, DNS 10.0.2.3) and refuses connections to the host's loopback
(``--disable-host-loopback``); the init's unreachable routes keep the host's LAN out of the jail's
own calls. Frames the jail writes past its routes (packet and raw sockets) are held where they
meet the host: every destination slirp4netns opens a host socket for is checked by ``egress.py``,
under whose seccomp filter it starts (``slirp_exec.py``). It parses the jail's packets, so it also
runs under its own seccomp filter (as root also in its own mount namespace without capabilities:
``--enable-sandbox`` fails rootless at ``setegid``).

Its lifetime follows the sandbox through ``--exit-fd``: a pipe whose write end only this process
holds, so slirp4netns exits on ``close()`` and when this process dies, however it dies.
(``PR_SET_PDEATHSIG`` would fire when the *thread* that started it exits, and sandboxes are often
created from worker threads.)
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time

from ..errors import SandboxSetupError
from ..floor import boot, wire
from ..floor import linux as L
from .egress import EgressGuard, slirp_filter
from .policy import IPNetwork, PortMapping

TUN = "/dev/net/tun"
MTU = 65520
EXIT_WAIT = 2.0
API_ATTEMPTS = 50


class Slirp:
    def __init__(
        self, ns_fds: list[int], publish: tuple[PortMapping, ...], lan: tuple[IPNetwork, ...], timeout: float
    ) -> None:
        binary = shutil.which("slirp4netns")
        if binary is None:
            for fd in ns_fds:
                os.close(fd)
            raise SandboxSetupError(
                "network 'full' needs slirp4netns, which is not installed: sudo apt-get install slirp4netns"
            )
        if not os.access(TUN, os.R_OK | os.W_OK):
            for fd in ns_fds:
                os.close(fd)
            raise SandboxSetupError(
                f"network 'full' needs {TUN}, which this user cannot open (Debian's udev makes it mode 0666; "
                f"this host has {_mode(TUN)}): sudo chmod 0666 {TUN}"
            )
        ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
        exit_r, self._exit_w = os.pipe2(os.O_CLOEXEC)
        log = os.memfd_create("jailbox-slirp-log", os.MFD_CLOEXEC)
        api_dir = tempfile.mkdtemp(prefix="jailbox-slirp-") if publish else None
        args = [binary, "--configure", f"--mtu={MTU}", "--disable-host-loopback"]
        if os.getuid() == 0:  # its own mount namespace, capabilities dropped (fails rootless: setegid)
            args.append("--enable-sandbox")
        args += ["--enable-seccomp", f"--ready-fd={ready_w}", f"--exit-fd={exit_r}", "--netns-type=path"]
        if api_dir is not None:
            args.append(f"--api-socket={api_dir}/api.sock")
        if len(ns_fds) == 2:
            args.append(f"--userns-path=/proc/self/fd/{ns_fds[1]}")
        args += [f"/proc/self/fd/{ns_fds[0]}", "tap0"]
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.guard: EgressGuard | None = None
        try:
            self.proc = subprocess.Popen(
                boot.command("sandbox.net.slirp_exec", str(theirs.fileno()), slirp_filter().hex(), *args),
                pass_fds=[ready_w, exit_r, theirs.fileno(), *ns_fds],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
            )
        except OSError as exc:
            for fd in (ready_r, ready_w, exit_r, self._exit_w, log):
                os.close(fd)
            ours.close()
            raise SandboxSetupError(f"could not start slirp4netns: {exc}") from exc
        finally:
            theirs.close()
            for fd in ns_fds:
                os.close(fd)
        os.close(ready_w)
        os.close(exit_r)
        try:
            self.guard = EgressGuard(_listener(ours, self.proc.pid, timeout), self.proc.pid, lan)
            ready = wire.wait_readable(ready_r, timeout) and os.read(ready_r, 1) == b"1"
            if not ready:
                raise SandboxSetupError(f"slirp4netns did not come up: {_tail(log) or 'no output'}")
            if api_dir is not None:
                for mapping in publish:
                    _add_hostfwd(f"{api_dir}/api.sock", mapping)
        except BaseException:
            self.close()
            raise
        finally:
            os.close(ready_r)
            os.close(log)
            if api_dir is not None:
                shutil.rmtree(api_dir, ignore_errors=True)  # slirp4netns keeps its listening socket

    def close(self) -> None:
        if self._exit_w >= 0:
            os.close(self._exit_w)
            self._exit_w = -1
        try:
            self.proc.wait(EXIT_WAIT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.guard is not None:
            self.guard.close()


def _listener(sock: socket.socket, pid: int, timeout: float) -> int:
    """A copy of the seccomp listener of ``slirp_exec`` (``pid``), taken before it becomes slirp4netns."""
    with sock:
        message = sock.recv(512) if wire.wait_readable(sock, timeout) else b"0not loaded in time"
        if not message.startswith(b"1") or not message[1:].isdigit():
            reason = message[1:].decode(errors="replace") or "it ended first"
            raise SandboxSetupError(f"could not put slirp4netns under jailbox's egress filter: {reason}")
        pidfd = os.pidfd_open(pid)
        try:
            listener = L.pidfd_getfd(pidfd, int(message[1:]))
        except OSError as exc:
            raise SandboxSetupError(
                f"could not take slirp4netns's filter listener: {exc} (network 'full' needs Linux 5.6 or later "
                "and ptrace access to your own children: kernel.yama.ptrace_scope at most 1)"
            ) from exc
        finally:
            os.close(pidfd)
        sock.sendall(b"1")
        return listener


def _add_hostfwd(path: str, mapping: PortMapping) -> None:
    request = {
        "execute": "add_hostfwd",
        "arguments": {
            "proto": mapping.proto,
            "host_addr": str(mapping.host_addr),
            "host_port": mapping.host_port,
            "guest_port": mapping.jail_port,
        },
    }
    for _ in range(API_ATTEMPTS):
        try:
            with socket.socket(socket.AF_UNIX) as api:
                api.settimeout(EXIT_WAIT)
                api.connect(path)
                api.sendall(json.dumps(request).encode())
                api.shutdown(socket.SHUT_WR)
                answer = api.recv(65536)
            break
        except (FileNotFoundError, ConnectionRefusedError):
            time.sleep(0.01)
    else:
        raise SandboxSetupError("slirp4netns's API socket never appeared")
    try:
        reply = json.loads(answer or b"{}")
    except ValueError:
        reply = {}
    if "return" not in reply:
        desc = reply.get("error", {}).get("desc") if isinstance(reply.get("error"), dict) else None
        raise SandboxSetupError(
            f"publishing {mapping.host_addr}:{mapping.host_port} -> {mapping.jail_port}/{mapping.proto}: "
            f"{desc or answer[:200]!r} (is the host port already in use?)"
        )


def _tail(fd: int) -> str:
    size = os.fstat(fd).st_size
    return os.pread(fd, 2000, max(0, size - 2000)).decode(errors="replace").strip()


def _mode(path: str) -> str:
    try:
        return f"mode {os.stat(path).st_mode & 0o777:04o}"
    except OSError as exc:
        return f"no usable device ({exc.strerror})"
