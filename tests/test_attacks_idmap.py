"""Attacks through ownership: no path from a jail to host root, and nothing on a read-write bind
that another host user could run to become the jail's ids.

As host root, jails map a subordinate range (``jailbox`` in /etc/subuid and /etc/subgid), never
uid 0: what a jail makes on a read-write bind, and the stored trees root makes, belong to that
range on the host. In every jail with a read-write bind (root or rootless) seccomp refuses set-id
bits, device nodes and FIFOs, whichever call makes them.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

import pytest
from support.renames import renaming
from test_attacks_devices import host_nodes

from jailbox.sandbox import Mount, Sandbox, hostids
from jailbox.sandbox.errors import ConfigError, SandboxFileError, SandboxSetupError
from jailbox.sandbox.floor import linux
from jailbox.sandbox.rootfs.store import Store

RANGE = hostids.ROOT_RANGE


def jail_root() -> tuple[int, int]:
    return hostids.plan("auto").host_root()


def host_view(top: Path) -> dict[str, os.stat_result]:
    """Every entry under ``top`` (``top`` included), lstat-ed from the host."""
    found = {".": os.lstat(top)}
    for here, dirs, files in os.walk(top):
        for name in dirs + files:
            path = Path(here) / name
            found[str(path.relative_to(top))] = os.lstat(path)
    return found


def rw_bind(tmp_path: Path, **kw: object) -> tuple[Path, Mount]:
    out = tmp_path / "out"
    out.mkdir()
    return out, Mount(out, "/out", readonly=False, give=os.getuid() == 0, **kw)


# --- what a jail makes on a read-write bind ---------------------------------------------------

MAKERS = [
    "touch /out/as-root && mkdir -p /out/dir/sub && echo x > /out/dir/sub/file",
    "cp -a /etc/os-release /out/copied && mkdir -p /tmp/s/a/b && echo z > /tmp/s/a/b/f && cp -a /tmp/s /out/tree",
    "mkdir /tmp/t && echo y > /tmp/t/f && tar -C /tmp -cf /tmp/t.tar t && tar -C /out -xpf /tmp/t.tar",
    "echo moved > /tmp/m && mv /tmp/m /out/moved",
    'chmod 777 /out/dir && python3 -c "import os; os.setgid(1000); os.setuid(1000); '
    "open('/out/dir/by1000', 'w').write('u')\"",
]


@pytest.mark.root
def test_files_a_jail_makes_on_a_rw_bind_never_belong_to_host_root(tmp_path: Path) -> None:
    out, mount = rw_bind(tmp_path)
    with Sandbox(mounts=[mount], cap_add=["ALL"]) as sb:
        for cmd in MAKERS:
            r = sb.exec(cmd)
            assert r.exit_code == 0, (cmd, r.stderr)
    uid, gid = jail_root()
    seen = host_view(out)
    assert len(seen) > 8
    for name, st in seen.items():
        assert st.st_uid != 0 and st.st_gid != 0, name
        assert uid <= st.st_uid < uid + RANGE and gid <= st.st_gid < gid + RANGE, (name, st.st_uid, st.st_gid)
    assert seen["dir/by1000"].st_uid == uid + 1000


# --- set-id files, FIFOs, device nodes: refused on any jail with a rw bind ----------------------

SET_ID_ATTEMPTS = [
    "touch /out/a && chmod u+s /out/a",
    "touch /out/b && chmod 2755 /out/b",
    "install -m 4755 /bin/true /out/c",
    "python3 -c \"import os; os.close(os.open('/out/d', os.O_CREAT | os.O_WRONLY, 0o4755))\"",
    "python3 -c \"import os; fd = os.open('/out/e', os.O_CREAT | os.O_WRONLY, 0o755); os.fchmod(fd, 0o6755)\"",
    "python3 -c \"import os; os.close(os.open('/out', os.O_TMPFILE | os.O_WRONLY, 0o4755))\"",
    "touch /out/f && chown 0 /out/f; chmod 6755 /out/f",
    "python3 -c \"import os, stat; os.mknod('/out/g', stat.S_IFREG | 0o4755)\"",
    "python3 -c \"import os; os.chmod('/out/a', 0o4755, follow_symlinks=False)\"",
    "cp -a /usr/bin/passwd /out/passwd-copy",  # setuid on the host: cp -a tries to keep the bit
    "mkfifo /out/fifo",
    "mknod /out/null c 1 3",
    "mknod /out/blk b 7 0",
    "python3 -c \"import os, stat; os.mknod('/out/fifo2', stat.S_IFIFO | 0o644)\"",
]


def test_set_id_files_fifos_and_device_nodes_cannot_be_made_on_a_rw_bind(tmp_path: Path) -> None:
    out, mount = rw_bind(tmp_path)
    with Sandbox(mounts=[mount], cap_add=["ALL"]) as sb:
        results = [(cmd, sb.exec(cmd)) for cmd in SET_ID_ATTEMPTS]
        inside = sb.exec("find /out \\( -perm /6000 -o ! -type f ! -type d \\) -printf '%p %M\\n'").stdout
    for cmd, r in results:
        if "passwd-copy" not in cmd:  # cp -a copies the file and warns that it kept no set-id bit
            assert r.exit_code != 0, cmd
    assert inside == ""
    for name, st in host_view(out).items():
        assert not st.st_mode & 0o6000, (name, oct(st.st_mode))
        assert stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode), (name, oct(st.st_mode))


def test_without_a_rw_bind_the_jail_keeps_its_own_set_id_files(tmp_path: Path) -> None:
    """The mode rules are for rw binds only: in a jail whose writes all stay in its own layer,
    chmod u+s and mkfifo work as before."""
    with Sandbox(mounts=[Mount(tmp_path, "/in")]) as sb:
        r = sb.exec("touch /tmp/s && chmod 4755 /tmp/s && mkfifo /tmp/p && stat -c %A /tmp/s")
    assert r.exit_code == 0, r.stderr
    assert r.stdout.strip() == "-rwsr-xr-x"


def test_a_rw_bind_is_nosuid_and_nodev(tmp_path: Path) -> None:
    _out, mount = rw_bind(tmp_path)
    with Sandbox(mounts=[mount]) as sb:
        r = sb.exec("grep ' /out ' /proc/self/mountinfo")
    options = r.stdout.split()[5].split(",")
    assert "nosuid" in options and "nodev" in options, r.stdout


@pytest.mark.root
@pytest.mark.parametrize("jail", [{}, {"userns": False, "cap_add": ["CHOWN", "FOWNER"]}], ids=["range", "host-root"])
def test_the_hosts_dev_null_keeps_its_mode_and_owner(tmp_path: Path, jail: dict) -> None:
    """A jail with a read-write bind (whose seccomp and mounts differ from a plain jail's), its root a
    subordinate id or the host's own (to which the kernel would allow a chmod): the host's /dev/null
    keeps its mode, owner and times, and /dev/null as the working directory is refused."""
    before = host_nodes()
    _, mount = rw_bind(tmp_path)
    with Sandbox(mounts=[mount], **jail) as sb:
        r = sb.exec("chmod 777 /dev/null || chown 1000 /dev/null || touch -d 2001-01-01 /dev/null || echo refused")
        assert r.stdout == "refused\n" and r.stderr.count("Read-only file system") == 3, r.stderr
    with pytest.raises(SandboxSetupError, match="not a directory"):
        Sandbox(mounts=[mount], workdir="/dev/null", **jail)
    assert host_nodes() == before


# --- root's range ------------------------------------------------------------------------------


@pytest.mark.root
def test_jail_root_is_a_subordinate_id_on_the_host() -> None:
    """Of the jail's own range (a slot of the ``jailbox-jails`` pool), clear of every host user's."""
    pool = hostids._pool_range(str(hostids.SUBUID), str(hostids.SUBGID))
    for mode in ("auto", "single"):
        with Sandbox(idmap=mode) as sb:
            inside = sb.exec("cat /proc/self/uid_map /proc/self/gid_map").stdout.split()
            status = Path(f"/proc/{sb.init_pid}/status").read_text()
        uid, gid = int(inside[1]), int(inside[4])
        count = "1" if mode == "single" else str(RANGE)
        assert inside == ["0", str(uid), count, "0", str(gid), count]
        for first, own in zip(pool, (uid, gid), strict=True):
            assert first <= own < first + hostids.POOL_SLOTS * RANGE and (own - first) % RANGE == 0
        ids = {line.split(":")[0]: line.split()[1:] for line in status.splitlines() if line[:4] in ("Uid:", "Gid:")}
        assert ids == {"Uid": [str(uid)] * 4, "Gid": [str(gid)] * 4}, status


@pytest.mark.root
def test_single_mode_as_root_does_not_map_host_root() -> None:
    with Sandbox(idmap="single") as sb:
        r = sb.exec("cat /proc/self/uid_map; touch /tmp/x; stat -c %u /tmp/x")
    fields = r.stdout.split()
    assert fields[1] != "0" and fields[:3] == ["0", fields[1], "1"]


def write_ids(path: Path, lines: list[str]) -> None:
    path.write_text("".join(f"{line}\n" for line in lines))
    path.chmod(0o644)


def test_the_range_is_allocated_clear_of_every_other_entry(tmp_path: Path) -> None:
    subuid, subgid = tmp_path / "subuid", tmp_path / "subgid"
    write_ids(subuid, ["jailbox-ci:165536:65536", "alice:100000:65536", "bob:262144:1"])
    write_ids(subgid, ["jailbox-ci:165536:65536", "carol:327680:10"])
    start = hostids._file_range(str(subuid), str(subgid))
    assert start == (393216, 393216)  # 131072.. holds alice and jailbox-ci, 262144 bob, 327680 carol
    for path in (subuid, subgid):
        assert path.read_text().endswith("jailbox:393216:65536\n")
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
    hostids._file_range.cache_clear()
    assert hostids._file_range(str(subuid), str(subgid)) == (393216, 393216)  # found, not added again
    assert subuid.read_text().count("jailbox:") == 1


def test_an_existing_entry_is_used_and_a_file_without_final_newline_stays_well_formed(tmp_path: Path) -> None:
    subuid, subgid = tmp_path / "subuid", tmp_path / "subgid"
    subuid.write_text("jailbox:1000000:65536\nother:100000:65536")
    subgid.write_text("other:100000:65536")
    assert hostids._file_range(str(subuid), str(subgid)) == (1000000, 196608)
    assert subgid.read_text() == "other:100000:65536\njailbox:196608:65536\n"
    assert subuid.read_text() == "jailbox:1000000:65536\nother:100000:65536"


def test_no_entry_and_no_way_to_write_one_is_refused_with_the_fix(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir"
    with pytest.raises(ConfigError, match="JAILBOX_ROOT_RANGE=1000000:65536"):
        hostids._file_range(str(missing / "subuid"), str(missing / "subgid"))
    short = tmp_path / "subuid"
    short.write_text("jailbox:100000:10\n")
    with pytest.raises(ConfigError, match="fix that line"):
        hostids._file_range(str(short), str(short))


@pytest.mark.parametrize("value", ["0:65536", "200000", "200000:100", "x:65536", "-1:65536", "4294967000:65536"])
def test_a_bad_range_override_is_refused_with_an_example(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(hostids.RANGE_ENV, value)
    with pytest.raises(ConfigError, match="JAILBOX_ROOT_RANGE=200000:65536"):
        hostids.root_range()


@pytest.mark.root
def test_the_range_override_is_what_jails_map(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(hostids.RANGE_ENV, "1048576:65536")
    with Sandbox() as sb:
        assert sb.exec("cat /proc/self/uid_map").stdout.split() == ["0", "1048576", str(RANGE)]


# --- stored trees ------------------------------------------------------------------------------


@pytest.mark.root
def test_an_imported_tree_is_owned_in_the_range(tmp_path: Path, store: Store) -> None:
    from support.oci_images import E, tar_bytes

    from jailbox.sandbox.rootfs.importer import import_rootfs

    archive = tmp_path / "rootfs.tar"
    archive.write_bytes(
        tar_bytes(
            [
                E("etc", "dir"),
                E("etc/hello", data=b"hi\n"),
                E("home/u", "dir", uid=1000, gid=1000),
                E("bin", "dir"),
                E("bin/su", data=b"#!", mode=0o4755),
                E("link", "symlink", link="/etc/passwd"),
            ]
        )
    )
    entry = import_rootfs(archive, "owned", store=store)
    uid, _gid = jail_root()
    assert uid >= hostids.FIRST_ID  # never host root
    seen = host_view(entry.tree)
    assert seen["."].st_uid == uid
    assert seen["etc/hello"].st_uid == uid and seen["home/u"].st_uid == uid + 1000
    assert seen["bin/su"].st_mode & 0o4000 and seen["bin/su"].st_uid == uid
    assert all(st.st_uid >= uid for st in seen.values())


def _identity_entry(store: Store, name: str) -> Path:
    """An entry as jailbox stored it as root before root's jails had a range: owners as the jail
    saw them, on the host (the identity map)."""
    store.ensure()
    path = store.entry_dir(name)
    tree = path / "tree"
    for sub in ("etc", "bin", "home/u"):
        (tree / sub).mkdir(parents=True)
    (tree / "etc" / "hello").write_text("hi\n")
    (tree / "bin" / "su").write_text("#!")
    os.chmod(tree / "bin" / "su", 0o4755)
    os.link(tree / "bin" / "su", tree / "bin" / "su-again")
    os.chown(tree / "home" / "u", 1000, 1000)
    os.symlink("/etc/passwd", tree / "passwd-link")  # the host's: must not change owner
    os.chmod(tree, 0o755)
    meta = {"name": name, "kind": "import", "source": "test", "created": 0.0, "idmap": {}}
    meta["idmap"] = {"uid_map": "0 0 65536\n", "gid_map": "0 0 65536\n", "helper": False, "deny_setgroups": False}
    (path / "meta.json").write_text(json.dumps(meta))
    return tree


@pytest.mark.root
def test_an_entry_stored_with_the_identity_map_is_shifted_into_the_range(store: Store) -> None:
    from jailbox.sandbox.rootfs.resolve import stored

    host_passwd = os.lstat("/etc/passwd")
    tree = _identity_entry(store, "old")
    assert stored("old") is not None  # what every jail on it does first
    uid, gid = jail_root()
    assert uid >= hostids.FIRST_ID  # never host root
    seen = host_view(tree)
    assert seen["."].st_uid == uid and seen["etc/hello"].st_uid == uid and seen["etc/hello"].st_gid == gid
    assert seen["home/u"].st_uid == uid + 1000
    assert seen["bin/su"].st_uid == uid and stat.S_IMODE(seen["bin/su"].st_mode) == 0o4755
    assert seen["passwd-link"].st_uid == uid
    after = os.lstat("/etc/passwd")
    assert (after.st_uid, after.st_gid, after.st_mode) == (host_passwd.st_uid, host_passwd.st_gid, host_passwd.st_mode)
    entry = store.get("old")
    assert entry is not None and entry.idmap["uid_map"].split()[1] == str(uid)
    assert stored("old") is not None and host_view(tree)["home/u"].st_uid == uid + 1000  # shifted once


def test_the_file_api_stays_in_the_jail_when_openat2_is_refused(tmp_path: Path) -> None:
    """A jail with a read-write bind refuses openat2 (ENOSYS), the init's file API included: it then
    resolves paths itself, a component at a time, and links the jail planted (absolute, chains of
    ``..``, a loop) still resolve inside the jail, never to the host's file of the same name."""
    secret = tmp_path / "secret"
    secret.write_text("host's own\n")
    _, mount = rw_bind(tmp_path)
    with Sandbox(mounts=[mount]) as sb:
        assert sb.exec(["python3", "-c", "import os; os.open('/tmp', os.O_RDONLY)"]).exit_code == 0
        planted = (
            f"mkdir -p /w/d{tmp_path} && echo jail > /w/d{secret} && ln -s {secret} /w/abs && "
            f"ln -s ../../../../../../../../../..{secret} /w/d/up && ln -s /w/d /w/dl && "
            "ln -s /w/loop /w/loop && echo in > /w/d/in"
        )
        assert sb.exec(["sh", "-c", planted]).exit_code == 0, "the jail could not plant its links"
        for path in ("/w/abs", "/w/d/up"):
            with pytest.raises(SandboxFileError) as refused:
                sb.read_file(path)  # the jail has no such file: never the host's
            assert refused.value.errno == errno.ENOENT, path
        assert sb.read_file(f"/w/dl{secret}") == b"jail\n"
        with pytest.raises(SandboxFileError) as looped:
            sb.read_file("/w/loop")
        assert looped.value.errno == errno.ELOOP
        sb.write_file("/w/dl/out", b"x")
        assert sb.exec(["cat", "/w/d/out"]).stdout == "x"
    assert secret.read_text() == "host's own\n"


DEEP = "/".join(["d"] * 30)  # a link at the bottom climbs back up with thirty '..'


def test_renames_anywhere_do_not_fail_opens_through_links_that_climb() -> None:
    """openat2 held under a root gives up (EAGAIN) at a ``..`` when a rename or a mount happened
    anywhere on the host during the lookup: beside a jail renaming in a loop, about three single tries
    in four through a link of thirty ``..`` failed. The init's file API (here a neighbour's) tries
    again (``floor.linux.SCOPED_TRIES``), then resolves the path a component at a time."""
    with Sandbox() as renamer, Sandbox() as sb:
        renaming(renamer)
        planted = f"mkdir -p /tmp/w/{DEEP} && echo in > /tmp/w/f && ln -s {'../' * 30}f /tmp/w/{DEEP}/link"
        assert sb.exec(["sh", "-c", planted]).exit_code == 0
        renaming(sb)  # and its own renames
        for _ in range(200):
            assert sb.read_file(f"/tmp/w/{DEEP}/link") == b"in\n"


def test_an_open_whose_every_try_is_raced_resolves_a_component_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With one try, the races above leave many opens to the walk; each still reaches the file the
    link names in the tree, never above it."""
    monkeypatch.setattr(linux, "SCOPED_TRIES", 1)
    (tmp_path / DEEP).mkdir(parents=True)
    (tmp_path / "f").write_text("in\n")
    (tmp_path / DEEP / "link").symlink_to("../" * 40 + "f")  # ten more than it has: held at the root
    want = os.stat(tmp_path / "f").st_ino
    root = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY)
    try:
        with Sandbox() as renamer:
            renaming(renamer)
            for _ in range(2000):
                fd = linux.open_in_root(root, f"{DEEP}/link", os.O_RDONLY)
                try:
                    assert os.fstat(fd).st_ino == want
                finally:
                    os.close(fd)
    finally:
        os.close(root)


@pytest.mark.root
def test_give_never_follows_links_a_jail_left_in_the_source(tmp_path: Path) -> None:
    """``give=True`` chowns a bind's source to the jail's root: links an earlier jail planted there
    (to a host file, to a host directory, a chain) are changed themselves, never what they name."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "file").write_text("host\n")
    before = {p.name: (p.lstat().st_uid, p.lstat().st_gid) for p in (outside, outside / "file")}
    out, mount = rw_bind(tmp_path)
    with Sandbox(mounts=[mount]) as sb:
        planted = f"ln -s {outside}/file /out/f && ln -s {outside} /out/d && ln -s /out/d /out/chain"
        assert sb.exec(["sh", "-c", planted]).exit_code == 0
    with Sandbox(mounts=[mount]) as sb:  # gives the tree again, links included
        assert sb.exec(["true"]).exit_code == 0
    assert {p.name: (p.lstat().st_uid, p.lstat().st_gid) for p in (outside, outside / "file")} == before
    root_uid = jail_root()[0]
    assert all(os.lstat(out / name).st_uid == root_uid for name in ("f", "d", "chain"))
