"""Child side: append the user's CA certificates to the root filesystem's CA bundles.

Runs in the jail's init during setup, as root of its user namespace, on the bare overlay: after it
is mounted and before /proc, /dev or any bind is, so a path can only ever reach the tree itself.
The tree may be a hostile image: each bundle is opened with ``openat2(RESOLVE_IN_ROOT)``, must be a
regular file, and is written through the overlay, which copies it up into the writable layer (the
stored tree is never written). Stdlib only.

The bundles are the ones TLS clients read without being told: OpenSSL's and curl's, git's and
apt's (the system bundle of Debian, Alpine or Fedora), and certifi's copies in Python's
site-packages (``requests``, pip's vendored one). Nothing in the environment changes: a command
sees the same variables as without extra certificates.
"""

from __future__ import annotations

import errno
import os
import re
import stat

from ..floor import linux as L

SYSTEM_BUNDLES = (
    "/etc/ssl/certs/ca-certificates.crt",  # Debian, Ubuntu, Alpine, Arch
    "/etc/pki/tls/certs/ca-bundle.crt",  # Fedora, RHEL
    "/etc/ssl/cert.pem",  # Alpine's and others' OpenSSL default file
)
PYTHON_LIBS = ("/usr/local/lib", "/usr/lib")  # where python3.X/site-packages live (an image's own, the distro's)
PYTHON_DIR = re.compile(r"python3(\.\d{1,3})?")
CERTIFI = ("certifi/cacert.pem", "pip/_vendor/certifi/cacert.pem")
MAX_BUNDLE = 16 << 20  # larger is no CA bundle: copying it up would only cost the jail's disk
MAX_PYTHONS = 16  # python3.X directories looked in per library directory
SKIP = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EXDEV)  # no such bundle in this tree


def append(root_fd: int, pem: str) -> list[str]:
    """Append ``pem`` to every bundle the tree has (each file once, however many paths lead to it);
    the paths written, resolved inside the root."""
    done: list[str] = []
    for path in candidates(root_fd):
        try:
            fd = L.open_in_root(root_fd, path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
        except OSError as exc:
            if exc.errno in SKIP:
                continue
            raise
        try:
            st = os.fstat(fd)
            real = os.readlink(f"/proc/self/fd/{fd}")
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_BUNDLE or real in done:
                continue
            # the last byte, so the appended block starts on a line of its own
            newline = st.st_size == 0 or os.pread(fd, 1, st.st_size - 1) == b"\n"
        finally:
            os.close(fd)
        # opened for writing by the path it resolved to (a plain file of the overlay, checked above):
        # the overlay copies the file up into the writable layer first
        fd = L.open_in_root(root_fd, path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK | os.O_NOCTTY)
        try:
            _write_all(fd, ("" if newline else "\n") + pem)
        finally:
            os.close(fd)
        done.append(real)
    return done


def candidates(root_fd: int) -> list[str]:
    """The system bundles, then certifi's in each ``python3.X`` site-packages and dist-packages."""
    paths = list(SYSTEM_BUNDLES)
    for lib in PYTHON_LIBS:
        try:
            fd = L.open_in_root(root_fd, lib, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            if exc.errno in SKIP:
                continue
            raise
        try:
            names = sorted(name for name in os.listdir(fd) if PYTHON_DIR.fullmatch(name))[:MAX_PYTHONS]
        finally:
            os.close(fd)
        paths += [f"{lib}/{name}/{packages}/{rel}" for name in names
                  for packages in ("site-packages", "dist-packages") for rel in CERTIFI]  # fmt: skip
    return paths


def _write_all(fd: int, text: str) -> None:
    data = memoryview(text.encode())
    while data:
        data = data[os.write(fd, data) :]
