"""Runs in the short-lived ``python -I -S`` process that becomes slirp4netns: it puts slirp4netns's
outbound calls under the host's seccomp filter (``net/egress.py``), lets the host process take the
filter's listener (``pidfd_getfd``: passing it by ``sendmsg`` would be a call the filter stops), and
executes slirp4netns in its own place (same pid).

Stdlib and ``floor`` only (no site-packages here). The filter is loaded before ``execve`` and
inherited by every process slirp4netns starts; nothing it does later can remove it. This process
keeps no copy of the listener: the host's is the only one, so when the host's supervisor is gone,
every call the filter traps fails (ENOSYS) instead of running unchecked.
"""

from __future__ import annotations

import os
import socket
import sys

from ..floor import linux as L


def main(argv: list[str]) -> None:
    """``argv``: the socket's descriptor, the BPF program in hex, then slirp4netns's argv."""
    sock_fd, program, *command = argv
    with socket.socket(fileno=int(sock_fd)) as sock:
        try:
            L.prctl(L.PR_SET_NO_NEW_PRIVS, 1)
            listener = L.install_seccomp(bytes.fromhex(program), listener=True)
        except OSError as exc:
            sock.sendall(f"0{exc}".encode())
            sys.exit(1)
        sock.sendall(f"1{listener}".encode())
        if sock.recv(1) != b"1":  # the host has its copy (or is gone: then so is the supervisor)
            sys.exit(1)
        os.close(listener)
    os.execv(command[0], command)
