"""Extra CA certificates a jail trusts (``SandboxConfig.ca_certs``), read and checked in the user's process.

Only the user's own files are read here; the tree's bundles are extended inside the jail, at setup
(``child/trust.py``). Each file is bounded, must hold at least one PEM certificate that OpenSSL
accepts, and only its ``CERTIFICATE`` blocks travel on: a private key that shares the file never
reaches the jail.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path

MAX_FILE = 1 << 20  # a bundle of a few hundred certificates; a CA file of its own is a few KiB
MAX_FILES = 32
EXAMPLE = "--ca-cert /usr/local/share/ca-certificates/proxy.crt"
_BLOCK = re.compile(rb"-----BEGIN CERTIFICATE-----\r?\n[A-Za-z0-9+/=\r\n]+-----END CERTIFICATE-----")


def read_pem(path: Path) -> str:
    """The certificates of one PEM file, each block on its own lines; a ValueError naming the file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise ValueError(f"cannot read CA certificate file {path}: {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or device would block or never end
        os.close(fd)
        raise ValueError(f"CA certificate file {path} is not a regular file")
    with os.fdopen(fd, "rb") as file:
        data = file.read(MAX_FILE + 1)
    if len(data) > MAX_FILE:
        raise ValueError(f"CA certificate file {path} is larger than {MAX_FILE} bytes")
    blocks = [b.replace(b"\r", b"").decode() for b in _BLOCK.findall(data)]
    if not blocks:
        raise ValueError(f"{path} holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
    text = "\n".join(blocks) + "\n"
    import ssl  # only when there are certificates: every SandboxConfig loads this module, `jailbox exec` included

    try:
        ssl.create_default_context(cadata=text)
    except ssl.SSLError as exc:
        raise ValueError(f"{path}: OpenSSL refused its certificates ({exc.reason or exc})") from None
    return text


def bundle(paths: Iterable[Path]) -> str:
    """All the files' certificates, in order: what the jail's bundles get appended."""
    paths = list(paths)
    if len(paths) > MAX_FILES:
        raise ValueError(f"at most {MAX_FILES} CA certificate files")
    return "".join(read_pem(p) for p in paths)
