"""The zero-setup root filesystem: the host's programs, none of the host's data.

A small skeleton directory (empty mount points, ``/etc`` symlinks copied) is the overlay's lower
layer; the host's ``/usr``, ``/bin``, ``/lib*``, ``/sbin`` and the parts of ``/etc`` that programs
need are bound read-only on top. Nothing from ``/home``, ``/root``, ``/var``, ``/run`` or ``/tmp``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
ETC_ENTRIES = (
    "alternatives",
    "bash.bashrc",
    "ca-certificates",
    "ca-certificates.conf",
    "debian_version",
    "environment",
    "gai.conf",
    "host.conf",
    "inputrc",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "locale.alias",
    "localtime",
    "login.defs",
    "magic",
    "magic.mime",
    "mime.types",
    "networks",
    "nsswitch.conf",
    "os-release",
    "pki",
    "profile",
    "profile.d",
    "protocols",
    "python3",
    "python3.11",
    "python3.12",
    "python3.13",
    "resolv.conf",
    "rpc",
    "services",
    "shells",
    "ssl",
    "terminfo",
    "timezone",
    "xattr.conf",
    "gitconfig",
    "wgetrc",
    "mailcap",
    "papersize",
)
SKELETON_DIRS = {
    "etc": 0o755,
    "tmp": 0o1777,
    "proc": 0o755,
    "dev": 0o755,
    "sys": 0o755,
    "root": 0o700,
    "home": 0o755,
    "run": 0o755,
    "var": 0o755,
    "var/tmp": 0o1777,
    "var/lib": 0o755,
    "var/cache": 0o755,
    "var/log": 0o755,
    "opt": 0o755,
    "mnt": 0o755,
    "srv": 0o755,
}
_TRUSTED_TREES = ("/usr/", "/etc/")


def _plan() -> tuple[list[tuple[str, str]], list[dict]]:
    """(symlinks to create in the skeleton, read-only binds)."""
    links: list[tuple[str, str]] = []
    binds: list[dict] = []
    for name in SYSTEM_DIRS:
        path = "/" + name
        if os.path.islink(path):
            links.append((name, os.readlink(path)))
        elif os.path.isdir(path):
            binds.append({"src": path, "dst": path, "is_dir": True, "readonly": True})
    for name in ETC_ENTRIES:
        path = "/etc/" + name
        if not os.path.lexists(path):
            continue
        real = os.path.realpath(path)
        if os.path.islink(path) and real.startswith(_TRUSTED_TREES):
            links.append(("etc/" + name, os.readlink(path)))
        elif os.path.exists(real):
            binds.append({"src": real, "dst": path, "is_dir": os.path.isdir(real), "readonly": True})
    return links, binds


_LAYOUTS: dict[Path, tuple[str, list[dict]]] = {}


def layout(state_dir: Path) -> tuple[str, list[dict]]:
    """Return (skeleton directory, binds), building the skeleton once per host layout.

    Computed once per process: the host's directory layout does not change under a running program.
    """
    cached = _LAYOUTS.get(state_dir)
    if cached is None or not os.path.isdir(cached[0]):
        cached = _LAYOUTS[state_dir] = _layout(state_dir)
    return cached


def _layout(state_dir: Path) -> tuple[str, list[dict]]:
    links, binds = _plan()
    key = hashlib.sha256(repr((links, binds, sorted(SKELETON_DIRS.items()))).encode()).hexdigest()[:16]
    skeleton = state_dir / f"skeleton-{key}"
    if not skeleton.is_dir():
        _build(skeleton, links, binds)
    return str(skeleton), binds


def _build(target: Path, links: list[tuple[str, str]], binds: list[dict]) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=".skeleton-", dir=target.parent))
    try:
        for rel, mode in SKELETON_DIRS.items():
            (tmp / rel).mkdir(parents=True, exist_ok=True)
            os.chmod(tmp / rel, mode)
        for rel, dest in links:
            os.symlink(dest, tmp / rel)
        for bind in binds:
            point = tmp / bind["dst"].lstrip("/")
            if bind["is_dir"]:
                point.mkdir(parents=True, exist_ok=True)
            else:
                point.touch()
        os.chmod(tmp, 0o755)
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def generated_files(hostname: str, host_rootfs: bool) -> dict[str, str]:
    """Files written into each sandbox's writable layer."""
    files = {
        "etc/hostname": hostname + "\n",
        "etc/hosts": f"127.0.0.1\tlocalhost\n127.0.1.1\t{hostname}\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    }
    if host_rootfs:
        files["etc/passwd"] = (
            "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
        )
        files["etc/group"] = "root:x:0:\ntty:x:5:\nnogroup:x:65534:\n"
    return files
