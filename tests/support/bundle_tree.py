"""A root filesystem of its own /etc (the host's CA bundles copied in) over the host's /usr binaries,
bound read-only: what the CA and secrets tests give a jail whose bundles may be extended (runs in the
test process)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from conftest import own_for_jails

from jailbox.sandbox import Mount, SandboxConfig

HOST_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
CERTIFI = "usr/local/lib/python3.11/site-packages/certifi/cacert.pem"
USR = ("bin", "sbin", "lib", "lib64", "share")  # the host's, bound in; /usr/local stays the tree's own


def bundle_tree(top: Path, links: dict[str, str] | None = None) -> Path:
    """A root filesystem of its own /etc and /usr/local (with a certifi bundle, as pip's wheels
    bring) under the host's /usr binaries: the bundles it holds are copies of the host's, which
    do not name the test CA. ``links``: tree path -> symlink target, in place of those files."""
    root = top / "tree"
    for rel in ("etc/ssl/certs", "usr/local/lib/python3.11/site-packages/certifi", "root", "tmp"):
        (root / rel).mkdir(parents=True, exist_ok=True)
    for name in ("bin", "lib", "lib64", "sbin"):
        (root / name).symlink_to(f"usr/{name}")
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    for rel in ("etc/ssl/certs/ca-certificates.crt", CERTIFI):
        shutil.copyfile(HOST_BUNDLE, root / rel)
    (root / "usr/lib").mkdir(parents=True, exist_ok=True)  # mount points of the host's /usr
    for rel, target in (links or {}).items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        path.symlink_to(target)
    if os.getuid() == 0:
        own_for_jails(root)
    return root


def tree_config(root: Path, **kw: object) -> SandboxConfig:
    """A sandbox of ``root`` with the host's /usr directories bound in (``network`` "host" unless given)."""
    mounts = [Mount(f"/usr/{d}", f"/usr/{d}") for d in USR if Path(f"/usr/{d}").is_dir()]
    extra = kw.pop("mounts", [])
    assert isinstance(extra, list)
    return SandboxConfig.model_validate(
        {"rootfs": str(root), "network": kw.pop("network", "host"), "mounts": mounts + extra, **kw}
    )
