"""Import: a ``podman save`` archive (docker-archive and oci-archive), an OCI layout directory
written by skopeo, a plain rootfs tarball; and the ``jailbox rootfs`` commands around them."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest
from support.cli import JAILBOX
from support.oci_images import E, Layout, content, raw_header, raw_tar_gz, tar_bytes, tree_of

from jailbox.sandbox import Sandbox, hostids
from jailbox.sandbox.errors import RootfsError, UnsafeArchive
from jailbox.sandbox.rootfs.importer import import_rootfs
from jailbox.sandbox.rootfs.store import Store

ROOT = Path(__file__).resolve().parent.parent
ROOTFS = [
    E("etc", "dir"),
    E("etc/hello", data=b"hello\n"),
    E("home/apt", "dir", mode=0o700, uid=42, gid=42),
    E("home/apt/note", data=b"apt\n", uid=42, gid=42),
    E("bin", "symlink", link="usr/bin"),
    E("usr/bin", "dir"),
]


def jail_id(inside: int) -> int:
    return inside if hostids.full_range_available() else 0


def check_rootfs(tree: Path) -> None:
    seen = tree_of(tree)
    a = jail_id(42)
    assert seen["etc/hello"] == ("f", "0o644", 0, 0, content(b"hello\n"))
    assert seen["home/apt"] == ("d", "0o700", a, a)
    assert seen["home/apt/note"] == ("f", "0o644", a, a, content(b"apt\n"))
    assert seen["bin"] == ("l", "usr/bin", 0, 0)


@pytest.fixture
def podman(tmp_path: Path):
    """podman with its own storage (vfs) and state in a temp dir: its runroot path must be short, and
    its tmpdir its own (root's default, /run/libpod, is shared: one's ``system reset`` removed it
    under another running beside it)."""
    home = Path(tempfile.mkdtemp(prefix="jbpm-", dir="/tmp"))
    (home / "run").mkdir(mode=0o700)
    base = ["podman", "--storage-driver", "vfs", "--root", str(home / "root"), "--runroot", str(home / "rr")]
    base += ["--tmpdir", str(home / "tmp")]
    env = {**os.environ, "HOME": str(home), "XDG_RUNTIME_DIR": str(home / "run")}

    def run(*args: str) -> subprocess.CompletedProcess:
        r = subprocess.run([*base, *args], capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        return r

    yield run
    run("system", "reset", "--force")
    shutil.rmtree(home, ignore_errors=True)


@pytest.mark.needs("podman")
@pytest.mark.parametrize("fmt", ["docker-archive", "oci-archive"])
def test_import_a_podman_save_archive(tmp_path: Path, store: Store, podman, fmt: str) -> None:
    src = tmp_path / "rootfs.tar"
    src.write_bytes(tar_bytes(ROOTFS))
    podman("import", "--change", "ENV FOO=bar", "--change", "WORKDIR /work", str(src), "localhost/t:1")
    archive = tmp_path / "saved.tar"
    podman("save", "--format", fmt, "-o", str(archive), "localhost/t:1")
    entry = import_rootfs(archive, "saved", store=store)
    assert entry.kind == "import" and entry.source == str(archive)
    check_rootfs(entry.tree)
    assert entry.config.env["FOO"] == "bar" and entry.config.workdir == "/work"
    assert list((store.root / "tmp").iterdir()) == []


@pytest.mark.needs("skopeo")
def test_import_an_oci_layout_directory_from_skopeo(tmp_path: Path, store: Store) -> None:
    mine = Layout(tmp_path / "mine")
    second = [E("etc/.wh.hello"), E("etc/new", data=b"new\n")]
    mine.tag("v1", mine.image([tar_bytes(ROOTFS), tar_bytes(second)], {"Env": ["PATH=/usr/bin"]}))
    out = tmp_path / "copied"
    subprocess.run(["skopeo", "copy", f"oci:{mine.path}:v1", f"oci:{out}:v1"], check=True, capture_output=True)
    entry = import_rootfs(out, "layout", store=store)
    seen = tree_of(entry.tree)
    assert "etc/hello" not in seen and seen["etc/new"][4] == content(b"new\n")
    assert seen["home/apt/note"][2] == jail_id(42)
    assert entry.config.env == {"PATH": "/usr/bin"}


def test_import_a_plain_rootfs_tarball(tmp_path: Path, store: Store) -> None:
    src = tmp_path / "rootfs.tar.gz"
    src.write_bytes(gzip.compress(tar_bytes(ROOTFS)))
    entry = import_rootfs(src, "plain", store=store)
    check_rootfs(entry.tree)
    assert entry.size == len(b"hello\n") + len(b"apt\n")


def test_import_refuses_a_layout_blob_that_does_not_match(tmp_path: Path, store: Store) -> None:
    mine = Layout(tmp_path / "mine")
    desc = mine.image([tar_bytes(ROOTFS)])
    mine.tag("v1", desc)
    manifest = json.loads((mine.path / "blobs/sha256" / desc["digest"][7:]).read_bytes())
    layer = mine.path / "blobs/sha256" / manifest["layers"][0]["digest"][7:]
    layer.write_bytes(gzip.compress(tar_bytes([E("evil", data=b"swapped")])))
    with pytest.raises(RootfsError, match="does not match its digest"):
        import_rootfs(mine.path, "bad", store=store)
    assert store.list() == []


@pytest.mark.slow
def test_rootfs_commands(tmp_path: Path, store: Store) -> None:
    src = tmp_path / "rootfs.tar"
    src.write_bytes(tar_bytes([*ROOTFS, E("big", data=b"x" * 200_000)]))
    env = {**os.environ, "JAILBOX_CACHE_DIR": str(store.root)}

    def jailbox(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*JAILBOX, *args], capture_output=True, text=True, cwd=ROOT, timeout=120, env=env)

    r = jailbox("rootfs", "import", str(src), "cli-made")
    assert r.returncode == 0, r.stderr
    listed = jailbox("rootfs", "list")
    assert listed.stdout.startswith("cli-made") and "import" in listed.stdout and str(src) in listed.stdout
    data = json.loads(jailbox("rootfs", "list", "--json").stdout)
    assert data[0]["name"] == "cli-made" and data[0]["size"] >= 200_000
    path = jailbox("rootfs", "path", "cli-made").stdout.strip()
    assert Path(path, "etc/hello").read_text() == "hello\n"
    du = jailbox("rootfs", "du", "cli-made")
    assert du.returncode == 0 and "MB apparent" in du.stdout
    missing = jailbox("rootfs", "path", "nope")
    assert missing.returncode == 1 and "stored: cli-made" in missing.stderr
    assert "jailbox rootfs pull nope" in missing.stderr
    r = jailbox("rootfs", "rm", "cli-made")
    assert r.returncode == 0 and "removed cli-made" in r.stdout
    assert jailbox("rootfs", "list").stdout == "" and not Path(path).exists()


def test_a_directory_path_still_works_and_workdir_defaults(mini_rootfs: Path) -> None:
    with Sandbox(rootfs=str(mini_rootfs)) as sb:
        assert sb.exec("pwd").stdout == "/testbed\n"


def test_a_layout_with_several_images_needs_a_tag(tmp_path: Path, store: Store) -> None:
    mine = Layout(tmp_path / "mine")
    mine.tag("one", mine.image([tar_bytes([E("which", data=b"one")])]))
    mine.tag("two", mine.image([tar_bytes([E("which", data=b"two")])]))
    for desc in mine.index:
        desc.pop("platform")
    (mine.path / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": mine.index}))
    with pytest.raises(RootfsError, match=r"several images \(tags: one, two\); pick one with --tag"):
        import_rootfs(mine.path, "x", store=store)
    entry = import_rootfs(mine.path, "x", store=store, tag="two")
    assert (entry.tree / "which").read_bytes() == b"two"
    with pytest.raises(RootfsError, match="no image tagged 'three'"):
        import_rootfs(mine.path, "y", store=store, tag="three")


def test_a_hostile_image_archive_is_refused(tmp_path: Path, store: Store) -> None:
    archive = tmp_path / "evil.tar"
    archive.write_bytes(tar_bytes([E("manifest.json", data=b"[]"), E("../escaped", data=b"x")]))
    with pytest.raises(UnsafeArchive, match=r"\.\./escaped: '\.\.' in its path"):
        import_rootfs(archive, "evil", store=store)
    assert not (tmp_path.parent / "escaped").exists() and store.list() == []


def test_the_cli_refuses_a_huge_long_name_header_in_one_line_with_bounded_memory(tmp_path: Path, store: Store) -> None:
    """1 MiB of gzip whose GNU long-name header claims 256 MiB: the unbounded parse held twice
    that in the unpack worker; now `rootfs import` (and `pull`, the same worker) refuses it unread."""
    src = raw_tar_gz(
        tmp_path / "evil.tar.gz",
        raw_header("././@LongLink", tarfile.GNUTYPE_LONGNAME, 256 << 20),
        (bytes(1 << 20), 256),
        raw_header("after", tarfile.REGTYPE, 0),
    )
    measure = (
        "import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
        "print(r.returncode); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.stdout.write(r.stderr)"
    )
    env = {**os.environ, "JAILBOX_CACHE_DIR": str(store.root)}
    argv = [sys.executable, "-c", measure, *JAILBOX, "rootfs", "import", str(src), "evil"]
    out = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=300, env=env, check=True)
    code, peak, err = out.stdout.split("\n", 2)
    assert code != "0" and err.count("\n") == 1, err
    assert "(the first member): a GNU long-name header claims 268435456 bytes, more than the 4097" in err
    assert int(peak) < 150 << 10, f"the CLI or its worker peaked at {peak} KiB"  # the CLI: about 40 MiB
    assert store.list() == []
