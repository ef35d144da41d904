"""Capabilities of uid 0 in a jail: Docker's default set in a root filesystem's user namespace, none on
the host rootfs, ``cap_add``/``cap_drop``; and that none of it reaches the host (seccomp's refusals,
the mode rules of read-write binds, files of unmapped ids, ids a chown can name, chroot, raw sockets).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import struct
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest
from conftest import _libs, need, own_for_jails, require
from support.cli import JAILBOX

from jailbox.sandbox import Mount, Sandbox, SandboxConfig, hostids
from jailbox.sandbox.config import DOCKER_CAPS
from jailbox.sandbox.floor import linux as L
from jailbox.sandbox.floor.idmap import IdMap

DOCKER_MASK = L.cap_mask(DOCKER_CAPS)
ALL_MASK = (1 << (L.CAP_LAST_CAP + 1)) - 1
TREE_TOOLS = (
    "bash", "sh", "cat", "grep", "chown", "chgrp", "chmod", "stat", "id", "ls", "mkdir", "touch", "useradd",
    "su", "mknod", "install", "env", "whoami",
)  # fmt: skip
PAM_MODULES = ("pam_rootok.so", "pam_permit.so")
UNMAPPED = 4242  # a host uid no jail of root's maps (they map a range far above it)


def cap_sets(sb: Sandbox, cmd: str = "grep ^Cap /proc/self/status") -> dict[str, int]:
    r = sb.exec(cmd)
    assert r.exit_code == 0, r.stderr
    return {line.split(":")[0]: int(line.split()[1], 16) for line in r.stdout.splitlines()}


def in_jail(sb: Sandbox, script: str, *args: str) -> dict:
    """Run a Python script in the jail; it prints one JSON object."""
    r = sb.exec(["python3", "-c", script, *args])
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def debian_like(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory root filesystem with what a package's maintainer scripts call: the host's
    useradd, su (PAM: root may switch without a password), chown, mknod... and their libraries."""
    root = tmp_path_factory.mktemp("debian-like")
    for sub in ("bin", "etc/pam.d", "etc/skel", "home", "root", "tmp", "var/log", "usr"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    os.symlink("../bin", root / "usr" / "bin")
    os.symlink("bin", root / "sbin")
    needed: set[str] = set()
    security = Path("/lib/x86_64-linux-gnu/security")  # where libpam looks (usr-merged or not)
    for tool in TREE_TOOLS:
        path = shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin")
        require(path is not None, f"{tool} on the host to build a small root filesystem", "sudo apt-get install passwd")
        assert path is not None
        shutil.copy2(os.path.realpath(path), root / "bin" / tool)
        needed |= _libs(os.path.realpath(path))
    for module in PAM_MODULES:
        src = security / module
        require(src.exists(), str(src), "sudo apt-get install libpam-modules")
        target = root / str(src).lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
        needed |= _libs(str(src))
    for lib in needed:
        target = root / lib.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.realpath(lib), target)
    etc = root / "etc"
    (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (etc / "group").write_text("root:x:0:\nadm:x:4:\nusers:x:100:\n")
    (etc / "shadow").write_text("root:*:19000:0:99999:7:::\n")
    (etc / "gshadow").write_text("root:*::\nadm:*::\nusers:*::\n")
    os.chmod(etc / "shadow", 0o640)
    os.chmod(etc / "gshadow", 0o640)
    (etc / "nsswitch.conf").write_text("passwd: files\ngroup: files\nshadow: files\n")
    (etc / "login.defs").write_text("UID_MIN 1000\nUID_MAX 60000\nGID_MIN 1000\nGID_MAX 60000\nUSERGROUPS_ENAB yes\n")
    for service in ("su", "other"):
        (etc / "pam.d" / service).write_text(
            "auth sufficient pam_rootok.so\naccount required pam_permit.so\nsession required pam_permit.so\n"
        )
    if os.getuid() == 0:
        own_for_jails(root)
    return root


# configuration


def test_names_take_any_spelling_and_unknown_ones_name_the_field():
    cfg = SandboxConfig(cap_add=["CAP_NET_ADMIN", "sys_ptrace", " Chown "], cap_drop="cap_all")
    assert cfg.cap_add == ("NET_ADMIN", "SYS_PTRACE", "CHOWN") and cfg.cap_drop == ("ALL",)
    assert cfg.capabilities() == {"NET_ADMIN", "SYS_PTRACE", "CHOWN"}
    for field, bad in (("cap_add", "NET_ADMINN"), ("cap_drop", "CAP_"), ("cap_add", "0")):
        with pytest.raises(ValueError) as info:
            SandboxConfig(**{field: [bad]})
        message = str(info.value)
        assert f"{field}\n" in message and f"unknown capability {bad!r}" in message and "(e.g. NET_ADMIN)" in message
    with pytest.raises(ValueError, match=r"cap_drop\n.*CHOWN is in cap_add too"):
        SandboxConfig(cap_add=["CHOWN"], cap_drop=["cap_chown"])


@pytest.mark.slow
def test_bad_flags_get_one_line_naming_the_flag_with_an_example():
    for args, flag, example in (
        (["exec", "--cap-add", "NET_ADMINN"], "--cap-add", "--cap-add NET_ADMIN"),
        (["exec", "--cap-drop", "bogus"], "--cap-drop", "--cap-drop NET_RAW"),
        (["exec", "--cap-add", "chown", "--cap-drop", "CAP_CHOWN"], "--cap-drop", "--cap-drop NET_RAW"),
        (["replay", "/dev/null", "--cap-add", "x"], "--cap-add", "--cap-add NET_ADMIN"),
        (["run", "--query", "q", "--llm-name", "m", "--cap-add", "x"], "--cap-add", "--cap-add NET_ADMIN"),
        (["bench", "/dev/null", "--llm-name", "m", "--cap-drop", "x"], "--cap-drop", "--cap-drop NET_RAW"),
    ):
        env = {**os.environ, "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}
        argv = [*JAILBOX, *args, *(["--", "true"] if args[0] == "exec" else [])]
        r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1, (args, r.stderr)
        assert lines[0].startswith(f"jailbox: {flag}: ") and lines[0].endswith(f"e.g. {example}"), lines


def test_default_set_depends_on_the_root_filesystem_and_the_user_namespace(tmp_path: Path):
    assert SandboxConfig().capabilities() == frozenset()
    assert SandboxConfig(rootfs=str(tmp_path)).capabilities() == DOCKER_CAPS
    assert SandboxConfig(rootfs=str(tmp_path), userns=False).capabilities() == frozenset()  # would be the host's
    assert SandboxConfig(rootfs=str(tmp_path), cap_drop=["NET_RAW", "MKNOD"]).capabilities() == DOCKER_CAPS - {
        "NET_RAW",
        "MKNOD",
    }
    assert SandboxConfig(rootfs=str(tmp_path), cap_drop=["ALL"], cap_add=["CHOWN"]).capabilities() == {"CHOWN"}
    every = SandboxConfig(cap_add=["ALL"], cap_drop=["SYS_ADMIN"]).capabilities()
    assert "SYS_ADMIN" not in every and len(every) == len(L.CAPABILITIES) - 1


# what commands hold


def test_root_of_a_rootfs_sandbox_holds_dockers_set_and_the_host_rootfs_none(debian_like: Path):
    with Sandbox(rootfs=str(debian_like)) as sb:
        sets = cap_sets(sb)
        assert sets["CapEff"] == sets["CapPrm"] == sets["CapBnd"] == DOCKER_MASK
        assert sets["CapInh"] == sets["CapAmb"] == 0
        assert sb.exec("grep NoNewPrivs /proc/self/status").stdout.split()[1] == "1"
    with Sandbox() as sb:
        sets = cap_sets(sb)
        assert sets["CapEff"] == sets["CapBnd"] == 0


def test_cap_add_and_cap_drop_shape_the_set(debian_like: Path):
    cases = (
        ({"cap_drop": ["NET_RAW", "cap_mknod"]}, DOCKER_MASK & ~L.cap_mask(["NET_RAW", "MKNOD"])),
        ({"cap_add": ["SYS_PTRACE"]}, DOCKER_MASK | L.cap_mask(["SYS_PTRACE"])),
        ({"cap_drop": ["ALL"], "cap_add": ["CHOWN", "FOWNER"]}, L.cap_mask(["CHOWN", "FOWNER"])),
        ({"cap_drop": ["ALL"]}, 0),
        ({"cap_add": ["ALL"], "cap_drop": ["SYS_ADMIN"]}, ALL_MASK & ~L.cap_mask(["SYS_ADMIN"])),
    )
    for fields, expected in cases:
        with Sandbox(rootfs=str(debian_like), **fields) as sb:
            sets = cap_sets(sb)
            assert sets["CapEff"] == sets["CapBnd"] == expected, fields
    with Sandbox(cap_add=["chown", "CAP_KILL"]) as sb:  # the host rootfs: only what is added
        assert cap_sets(sb)["CapEff"] == L.cap_mask(["CHOWN", "KILL"])


def test_other_users_hold_nothing(debian_like: Path):
    need("subids")
    with Sandbox(rootfs=str(debian_like), user="1000:1000") as sb:
        sets = cap_sets(sb)
        assert sets["CapEff"] == sets["CapPrm"] == 0 and sets["CapBnd"] == DOCKER_MASK
    with Sandbox(rootfs=str(debian_like)) as sb:
        assert sb.exec("useradd -m alice").exit_code == 0
        r = sb.exec("su alice -c 'grep ^CapEff /proc/self/status; grep ^CapPrm /proc/self/status'")
        assert [int(line.split()[1], 16) for line in r.stdout.splitlines()] == [0, 0], r.stdout + r.stderr


# what a package's maintainer scripts do


def test_useradd_chown_and_su_work_as_in_a_container(debian_like: Path):
    need("subids")
    script = """set -e
    useradd -m -s /bin/bash alice
    useradd --system --no-create-home svc
    mkdir -p /var/lib/app /var/log/app
    chown svc:svc /var/lib/app
    chgrp adm /var/log/app && chmod 2750 /var/log/app
    install -o alice -g alice -m 0640 /etc/hostname /home/alice/config 2>/dev/null || \
        install -o alice -g alice -m 0640 /etc/passwd /home/alice/config
    stat -c '%U:%G %a' /var/lib/app /var/log/app /home/alice/config /home/alice
    su alice -c 'id -un; touch ~/made-by-alice; stat -c %U ~/made-by-alice; cat ~/config >/dev/null && echo readable'
    su alice -c 'touch /var/lib/app/x' 2>/dev/null && echo alice-wrote-svc-dir || echo alice-refused
    """
    with Sandbox(rootfs=str(debian_like)) as sb:
        r = sb.exec(script)
        assert r.exit_code == 0, r.stdout + r.stderr
        assert r.stdout.split("\n")[:4] == ["svc:svc 755", "root:adm 2750", "alice:alice 640", "alice:alice 755"]
        assert r.stdout.split("\n")[4:] == ["alice", "alice", "readable", "alice-refused", ""]
    with Sandbox(rootfs=str(debian_like), cap_drop=["ALL"]) as sb:  # what the jail did before it had them
        r = sb.exec(script)
        assert r.exit_code != 0 and "Operation not permitted" in r.stderr


# the host stays out of reach


def test_seccomp_still_refuses_mounts_and_namespaces_with_every_capability(debian_like: Path):
    probe = """
import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True)
def call(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
def mount():
    if libc.mount(b"none", b"/mnt", b"tmpfs", 0, None) != 0:
        raise OSError(ctypes.get_errno(), "mount")
def unshare(flags):
    if libc.unshare(flags) != 0:
        raise OSError(ctypes.get_errno(), "unshare")
print(json.dumps({
    "mount": call(mount),
    "userns": call(lambda: unshare(0x10000000)),
    "mountns": call(lambda: unshare(0x00020000)),
    "mknod_dev": call(lambda: os.mknod("/tmp/null2", 0o20666, os.makedev(1, 3))),
}))
"""
    for fields in ({"cap_add": list(DOCKER_CAPS)}, {"cap_add": ["ALL"]}):
        with Sandbox(**fields) as sb:
            assert in_jail(sb, probe) == {"mount": "EPERM", "userns": "EPERM", "mountns": "EPERM", "mknod_dev": "EPERM"}
            assert sb.exec("unshare -U true").exit_code != 0
    with Sandbox(rootfs=str(debian_like)) as sb:  # CAP_MKNOD of a user namespace makes no device
        r = sb.exec("mknod /tmp/null2 c 1 3; mknod /null3 c 1 3; mknod /fifo p && echo fifo-ok")
        assert r.stdout.strip() == "fifo-ok" and r.stderr.count("Operation not permitted") == 2, r.stderr


SET_ID_PROBE = """
import ctypes, errno, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
d = sys.argv[1]
def call(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
def fchmodat2(path, mode):
    if libc.syscall(452, -100, path.encode(), mode, 0) != 0:
        raise OSError(ctypes.get_errno(), "fchmodat2")
def fchmod(path, mode):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
open(d + "/plain", "w").close()
out = {
    "chmod_suid": call(lambda: os.chmod(d + "/plain", 0o4755)),
    "chmod_sgid": call(lambda: os.chmod(d + "/plain", 0o2755)),
    "fchmod_suid": call(lambda: fchmod(d + "/plain", 0o4755)),
    "fchmodat2_suid": call(lambda: fchmodat2(d + "/plain", 0o4755)),
    "create_suid": call(lambda: os.close(os.open(d + "/new", os.O_CREAT | os.O_WRONLY, 0o4755))),
    "mknod_suid": call(lambda: os.mknod(d + "/node", 0o104755)),
    "mknod_dev": call(lambda: os.mknod(d + "/dev", 0o20666, os.makedev(1, 3))),
    "mknod_fifo": call(lambda: os.mknod(d + "/fifo", 0o10644)),
}
with open(d + "/setid", "ab") as f:
    f.write(b"more")  # with CAP_FSETID: older kernels keep the bits a file has, newer ones drop setuid
out["chown_root"] = call(lambda: os.chown(d + "/setid", 0, 0))
out["after_chown"] = oct(os.stat(d + "/setid").st_mode & 0o7777)
out["chown_user"] = call(lambda: os.chown(d + "/setid2", 1, 1))
out["after_chown_user"] = oct(os.stat(d + "/setid2").st_mode & 0o7777)
print(json.dumps(out))
"""


def test_set_id_rules_of_rw_binds_hold_with_fsetid_fowner_and_mknod(tmp_path: Path):
    need("subids")
    shared = tmp_path / "shared"
    shared.mkdir()
    for fields in ({"cap_add": list(DOCKER_CAPS)}, {"cap_add": ["ALL"]}):
        for name in ("plain", "new", "setid", "setid2"):
            (shared / name).unlink(missing_ok=True)
        with Sandbox(mounts=[Mount(shared, "/shared", readonly=False, give=True)], **fields) as sb:
            uid, gid = on_disk().host_root()
            for name in ("setid", "setid2"):  # set-id files the host put there, owned by the jail's root
                (shared / name).write_bytes(b"#!/bin/sh\n")
                os.chown(shared / name, uid, gid)
                os.chmod(shared / name, 0o6755)
            out = in_jail(sb, SET_ID_PROBE, "/shared")
        refused = {k: v for k, v in out.items() if not k.startswith(("after", "chown"))}
        assert refused == dict.fromkeys(refused, "EPERM"), (fields, out)
        assert out["chown_root"] == out["chown_user"] == "ok"
        assert out["after_chown"] == out["after_chown_user"] == "0o755", out  # chown clears them
        for name in ("plain", "setid", "setid2"):
            assert not os.lstat(shared / name).st_mode & 0o6000, name
        assert not (shared / "new").exists() and not (shared / "dev").exists()


def test_file_capabilities_written_in_the_jail_count_only_in_its_own_namespace(tmp_path: Path):
    """CAP_SETFCAP writes ``security.capability``: the kernel stores it against the jail's root
    (a v3 entry naming that host uid), which the host's namespace never honours."""
    shared = tmp_path / "fcaps"
    shared.mkdir()
    probe = """
import json, os, struct, sys
path = sys.argv[1] + "/tool"
open(path, "w").close()
out = {}
for name, value in (("v2", struct.pack("<IIIII", 0x02000001, 1 << 21, 0, 0, 0)),
                    ("v3_root0", struct.pack("<IIIIII", 0x03000001, 1 << 21, 0, 0, 0, 0))):
    try:
        os.setxattr(path, "security.capability", value)
        out[name] = "ok"
    except OSError as e:
        out[name] = e.strerror
print(json.dumps(out))
"""
    for fields in ({"cap_add": ["SETFCAP"]}, {"cap_add": ["ALL"]}):
        with Sandbox(mounts=[Mount(shared, "/fcaps", readonly=False, give=True)], **fields) as sb:
            out = in_jail(sb, probe, "/fcaps")
            root_uid = on_disk().host_root()[0]
        assert out["v2"] == "ok", out
        raw = os.getxattr(shared / "tool", "security.capability")
        magic, *_, rootid = struct.unpack("<IIIIII", raw)
        assert magic >> 24 == 3 and rootid == root_uid != 0, (raw, root_uid)
        (shared / "tool").unlink()


@pytest.mark.root
def test_dac_override_does_not_reach_files_of_unmapped_ids(tmp_path: Path):
    """The kernel grants DAC_OVERRIDE, DAC_READ_SEARCH, FOWNER and CHOWN of a user namespace only
    over inodes whose owner and group it maps: a host file of anyone else stays as its mode says."""
    host = tmp_path / "host"
    (host / "secret").mkdir(parents=True)
    (host / "secret" / "key").write_text("host-secret\n")
    (host / "victim").write_text("host-owned\n")
    (host / "private").write_text("host-private\n")
    os.chmod(host / "secret", 0o700)
    os.chmod(host / "secret" / "key", 0o600)
    os.chmod(host / "victim", 0o644)
    os.chmod(host / "private", 0o600)
    os.chmod(host, 0o777)
    for path in (host, host / "secret", host / "secret" / "key", host / "victim", host / "private"):
        os.chown(path, UNMAPPED, UNMAPPED)
    probe = """
import errno, json, os, sys
d = sys.argv[1]
def call(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
print(json.dumps({
    "list_secret": call(lambda: os.listdir(d + "/secret")),
    "read_key": call(lambda: open(d + "/secret/key", "rb").read()),
    "read_private": call(lambda: open(d + "/private", "rb").read()),
    "write_victim": call(lambda: open(d + "/victim", "ab").write(b"jail")),
    "chmod_victim": call(lambda: os.chmod(d + "/victim", 0o666)),
    "chown_victim": call(lambda: os.chown(d + "/victim", 0, 0)),
    "utime_victim": call(lambda: os.utime(d + "/victim", (0, 0))),
    "read_victim": call(lambda: open(d + "/victim", "rb").read()),
}))
"""
    for fields in ({"cap_add": list(DOCKER_CAPS)}, {"cap_add": ["ALL"]}):
        mounts = [Mount(host, "/ro"), Mount(host, "/rw", readonly=False)]
        with Sandbox(mounts=mounts, **fields) as sb:
            assert cap_sets(sb)["CapEff"] & L.cap_mask(["DAC_OVERRIDE", "FOWNER", "CHOWN"])
            for where in ("/ro", "/rw"):
                out = in_jail(sb, probe, where)
                assert out.pop("read_victim") == "ok"
                assert {k: v for k, v in out.items() if k.startswith(("list", "read"))} == dict.fromkeys(
                    ("list_secret", "read_key", "read_private"), "EACCES"
                ), (where, out)
                assert out["write_victim"] in ("EACCES", "EROFS"), (where, out)
                for key in ("chmod_victim", "chown_victim", "utime_victim"):
                    assert out[key] in ("EPERM", "EROFS"), (where, key, out)
            # through the host rootfs: /usr belongs to host root, which no jail maps
            out = in_jail(sb, probe.replace('d + "/victim"', '"/usr/bin/env"'), "/nonexistent")
            assert out["write_victim"] in ("EACCES", "EROFS") and out["chown_victim"] in ("EPERM", "EROFS")
    assert (host / "victim").read_text() == "host-owned\n"
    st = os.stat(host / "victim")
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (UNMAPPED, UNMAPPED, 0o644)


def on_disk() -> IdMap:
    """The host ids a jail's ids are on a bind: its own map rootless; as root, root's shared range
    (a jail with ids of its own sees its binds through an idmapped mount of that range)."""
    return hostids.plan("auto")


def _host_id(id_map: str, jail_id: int) -> int | None:
    """The host id a jail's id is, by a map's "inside outside count" triples (/proc/self/uid_map's
    lines, or a planned map, which may hold several on one line); None where unmapped."""
    numbers = [int(x) for x in id_map.split()]
    for inside, outside, count in zip(numbers[::3], numbers[1::3], numbers[2::3], strict=True):
        if inside <= jail_id < inside + count:
            return outside + jail_id - inside
    return None


def test_chown_names_only_mapped_ids(tmp_path: Path):
    shared = tmp_path / "own"
    shared.mkdir()
    with Sandbox(mounts=[Mount(shared, "/own", readonly=False, give=True)], cap_add=list(DOCKER_CAPS)) as sb:
        uid_map, gid_map = on_disk().uid_map, on_disk().gid_map
        numbers = [int(x) for x in uid_map.split()]
        beyond = max(a + c for a, c in zip(numbers[::3], numbers[2::3], strict=True))
        assert _host_id(uid_map, beyond) is None
        r = sb.exec(f"touch /own/a /own/b /own/c && chown {beyond} /own/a; chown 0:{beyond} /own/b; echo $?")
        assert r.stdout.strip() == "1" and r.stderr.count("Invalid argument") == 2, r.stdout + r.stderr
        user = _host_id(uid_map, 1000)
        if user is not None:
            assert sb.exec("chown 1000:1000 /own/c").exit_code == 0
    assert os.stat(shared / "a").st_uid == os.stat(shared / "b").st_uid == _host_id(uid_map, 0)  # unchanged
    if user is not None:
        c = os.stat(shared / "c")
        assert (c.st_uid, c.st_gid) == (user, _host_id(gid_map, 1000))
        assert c.st_uid != 1000  # never the host's own user 1000


CHROOT_ESCAPE = """
import json, os, sys
marker, host_path = sys.argv[1], sys.argv[2]
os.makedirs("/tmp/inner/deeper", exist_ok=True)
jail_root = os.stat("/")
def where():
    st = os.stat("/")
    return {"same_root": (st.st_dev, st.st_ino) == (jail_root.st_dev, jail_root.st_ino),
            "marker": os.path.exists(marker), "host": os.path.exists(host_path)}
def held_fd():
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
    os.chroot("/tmp/inner")
    os.fchdir(fd)
def cwd_outside():
    os.chdir("/tmp/inner")
    os.chroot("deeper")
def nested():
    os.chroot("/tmp/inner")
    os.chdir("/")
    os.chroot("deeper")  # the working directory, the old root, is now outside the root
out = {}
for name, start in (("held_fd", held_fd), ("cwd_outside", cwd_outside), ("nested", nested)):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        start()
        for _ in range(256):
            os.chdir("..")
        os.chroot(".")
        os.write(w, json.dumps(where()).encode())
        os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    out[name] = json.loads(os.read(r, 4096))
print(json.dumps(out))
"""


def test_sys_chroot_leads_no_further_than_the_jails_root(tmp_path: Path):
    """The classic escapes from a chroot (a held directory descriptor, a working directory left
    outside the new root, a chroot inside a chroot, ``..`` walks) end at the jail's root: it is its
    mount namespace's root."""
    (tmp_path / "host-only").write_text("host\n")
    for fields in ({"cap_add": ["SYS_CHROOT"]}, {"cap_add": list(DOCKER_CAPS)}, {"cap_add": ["ALL"]}):
        with Sandbox(**fields) as sb:
            assert sb.exec("touch /jail-marker").exit_code == 0
            out = in_jail(sb, CHROOT_ESCAPE, "/jail-marker", str(tmp_path / "host-only"))
            for name, seen in out.items():
                assert seen == {"same_root": True, "marker": True, "host": False}, (fields, name, out)
    for fields in ({}, {"cap_add": list(DOCKER_CAPS - {"SYS_CHROOT"})}):  # no capability: seccomp refuses it
        with Sandbox(**fields) as sb:
            r = sb.exec(["python3", "-c", "import os; os.chroot('/tmp')"])
            assert r.exit_code != 0 and "Operation not permitted" in r.stderr


def test_net_raw_in_network_none_reaches_nothing():
    probe = """
import errno, json, socket
out = {"interfaces": [name for _, name in socket.if_nameindex()]}
def call(f):
    try:
        return f()
    except OSError as e:
        return errno.errorcode[e.errno]
echo = bytes([8, 0, 0xF7, 0xFF, 0, 0, 0, 0])
def icmp(dest):
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    s.sendto(echo, (dest, 0))
    return "sent"
def packet():
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
    s.bind(("lo", 0))
    return "bound-lo"
out["external"] = call(lambda: icmp("1.1.1.1"))
out["lan"] = call(lambda: icmp("10.0.0.1"))
out["loopback"] = call(lambda: icmp("127.0.0.1"))
out["packet"] = call(packet)
print(json.dumps(out))
"""
    for fields in ({"cap_add": list(DOCKER_CAPS)}, {"cap_add": ["ALL"]}):
        with Sandbox(network="none", **fields) as sb:
            out = in_jail(sb, probe)
        assert out["interfaces"] == ["lo"] and out["external"] == out["lan"] == "ENETUNREACH", out
        assert out["loopback"] == "sent"  # the jail's own loopback, not the host's
        assert out["packet"] in ("bound-lo", "EPERM"), out
    with Sandbox(network="none") as sb:
        out = in_jail(sb, probe)
    assert out["external"] == out["loopback"] == "EPERM"


@pytest.mark.root
def test_a_rootless_jail_holds_the_same_set_over_only_its_one_id(request: pytest.FixtureRequest):
    """As an unprivileged user (nobody, no subordinate ids): the set is the same, and covers only
    that user's files."""
    home = Path(tempfile.mkdtemp(prefix="jailbox-caps-"))  # pytest's own directories are root's alone
    request.addfinalizer(lambda: shutil.rmtree(home))
    os.chmod(home, 0o755)
    (home / "rw").mkdir(parents=True)
    (home / "ro").mkdir()
    (home / "ro" / "root-only").write_text("root's\n")
    os.chmod(home / "ro" / "root-only", 0o600)
    for path in (home, home / "rw"):
        os.chown(path, 65534, 65534)
    script = f"""
import json
from jailbox.sandbox import Mount, Sandbox
mounts = [Mount({str(home / "ro")!r}, "/ro"), Mount({str(home / "rw")!r}, "/rw", readonly=False)]
with Sandbox(mounts=mounts, cap_add={sorted(DOCKER_CAPS)!r}) as sb:
    out = {{"status": sb.exec("grep ^CapEff /proc/self/status").stdout.split()[1],
           "uid_map": sb.exec("cat /proc/self/uid_map").stdout.split(),
           "read": sb.exec("cat /ro/root-only").exit_code,
           "chown": sb.exec("touch /rw/f && chown 1 /rw/f").stderr.strip()}}
print(json.dumps(out))
"""
    python = Path(f"/usr/bin/python3.{sys.version_info.minor}")  # a test venv may live where nobody can read
    require(python.exists(), f"{python} (this Python's version, runnable by nobody)", "sudo apt-get install python3")
    script = f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n" + script
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "JAILBOX_STATE_DIR": str(home / "state")}
    r = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(python), "-c", script],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(home),
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert int(out["status"], 16) == DOCKER_MASK
    assert out["uid_map"] == ["0", "65534", "1"]
    assert out["read"] != 0 and "Invalid argument" in out["chown"]
    assert os.stat(home / "rw" / "f").st_uid == 65534
