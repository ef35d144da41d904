"""The store: atomic entries, replacement, cleanup after a killed process, names and references."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.oci_images import E, tar_bytes

from jailbox.sandbox.errors import RootfsError, RootfsNotFound
from jailbox.sandbox.rootfs import unpack
from jailbox.sandbox.rootfs.image import ImageConfig
from jailbox.sandbox.rootfs.reference import Reference
from jailbox.sandbox.rootfs.store import Store

ROOT = Path(__file__).resolve().parent.parent
TREE = [E("etc/hello", data=b"hi\n"), E("home/apt", "dir", uid=42, gid=42), E("home/apt/x", data=b"x", uid=42)]


def make(store: Store, name: str, entries: list[E], config: ImageConfig | None = None) -> None:
    with store.create(name, source="test", kind="build") as staging:
        staging.add_stats(unpack.extract_tar(io.BytesIO(tar_bytes(entries)), staging.tree))
        if config is not None:
            staging.config = config


def test_create_replace_and_failure_keep_one_consistent_entry(store: Store) -> None:
    make(store, "t", TREE, ImageConfig(env={"A": "1"}, workdir="/srv"))
    first = store.require("t")
    assert first.kind == "build" and first.size == 4 and first.config.workdir == "/srv"
    assert oct(store.root.stat().st_mode & 0o777) == "0o700"
    with pytest.raises(RuntimeError), store.create("t", source="test", kind="build") as staging:
        unpack.extract_tar(io.BytesIO(tar_bytes([E("half", data=b"written")])), staging.tree)
        raise RuntimeError("the build failed half way")
    assert (store.require("t").tree / "etc/hello").exists()  # the old entry is untouched
    assert not list(store.root.glob("tmp/*"))  # and the staging tree is gone
    make(store, "t", [E("new", data=b"n")])
    assert sorted(os.listdir(store.require("t").tree)) == ["new"]
    assert not list(store.root.glob("trash/*"))


def test_a_killed_creator_leaves_nothing_the_next_one_trips_on(store: Store) -> None:
    code = (
        "import io, os, signal, sys; sys.path.insert(0, 'tests')\n"
        "from support.oci_images import E, tar_bytes\n"
        "from jailbox.sandbox.rootfs import unpack\n"
        "from jailbox.sandbox.rootfs.store import Store\n"
        "with Store().create('t', source='test', kind='build') as s:\n"
        "    data = tar_bytes([E('home/apt', 'dir', uid=42), E('home/apt/x', data=b'x', uid=42, mode=0o600)])\n"
        "    unpack.extract_tar(io.BytesIO(data), s.tree)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
    )
    assert r.returncode == -9
    assert len(list(store.root.glob("tmp/*"))) == 1 and store.list() == []
    make(store, "t", TREE)  # under the name's lock: the dead staging tree is removed first
    assert not list(store.root.glob("tmp/*")) and [e.name for e in store.list()] == ["t"]


def test_names_and_references(store: Store) -> None:
    make(store, "docker.io/library/python:3.11-slim", TREE)
    assert store.resolve("python:3.11-slim").name == "docker.io/library/python:3.11-slim"
    assert store.get("python:3.11-slim") is None
    with pytest.raises(RootfsNotFound, match=re.escape("stored: docker.io/library/python:3.11-slim")):
        store.require("python:3.12")
    for bad in ("", ".", "..", " x"):
        with pytest.raises(RootfsError):
            store.entry_dir(bad)


@pytest.mark.parametrize(
    ("text", "canonical", "api_host"),
    [
        ("python:3.11-slim", "docker.io/library/python:3.11-slim", "registry-1.docker.io"),
        ("ubuntu", "docker.io/library/ubuntu:latest", "registry-1.docker.io"),
        ("docker.io/cdx123/llm-in-sandbox:v0.1", "docker.io/cdx123/llm-in-sandbox:v0.1", "registry-1.docker.io"),
        ("cdx123/llm-in-sandbox:v0.1", "docker.io/cdx123/llm-in-sandbox:v0.1", "registry-1.docker.io"),
        ("ghcr.io/org/img@sha256:" + "a" * 64, "ghcr.io/org/img@sha256:" + "a" * 64, "ghcr.io"),
        ("localhost:5000/x:y", "localhost:5000/x:y", "localhost:5000"),
        ("127.0.0.1:5000/a/b", "127.0.0.1:5000/a/b:latest", "127.0.0.1:5000"),
    ],
)
def test_reference_parsing(text: str, canonical: str, api_host: str) -> None:
    ref = Reference.parse(text)
    assert str(ref) == canonical and ref.api_host == api_host


@pytest.mark.parametrize("bad", ["UPPER/case", "x:bad tag", "img@sha256:short", "https://ghcr.io/x", ""])
def test_bad_references_are_refused(bad: str) -> None:
    with pytest.raises(RootfsError):
        Reference.parse(bad)


def test_local_registries_may_be_plain_http() -> None:
    assert Reference.parse("localhost:5000/x").is_local and Reference.parse("127.0.0.1:1/x").is_local
    assert not Reference.parse("ghcr.io/x").is_local


def test_rm_refuses_a_tree_a_live_sandbox_uses(store: Store, mini_rootfs: Path) -> None:
    from jailbox.sandbox import Sandbox

    with store.create("live", source="test", kind="import") as staging:
        subprocess.run(["cp", "-a", f"{mini_rootfs}/.", str(staging.tree)], check=True)
    with Sandbox(rootfs="live") as sb:
        assert sb.exec("echo up").stdout == "up\n"
        expected = f"live is in use by 1 live sandbox(es) (host pids {os.getpid()})"
        with pytest.raises(RootfsError, match=re.escape(expected)):
            store.remove("live")
    store.remove("live")
    assert store.list() == []


def test_a_cache_directory_open_to_others_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    with pytest.raises(RootfsError, match="open to other users"):
        Store(shared).ensure()
    assert oct(shared.stat().st_mode & 0o777) == "0o755"
