"""Pull from a real registry (Debian's docker-registry on 127.0.0.1, images pushed with skopeo):
exact trees with whiteouts, shared layers fetched once, resumed downloads, refused bad digests,
platform choice, concurrent pulls, and sandboxes started on the pulled tree without a copy."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import JAILBOX
from support.oci_images import E, Layout, LocalRegistry, Proxy, content, tar_bytes, tree_of

from jailbox.sandbox import Sandbox, SandboxConfig, hostids
from jailbox.sandbox.errors import ConfigError, DigestMismatch, RegistryError, RootfsNotFound
from jailbox.sandbox.rootfs.pull import pull
from jailbox.sandbox.rootfs.store import Store

pytestmark = pytest.mark.needs("docker-registry", "skopeo")

BIG = os.urandom(3 << 20)  # incompressible: a layer of ~3 MB, for resuming

BASE = [
    E("etc", "dir"),
    E("etc/os-release", data=b"ID=test\n"),
    E("etc/gone", data=b"whited out later\n"),
    E("etc/shadow", data=b"secret\n", mode=0o640, gid=42),
    E("home/apt", "dir", mode=0o700, uid=42, gid=65534),
    E("home/apt/own", data=b"apt's\n", uid=42, gid=65534),
    E("usr/bin", "dir"),
    E("usr/bin/su", data=b"#!/bin/sh\n", mode=0o4755),
    E("bin", "symlink", link="usr/bin"),
    E("usr/bin/same", "hardlink", link="etc/os-release"),
    E("opq", "dir"),
    E("opq/old1", data=b"1"),
    E("opq/sub", "dir"),
    E("opq/sub/old2", data=b"2"),
    E("becomes_dir", data=b"file first"),
    E("run/fifo", "fifo", mode=0o600),
]
CHANGES = [
    E("etc/.wh.gone"),
    E("opq", "dir", mode=0o750),
    E("opq/.wh..wh..opq"),
    E("opq/new", data=b"new"),
    E("becomes_dir", "dir"),
    E("becomes_dir/inside", data=b"x"),
    E("etc/os-release", data=b"ID=changed\n"),
]
TOP = [E("big", data=BIG), E("usr/bin/tool", data=b"tool", mode=0o755, uid=1000, gid=1000)]
CONFIG = {"Env": ["PATH=/custom/bin:/usr/bin:/bin", "FOO=from-image"], "WorkingDir": "/work", "User": "0"}


def jail_id(inside: int) -> int:
    """How the jail shows a file the image gives to ``inside``: itself, or everything root
    when this user has no subordinate ids (a single-id map)."""
    single = (
        hostids.plan("auto").uid_map.split()[2:3] == ["1"] and os.getuid() != 0 and not hostids.full_range_available()
    )
    return 0 if single else inside


def expected_tree() -> dict[str, tuple]:
    u = jail_id
    root, apt = u(0), u(42)
    files = {
        "etc": ("d", "0o755", root, root),
        "etc/os-release": ("f", "0o644", root, root, content(b"ID=changed\n")),
        "etc/shadow": ("f", "0o640", root, u(42), content(b"secret\n")),
        "home": ("d", "0o755", root, root),
        "home/apt": ("d", "0o700", apt, u(65534)),
        "home/apt/own": ("f", "0o644", apt, u(65534), content(b"apt's\n")),
        "usr": ("d", "0o755", root, root),
        "usr/bin": ("d", "0o755", root, root),
        "usr/bin/su": ("f", "0o4755", root, root, content(b"#!/bin/sh\n")),
        "usr/bin/same": ("f", "0o644", root, root, content(b"ID=test\n")),
        "usr/bin/tool": ("f", "0o755", u(1000), u(1000), content(b"tool")),
        "bin": ("l", "usr/bin", root, root),
        "opq": ("d", "0o750", root, root),
        "opq/new": ("f", "0o644", root, root, content(b"new")),
        "becomes_dir": ("d", "0o755", root, root),
        "becomes_dir/inside": ("f", "0o644", root, root, content(b"x")),
        "run": ("d", "0o755", root, root),
        "run/fifo": ("p", "0o600", root, root),
        "big": ("f", "0o644", root, root, content(BIG)),
    }
    return files


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("registry")
    reg = LocalRegistry(base)
    layout = Layout(base / "layout")
    base_raw, changes_raw, top_raw = tar_bytes(BASE), tar_bytes(CHANGES), tar_bytes(TOP)
    layout.tag("v1", layout.image([base_raw, changes_raw, top_raw], CONFIG))
    layout.tag("sibling", layout.image([base_raw, tar_bytes([E("sibling", data=b"s")])]))
    layout.tag("corrupt", layout.image([tar_bytes([E("c", data=b"soon corrupt" * 100)])]))
    amd = layout.image([tar_bytes([E("arch", data=b"amd64")])], arch="amd64")
    arm = layout.image([tar_bytes([E("arch", data=b"arm64")])], arch="arm64")
    layout.multi("multi", [amd, arm])
    for tag in ("v1", "sibling", "corrupt", "multi"):
        reg.push(layout.path, tag, "test/img")
    reg.layers = {"base": _digest_of(base_raw), "top": _digest_of(top_raw)}
    yield reg
    reg.close()


def _digest_of(raw: bytes) -> str:
    import gzip
    import hashlib

    return "sha256:" + hashlib.sha256(gzip.compress(raw, mtime=0)).hexdigest()


@pytest.fixture
def proxy(registry: LocalRegistry):
    p = Proxy(registry.port)
    yield p
    p.close()


def test_pull_reproduces_the_exact_tree_with_whiteouts(registry: LocalRegistry, store: Store) -> None:
    entry = pull(f"{registry.host}/test/img:v1", store=store)
    assert entry.name == f"{registry.host}/test/img:v1"
    assert tree_of(entry.tree) == expected_tree()
    assert entry.config.env == {"PATH": "/custom/bin:/usr/bin:/bin", "FOO": "from-image"}
    assert entry.config.workdir == "/work"
    assert entry.digest and entry.digest.startswith("sha256:")
    assert [e.name for e in store.list()] == [entry.name]
    assert oct(store.root.stat().st_mode & 0o777) == "0o700"  # setuid files are out of other users' reach
    usage = store.du(entry.name)
    assert usage["bytes"] >= len(BIG)
    store.remove(entry.name)  # files owned by subordinate ids go too
    assert store.list() == [] and not entry.path.exists()


def test_shared_layer_is_downloaded_once(registry: LocalRegistry, proxy: Proxy, store: Store) -> None:
    pull(f"{proxy.host}/test/img:v1", store=store)
    pull(f"{proxy.host}/test/img:sibling", store=store)
    assert proxy.blob_gets(registry.layers["base"]) == 1
    before = len(proxy.log.requests)
    again = pull(f"{proxy.host}/test/img:v1", store=store)  # up to date: manifests only
    assert not [p for p, _ in proxy.log.requests[before:] if "/blobs/" in p]
    assert tree_of(again.tree) == expected_tree()


def test_interrupted_download_resumes_with_a_range_request(registry: LocalRegistry, proxy: Proxy, store: Store) -> None:
    cut = 1 << 20
    proxy.cut_after = cut
    entry = pull(f"{proxy.host}/test/img:v1", store=store)
    top = registry.layers["top"]
    ranges = [rng for path, rng in proxy.log.requests if path.endswith(top)]
    assert ranges == [None, f"bytes={cut}-"]
    size = registry.blob_file(top).stat().st_size
    assert proxy.log.blob_bytes[top] == size  # the first part was not fetched twice
    assert tree_of(entry.tree) == expected_tree()


def test_partial_download_survives_a_failed_pull(registry: LocalRegistry, proxy: Proxy, store: Store) -> None:
    """A pull that gives up (here: every attempt cut off) keeps what arrived; the next resumes."""
    top = registry.layers["top"]
    proxy.cut_after = 1 << 20
    from jailbox.sandbox.rootfs import pull as pull_module

    original = pull_module.ATTEMPTS
    pull_module.ATTEMPTS = 1
    try:
        with pytest.raises(RegistryError, match="broke off"):
            pull(f"{proxy.host}/test/img:v1", store=store)
    finally:
        pull_module.ATTEMPTS = original
    assert store.list() == []
    partial = store.root / "blobs" / "partial" / top[7:]
    assert partial.stat().st_size == 1 << 20
    entry = pull(f"{proxy.host}/test/img:v1", store=store)
    assert [rng for path, rng in proxy.log.requests if path.endswith(top)][-1] == f"bytes={1 << 20}-"
    assert tree_of(entry.tree) == expected_tree()


def test_blob_with_a_wrong_digest_is_refused(registry: LocalRegistry, store: Store, proxy: Proxy) -> None:
    manifest = _manifest(registry, "corrupt")
    layer = manifest["layers"][0]["digest"]
    data = registry.blob_file(layer)
    raw = bytearray(data.read_bytes())
    raw[-20] ^= 0xFF  # corrupt the stored blob itself, same length
    data.write_bytes(bytes(raw))
    with pytest.raises(DigestMismatch, match=layer):
        pull(f"{registry.host}/test/img:corrupt", store=store)
    assert store.list() == []
    assert not (store.root / "blobs" / "sha256" / layer[7:]).exists()
    assert not (store.root / "blobs" / "partial" / layer[7:]).exists()
    proxy.tamper = registry.layers["base"]  # and bytes changed in transit
    with pytest.raises(DigestMismatch, match=registry.layers["base"]):
        pull(f"{proxy.host}/test/img:sibling", store=store)
    assert store.list() == []


def _manifest(registry: LocalRegistry, tag: str) -> dict:
    from jailbox.sandbox.rootfs.reference import Reference
    from jailbox.sandbox.rootfs.registry import Registry

    with Registry(Reference.parse(f"{registry.host}/test/img:{tag}")) as reg:
        return reg.manifest(tag)[0]


def test_index_picks_the_host_platform(registry: LocalRegistry, store: Store) -> None:
    import platform

    ref = f"{registry.host}/test/img:multi"
    host = {"x86_64": "amd64", "aarch64": "arm64"}[platform.machine()]
    entry = pull(ref, store=store)
    assert (entry.tree / "arch").read_bytes() == host.encode()
    assert entry.platform == f"linux/{host}"
    other = "arm64" if host == "amd64" else "amd64"
    entry = pull(ref, "other", platform=f"linux/{other}", store=store)
    assert (entry.tree / "arch").read_bytes() == other.encode()
    with pytest.raises(RegistryError, match=r"no image for linux/riscv64 \(it has: linux/amd64, linux/arm64\)"):
        pull(ref, "none", platform="linux/riscv64", store=store)


def test_two_concurrent_pulls_make_one_correct_tree(registry: LocalRegistry, store: Store) -> None:
    ref = registry.host + "/test/img:v1"
    code = f"from jailbox.sandbox.rootfs.pull import pull; print(pull({ref!r}).tree)"
    env = dict(os.environ)
    procs = [
        subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err.decode()
    assert outs[0][0] == outs[1][0]
    assert [e.name for e in store.list()] == [f"{registry.host}/test/img:v1"]
    assert tree_of(store.list()[0].tree) == expected_tree()
    assert list((store.root / "tmp").iterdir()) == []


def test_unknown_name_lists_what_exists_and_how_to_get_it(registry: LocalRegistry, store: Store) -> None:
    pull(f"{registry.host}/test/img:sibling", "mine", store=store)
    with pytest.raises(RootfsNotFound) as info:
        Sandbox(SandboxConfig(rootfs="python:3.11-slim"))
    msg = str(info.value)
    assert "stored: mine" in msg and "jailbox rootfs pull python:3.11-slim" in msg and "jailbox rootfs build" in msg


@pytest.fixture
def mini_image(registry: LocalRegistry, mini_rootfs: Path, tmp_path: Path) -> str:
    """The conftest's mini root filesystem as a two-layer image with an Env, WorkingDir and owners."""
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        tf.add(mini_rootfs, arcname=".", filter=lambda ti: _as_root(ti))
    extra = tar_bytes(
        [
            E("work", "dir"),
            E("home/apt", "dir", uid=42, gid=42),
            E("etc/root-owned", data=b"root\n", mode=0o644),
            E("custom/bin/hello", data=b"#!/bin/sh\necho hello from the image\n", mode=0o755),
        ]
    )
    users = tar_bytes(
        [
            E("etc/passwd", data=b"root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n"),
            E("etc/group", data=b"root:x:0:\napp:x:1000:\nextra:x:2000:app\n"),
            E("home/app", "dir", mode=0o700, uid=1000, gid=1000),
        ]
    )
    layout = Layout(tmp_path / "mini-layout")
    config = {"Env": ["PATH=/custom/bin:/bin", "FOO=from-image"], "WorkingDir": "/work"}
    layout.tag("mini", layout.image([buf.getvalue(), extra], config))
    layout.tag("user", layout.image([buf.getvalue(), extra, users], {**config, "User": "app"}))
    registry.push(layout.path, "mini", "test/mini")
    registry.push(layout.path, "user", "test/mini")
    return f"{registry.host}/test/mini:mini"


def _as_root(ti):
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    return ti


@pytest.mark.slow
def test_sandbox_runs_on_a_pulled_tree_without_copying_it(mini_image: str, store: Store) -> None:
    entry = pull(mini_image, store=store)
    with Sandbox(SandboxConfig(rootfs=mini_image, env={"BAR": "mine"})) as sb:
        assert sb._jail.spec.lower == str(entry.tree)  # the stored tree is the lower layer itself
        r = sb.exec("echo $FOO $BAR; pwd; hello; ls -nd /home/apt /etc/root-owned")
        assert r.exit_code == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[:3] == ["from-image mine", "/work", "hello from the image"]
        apt_uid = jail_id(42)
        assert lines[3].split()[2:4] == ["0", "0"] and lines[3].endswith("/etc/root-owned")
        assert lines[4].split()[2:4] == [str(apt_uid), str(apt_uid)] and lines[4].endswith("/home/apt")
        assert sb.exec("echo changed > /etc/root-owned && cat /etc/root-owned").stdout == "changed\n"
        upper = _files_under(sb.dir)  # the sandbox's own directory holds only what it wrote
        assert sum(p.stat().st_size for p in upper if p.is_file()) < 4096
        assert len(upper) < 20
    assert (entry.tree / "etc/root-owned").read_text() == "root\n"  # the lower layer never changes
    with Sandbox(SandboxConfig(rootfs=mini_image, workdir="/srv", env={"FOO": "explicit"})) as sb:
        assert sb.exec("echo $FOO; pwd").stdout == "explicit\n/srv\n"
    from jailbox.sandbox import SandboxPool

    with SandboxPool(size=2, rootfs=mini_image) as pool:  # pooled jails get the image's settings too
        sb = pool.acquire()
        assert sb.exec("echo $FOO; pwd").stdout == "from-image\n/work\n"
        sb.reset()
        assert sb.exec("pwd").stdout == "/work\n"
        sb.close()


def _files_under(path: Path | None) -> list[Path]:
    assert path is not None
    out = []
    for top, dirs, files in os.walk(path):
        out += [Path(top) / n for n in dirs + files]
    return out


@pytest.mark.needs("subids")  # without them the tree is stored flattened: only root exists
@pytest.mark.slow
def test_the_images_user_runs_commands(mini_image: str, store: Store) -> None:
    ref = mini_image.replace(":mini", ":user")
    pull(ref, "withuser", store=store)
    with Sandbox(rootfs="withuser") as sb:
        r = sb.exec("id -u; id -g; id -G; echo $HOME; touch /home/app/mine && echo wrote; touch /etc/x")
        lines = r.stdout.splitlines()
        assert lines[:4] == ["1000", "1000", "1000 2000", "/home/app"], r.stderr
        assert lines[4] == "wrote" and "Permission denied" in r.stderr
    with Sandbox(rootfs="withuser", user="root") as sb:  # the sandbox's own choice wins
        assert sb.exec("id -u; echo $HOME").stdout == "0\n/root\n"
    with Sandbox(rootfs="withuser", user="root", idmap="single") as sb:  # root needs no id switch
        assert sb.exec("id -u").stdout == "0\n"
    with pytest.raises(ConfigError, match="needs id 1000, which this jail's id map lacks"):
        Sandbox(rootfs="withuser", idmap="single")
    with Sandbox(rootfs="withuser", user="1000:2000") as sb:
        assert sb.exec("id -u; id -g").stdout == "1000\n2000\n"
    with pytest.raises(ConfigError, match="'nobody-here' is not in the root filesystem's /etc/passwd"):
        Sandbox(rootfs="withuser", user="nobody-here")


def test_anonymous_bearer_token_auth(registry: LocalRegistry, proxy: Proxy, store: Store) -> None:
    proxy.token = "anon-token"
    entry = pull(f"{proxy.host}/test/img:sibling", store=store)
    assert (entry.tree / "sibling").read_bytes() == b"s"
    assert proxy.token_queries and "scope=repository%3Atest%2Fimg%3Apull" in proxy.token_queries[0]


def test_credentials_from_the_docker_config(
    registry: LocalRegistry, proxy: Proxy, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import base64
    import json

    proxy.token, proxy.login = "user-token", base64.b64encode(b"alice:s3cret").decode()
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
    with pytest.raises(RegistryError, match=r"refused \(401\)"):
        pull(f"{proxy.host}/test/img:sibling", store=store)
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "config.json").write_text(json.dumps({"auths": {proxy.host: {"auth": proxy.login}}}))
    entry = pull(f"{proxy.host}/test/img:sibling", store=store)
    assert (entry.tree / "sibling").read_bytes() == b"s"


@pytest.mark.needs("zstd")
def test_zstd_layers(registry: LocalRegistry, store: Store, tmp_path: Path) -> None:
    layout = Layout(tmp_path / "zstd-layout")
    layout.tag("zstd", layout.image([tar_bytes([E("z/file", data=b"zstd!")]), tar_bytes([E("z/.wh.file")])], zstd=True))
    registry.push(layout.path, "zstd", "test/zstd")
    entry = pull(f"{registry.host}/test/zstd:zstd", store=store)
    assert os.listdir(entry.tree / "z") == []


def test_ctrl_c_keeps_the_partial_download_and_the_next_pull_resumes(
    registry: LocalRegistry, proxy: Proxy, store: Store
) -> None:
    import signal
    import time

    top = registry.layers["top"]
    proxy.stall_after = 1 << 20
    code = f"from jailbox.sandbox.rootfs.pull import pull; pull({proxy.host + '/test/img:v1'!r})"
    env = dict(os.environ)
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE)
    partial = store.root / "blobs" / "partial" / top[7:]
    for _ in range(1200):  # bounded wait until the first MiB of the big layer is on disk
        if partial.exists() and partial.stat().st_size >= 1 << 20:
            break
        time.sleep(0.05)
    assert partial.stat().st_size == 1 << 20
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and b"KeyboardInterrupt" in err
    assert store.list() == [] and not list(store.root.glob("tmp/*"))
    proxy.stall_after = None
    proxy.release.set()
    entry = pull(f"{proxy.host}/test/img:v1", store=store)
    assert [rng for path, rng in proxy.log.requests if path.endswith(top)][-1] == f"bytes={1 << 20}-"
    assert tree_of(entry.tree) == expected_tree()


@pytest.mark.slow
def test_cli_pull_then_exec_on_it(mini_image: str, store: Store) -> None:
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "JAILBOX_CACHE_DIR": str(store.root)}
    jailbox = [*JAILBOX]
    r = subprocess.run([*jailbox, "rootfs", "pull", mini_image], capture_output=True, text=True, env=env, cwd=root)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("/tree") and mini_image in r.stdout
    r = subprocess.run(
        [*jailbox, "exec", "--rootfs", mini_image, "--", "sh", "-c", "pwd; hello"],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,
    )
    assert (r.returncode, r.stdout) == (0, "/work\nhello from the image\n"), r.stderr
    r = subprocess.run([*jailbox, "rootfs", "pull", "127.0.0.1:1/nope:1"], capture_output=True, text=True, env=env)
    assert r.returncode == 1 and r.stderr.startswith("jailbox: ")


def test_ctrl_c_during_cli_pull_says_so_and_stores_nothing(registry: LocalRegistry, proxy: Proxy, store: Store) -> None:
    import signal
    import time

    proxy.stall_after = 1 << 20
    jailbox = [*JAILBOX]
    cli = subprocess.Popen(
        [*jailbox, "rootfs", "pull", f"{proxy.host}/test/img:v1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group, as a shell's foreground job
    )
    partial = store.root / "blobs" / "partial" / registry.layers["top"][7:]
    for _ in range(1200):  # bounded wait until the first MiB of the big layer is on disk
        if partial.exists() and partial.stat().st_size >= 1 << 20:
            break
        time.sleep(0.05)
    os.killpg(cli.pid, signal.SIGINT)  # what Ctrl-C does: the whole foreground process group
    _, err = cli.communicate(timeout=30)
    proxy.release.set()
    assert cli.returncode == 130, err.decode()[-2000:]
    last = err.decode().splitlines()[-1]
    assert last == "jailbox: interrupted; nothing stored (what was downloaded is kept: pull again to resume)"
    assert store.list() == [] and not list(store.root.glob("tmp/*"))
    assert partial.stat().st_size == 1 << 20
