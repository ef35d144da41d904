"""The zero-setup root filesystem: the host's programs, none of the host's data.

The overlay's lower layer is a skeleton directory: empty mount points, the host's top-level
symlinks (``/bin -> usr/bin``), and *copies* of the parts of ``/etc`` that programs need (an
allowlist; never ``shadow``, ``ssh``, ``ssl/private``...). Only ``/usr`` and any real ``/lib*``,
``/bin``, ``/sbin`` directories are bound read-only on top, so a jail costs one or two bind mounts
instead of dozens. The copies are fingerprinted (inode, size, mtime of the copied files and
directories) and a new skeleton is built when the host's files change; the check runs at most every
``RECHECK`` seconds.
Nothing from ``/home``, ``/root``, ``/var``, ``/run`` or ``/tmp``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
ETC_ENTRIES = (
    "alternatives", "bash.bashrc", "ca-certificates", "ca-certificates.conf", "debian_version",
    "environment", "gai.conf", "gitconfig", "host.conf", "inputrc", "ld.so.cache", "ld.so.conf",
    "ld.so.conf.d", "locale.alias", "localtime", "login.defs", "magic", "magic.mime", "mailcap", "matplotlibrc",
    "mime.types", "networks", "nsswitch.conf", "os-release", "papersize", "pki/ca-trust", "profile",
    "profile.d", "protocols", "python3", "python3.11", "python3.12", "python3.13", "resolv.conf", "rpc",
    "services", "shells", "ssl/certs", "ssl/openssl.cnf", "terminfo", "timezone", "wgetrc", "xattr.conf",
)  # fmt: skip
SKELETON_DIRS = {
    "etc": 0o755, "tmp": 0o1777, "proc": 0o755, "dev": 0o755, "sys": 0o755, "root": 0o700,
    "home": 0o755, "run": 0o755, "var": 0o755, "var/tmp": 0o1777, "var/lib": 0o755,
    "var/cache": 0o755, "var/log": 0o755, "opt": 0o755, "mnt": 0o755, "srv": 0o755,
}  # fmt: skip
_TRUSTED_TREES = ("/usr/", "/etc/")
RECHECK = 2.0


def _plan() -> tuple[list[tuple[str, str]], list[tuple[str, str]], list[dict]]:
    """(symlinks to recreate, (skeleton path, host path) to copy, read-only binds)."""
    links: list[tuple[str, str]] = []
    copies: list[tuple[str, str]] = []
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
        elif os.path.exists(real) and os.access(real, os.R_OK):
            copies.append(("etc/" + name, real))
    return links, copies, binds


def _fingerprint(links: list, copies: list, binds: list) -> str:
    """Stat data of every copied file at the top and of every copied directory. Tools that change
    a tree (ca-certificates, update-alternatives, ldconfig) replace files by rename, which changes
    the directory; statting directories rather than every file keeps the recheck cheap."""
    digest = hashlib.sha256(repr((links, binds, sorted(SKELETON_DIRS.items()))).encode())
    for rel, real in copies:
        names = [root for root, _, _ in os.walk(real)] if os.path.isdir(real) else [real]
        for name in sorted(names):
            try:
                st = os.lstat(name)
            except OSError:
                continue
            digest.update(f"{rel}|{name}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|{st.st_mode}\n".encode())
    return digest.hexdigest()[:16]


def _quick_key() -> tuple:
    """Cheap change detector: stat of each top-level entry (and of a symlink's target)."""
    key: list[tuple[object, ...]] = []
    for path in [f"/{n}" for n in SYSTEM_DIRS] + [f"/etc/{n}" for n in ETC_ENTRIES]:
        for follow in (False, True):
            try:
                st = os.stat(path, follow_symlinks=follow)
                key.append((path, follow, st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode))
            except OSError:
                key.append((path, follow))
    return tuple(key)


class _Layouts:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        # per state directory and owner (root's jails' range may change: JAILBOX_ROOT_RANGE)
        self.cache: dict[tuple[Path, tuple[int, int] | None], tuple[float, tuple, str, list[dict]]] = {}

    def get(self, state_dir: Path) -> tuple[str, list[dict]]:
        now = time.monotonic()
        owner = _jail_root()
        cached = self.cache.get((state_dir, owner))
        if cached is not None and now - cached[0] < RECHECK:
            return cached[2], cached[3]
        with self.lock:
            key = _quick_key()
            if cached is not None and cached[1] == key and os.path.isdir(cached[2]):
                self.cache[(state_dir, owner)] = (now, key, cached[2], cached[3])
                return cached[2], cached[3]
            links, copies, binds = _plan()
            suffix = "" if owner is None else f"-{owner[0]}"
            skeleton = state_dir / f"skeleton-{_fingerprint(links, copies, binds)}{suffix}"
            if not skeleton.is_dir():
                _build(skeleton, links, copies, binds, owner)
            self.cache[(state_dir, owner)] = (now, key, str(skeleton), binds)
            return str(skeleton), binds


_LAYOUTS = _Layouts()


def layout(state_dir: Path) -> tuple[str, list[dict]]:
    """Return (skeleton directory, binds), building a skeleton when the host's files changed."""
    return _LAYOUTS.get(state_dir)


def _jail_root() -> tuple[int, int] | None:
    """As host root, the host ids of the jails' root (a subordinate range): the skeleton is theirs,
    so they can make mount points and files in it; rootless it is already the user's."""
    if os.getuid() != 0:
        return None
    from . import hostids

    return hostids.plan("auto").host_root()


def _build(
    target: Path,
    links: list[tuple[str, str]],
    copies: list[tuple[str, str]],
    binds: list[dict],
    owner: tuple[int, int] | None,
) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=".skeleton-", dir=target.parent))
    try:
        for rel, mode in SKELETON_DIRS.items():
            (tmp / rel).mkdir(parents=True, exist_ok=True)
            os.chmod(tmp / rel, mode)
        for rel, dest in links:
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(dest, tmp / rel)
        for rel, real in copies:
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            if os.path.isdir(real):
                shutil.copytree(real, tmp / rel, symlinks=True, ignore_dangling_symlinks=True,
                                copy_function=_copy_readable)  # fmt: skip
            else:
                _copy_readable(real, tmp / rel)
        for bind in binds:
            (tmp / bind["dst"].lstrip("/")).mkdir(parents=True, exist_ok=True)
        os.chmod(tmp, 0o755)
        if owner is not None:
            from .hostids import give_tree

            give_tree(tmp, *owner)
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _copy_readable(src: str, dst: str | Path) -> None:
    """Copy a file the caller may read; skip the rest (an unreadable file is not for the jail)."""
    try:
        shutil.copy2(src, dst)
    except PermissionError:
        pass


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
