"""Root's id ranges against shadow's own tools: the ``jailbox`` and ``jailbox-jails`` lines of
/etc/subuid and /etc/subgid are added under shadow's locks and written as shadow writes them, so a
useradd or usermod at the same moment neither loses them nor gives a user ids inside them; and a
jail is refused when the files no longer give its range to jailbox alone.

The races run the real useradd and usermod with ``--prefix DIR``: they use DIR/etc's files and
their locks (not lckpwdf, which a prefix skips), the host's own files are never touched, and the
users they make are gone with the directory. One test takes the host's own locks (not its files'
content) to show a real useradd waits on lckpwdf, and removes the user it makes.
"""

from __future__ import annotations

import os
import random
import shutil
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import require

from jailbox.sandbox import Sandbox, hostids
from jailbox.sandbox.errors import ConfigError

RANGE = hostids.ROOT_RANGE
POOL = hostids.POOL_SLOTS * RANGE
ROUNDS = 40
SHADOW = shutil.which("useradd", path="/usr/sbin:/sbin:/usr/bin:/bin")


def reset(etc: Path) -> None:
    """A prefix's etc as a fresh host has it: root alone, no subordinate ranges."""
    etc.mkdir(exist_ok=True)
    for name in os.listdir(etc):
        if name != "login.defs":
            (etc / name).unlink()
    (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (etc / "group").write_text("root:x:0:\n")
    (etc / "shadow").write_text("root:*:19000:0:99999:7:::\n")
    (etc / "gshadow").write_text("root:*::\n")
    for name in ("shadow", "gshadow"):
        (etc / name).chmod(0o600)
    for name in ("subuid", "subgid"):
        (etc / name).write_text("")
        (etc / name).chmod(0o644)


@pytest.fixture
def prefix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A root directory for ``useradd --prefix``, whose subuid and subgid jails use."""
    etc = tmp_path / "etc"
    etc.mkdir()
    shutil.copy("/etc/login.defs", etc / "login.defs")
    reset(etc)
    monkeypatch.setattr(hostids, "SUBUID", etc / "subuid")
    monkeypatch.setattr(hostids, "SUBGID", etc / "subgid")
    monkeypatch.delenv(hostids.RANGE_ENV, raising=False)
    hostids._file_range.cache_clear()
    hostids._pool_range.cache_clear()
    yield tmp_path
    hostids._file_range.cache_clear()  # the next test's jails find the host's own lines again
    hostids._pool_range.cache_clear()


def lines(path: Path) -> list[tuple[str, int, int]]:
    found = []
    for line in path.read_text().splitlines():
        name, start, count = line.split(":")
        found.append((name, int(start), int(count)))
    return found


def assert_held(etc: Path, users: list[str]) -> tuple[int, int]:
    """Each file gives ``jailbox`` and ``jailbox-jails`` one line each, every user of ``users`` the
    ranges shadow gave them, and nobody ids inside jailbox's; returns jailbox's and the pool's first uid."""
    first = {}
    for name in ("subuid", "subgid"):
        found = lines(etc / name)
        ours = {n: (s, c) for n, s, c in found if n in (hostids.ROOT_ENTRY, hostids.POOL_ENTRY)}
        assert [n for n, _, _ in found].count(hostids.ROOT_ENTRY) == 1, (name, found)
        assert [n for n, _, _ in found].count(hostids.POOL_ENTRY) == 1, (name, found)
        assert {n for n, _, _ in found} - set(ours) == set(users), (name, found)
        for start, count in ours.values():
            clash = [e for e in found if e[0] not in ours and e[1] < start + count and start < e[1] + e[2]]
            assert not clash, (name, found)
        first[name] = (ours[hostids.ROOT_ENTRY][0], ours[hostids.POOL_ENTRY][0])
    return first["subuid"]


def racer(root: Path, round_: int, shape: str) -> subprocess.Popen[bytes]:
    """useradd making users (each given a range from the lowest free), or usermod adding ranges far
    off, back to back, as the jail starts."""
    far = 3_000_000_000 + round_ * 8 * RANGE
    steps = []
    for i in range(4):
        user = f"r{round_}u{i}"
        steps.append(f"useradd --prefix {root} -M {user}")
        if shape == "usermod":
            ids = f"{far + i * RANGE}-{far + (i + 1) * RANGE - 1}"
            steps.append(f"usermod --prefix {root} --add-subuids {ids} --add-subgids {ids} {user}")
    return subprocess.Popen(["sh", "-ec", " && ".join(steps)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


@pytest.mark.root
@pytest.mark.slow
def test_jails_started_against_useradd_and_usermod_keep_their_lines_and_ids(prefix: Path) -> None:
    """Each round starts from files without jailbox's lines; the first jail adds them while shadow's
    tools add users. The lines stay, no user gets ids in them, every user keeps what shadow gave
    it, and each jail ran in the range the files give jailbox."""
    require(SHADOW is not None, "shadow's useradd and usermod", "apt-get install passwd")
    etc = prefix / "etc"
    rng = random.Random(37)
    for round_ in range(ROUNDS):
        reset(etc)
        hostids._file_range.cache_clear()
        hostids._pool_range.cache_clear()
        shape = ("useradd", "usermod")[round_ % 2]
        tools = racer(prefix, round_, shape)
        time.sleep(rng.uniform(0, 0.05))
        try:
            with Sandbox() as sb:
                inside = sb.exec("cat /proc/self/uid_map").stdout.split()
        finally:
            out = tools.communicate(timeout=60)[0]
        assert tools.returncode == 0, (round_, out)
        root, pool = assert_held(etc, [f"r{round_}u{i}" for i in range(4)])
        host = int(inside[1])
        assert root <= host < root + RANGE or pool <= host < pool + POOL, (round_, inside, root, pool)


@pytest.mark.root
def test_useradd_waits_while_the_lines_are_added(prefix: Path) -> None:
    """Our lock is shadow's: a useradd started while it is held writes nothing until it is given back."""
    require(SHADOW is not None, "shadow's useradd", "apt-get install passwd")
    etc = prefix / "etc"
    with hostids._shadow_locked((str(etc / "subuid"), str(etc / "subgid"))):
        lock = (etc / "subuid.lock").read_bytes()
        tool = subprocess.Popen(["useradd", "--prefix", str(prefix), "-M", "waiter"], stderr=subprocess.PIPE)
        time.sleep(1.5)  # shadow retries once a second for 15 s
        assert tool.poll() is None and "waiter" not in (etc / "passwd").read_text()
    assert lock == f"{os.getpid()}\0".encode()
    assert tool.wait(timeout=20) == 0, tool.stderr.read() if tool.stderr else ""
    assert [n for n, _, _ in lines(etc / "subuid")] == ["waiter"]
    left = [n for n in os.listdir(etc) if n.endswith(".lock") or ".cio" in n or n[-1].isdigit()]
    assert left == [".pwd.lock"]  # lckpwdf's file stays, as glibc leaves it; the locks it held are gone


@pytest.mark.root
def test_useradd_on_the_hosts_own_files_waits_on_lckpwdf_while_we_hold_them() -> None:
    """On the host's files useradd takes lckpwdf, then each NAME.lock without waiting: had we held
    only /etc/subuid.lock it would fail ("cannot lock /etc/subuid"). We take lckpwdf first, so it
    waits and then succeeds. The user it makes (no home, no login shell) is removed after, and with
    it the ranges useradd gave it."""
    require(SHADOW is not None, "shadow's useradd and userdel", "apt-get install passwd")
    user = f"jbxlck{os.getpid()}"
    try:
        with hostids._shadow_locked(("/etc/subuid", "/etc/subgid")):
            tool = subprocess.Popen(["useradd", "-M", "-s", "/usr/sbin/nologin", user], stderr=subprocess.PIPE)
            time.sleep(1.5)
            assert tool.poll() is None and f"\n{user}:" not in Path("/etc/passwd").read_text()
        assert tool.wait(timeout=20) == 0, tool.stderr.read() if tool.stderr else ""
        assert f"\n{user}:" in Path("/etc/passwd").read_text()
        assert [n for n, _, _ in lines(Path("/etc/subuid"))].count(user) == 1
    finally:
        subprocess.run(["userdel", user], capture_output=True, timeout=60)
    assert f"{user}:" not in Path("/etc/passwd").read_text() + Path("/etc/subuid").read_text()
    assert not Path("/etc/subuid.lock").exists() and not Path("/etc/subgid.lock").exists()


@pytest.mark.root
def test_a_stale_lock_is_taken_and_a_live_one_waited_for_then_refused(
    prefix: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    etc = prefix / "etc"
    gone = subprocess.Popen(["true"])
    gone.wait()
    (etc / "subuid.lock").write_bytes(f"{gone.pid}\0".encode())  # left by a tool that crashed
    assert hostids._file_range(str(etc / "subuid"), str(etc / "subgid"))
    assert not (etc / "subuid.lock").exists()

    hostids._pool_range.cache_clear()
    monkeypatch.setattr(hostids, "LOCK_WAIT", 0.5)
    holder = subprocess.Popen(["sleep", "30"])
    try:
        for content in (f"{holder.pid}\0", "", "not a pid\n"):
            (etc / "subgid.lock").write_text(content)
            with pytest.raises(ConfigError, match=r"subgid\.lock stayed locked for 0\.5 s .*fix: ") as caught:
                hostids._pool_range(str(etc / "subuid"), str(etc / "subgid"))
            assert "\n" not in str(caught.value)
            assert (etc / "subgid.lock").read_text() == content  # not ours to remove
            assert not (etc / "subuid.lock").exists()  # what we took is given back
    finally:
        holder.kill()
        holder.wait()
    assert hostids.POOL_ENTRY not in (etc / "subuid").read_text()


@pytest.mark.root
def test_the_files_are_rewritten_as_shadow_does_keeping_owner_and_mode(prefix: Path) -> None:
    etc = prefix / "etc"
    (etc / "subuid").write_text("alice:100000:65536")  # no final newline
    os.chown(etc / "subuid", 0, 42)
    (etc / "subuid").chmod(0o640)
    before = (etc / "subuid").stat().st_ino
    uid, gid = hostids._file_range(str(etc / "subuid"), str(etc / "subgid"))
    st = (etc / "subuid").stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 42, 0o640)
    assert st.st_ino != before  # replaced by rename, as shadow does: a reader sees the old file or the new
    assert (etc / "subuid").read_text() == f"alice:100000:65536\njailbox:{uid}:{RANGE}\n"
    assert stat.S_IMODE((etc / "subgid").stat().st_mode) == 0o644
    assert sorted(os.listdir(etc)) == [".pwd.lock", "group", "gshadow", "login.defs", "passwd", "shadow", "subgid",
                                       "subuid"]  # fmt: skip
    (etc / "subgid").unlink()
    (etc / "subgid").symlink_to(prefix / "elsewhere")
    hostids._file_range.cache_clear()
    with pytest.raises(ConfigError, match="could not be added"):
        hostids._pool_range(str(etc / "subuid"), str(etc / "subgid"))
    assert not (prefix / "elsewhere").exists()
    assert gid == uid


LOSSES = {
    "the line is gone": lambda text, entry, first: "".join(
        line + "\n" for line in text.splitlines() if not line.startswith(f"{entry}:")
    ),
    "a user got ids in it": lambda text, entry, first: text + f"mallory:{first + 100}:65536\n",
    "the line moved": lambda text, entry, first: text.replace(f"{entry}:{first}:", f"{entry}:{first + RANGE * 8192}:"),
}


@pytest.mark.root
@pytest.mark.parametrize("loss", sorted(LOSSES))
@pytest.mark.parametrize("entry", [hostids.ROOT_ENTRY, hostids.POOL_ENTRY])
@pytest.mark.parametrize("name", ["subuid", "subgid"])
def test_a_jail_is_refused_a_range_the_files_no_longer_give_jailbox(
    prefix: Path, loss: str, entry: str, name: str
) -> None:
    etc = prefix / "etc"
    with Sandbox() as sb:
        assert sb.exec("true").exit_code == 0
    path = etc / name
    first = {n: s for n, s, _ in lines(path)}[entry]
    path.write_text(LOSSES[loss](path.read_text(), entry, first))
    with pytest.raises(ConfigError) as caught:
        with Sandbox() as sb:
            sb.exec("true")
    message = str(caught.value)
    assert "\n" not in message and f"no longer gives {entry!r} alone" in message, message
    assert f"fix: restore the line '{entry}:{first}:" in message and hostids.RANGE_ENV in message, message


def test_doctor_says_when_another_entry_has_ids_in_roots_range(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from jailbox.sandbox.checks import doctor

    monkeypatch.delenv(hostids.RANGE_ENV, raising=False)
    subuid, subgid = tmp_path / "subuid", tmp_path / "subgid"
    subgid.write_text("jailbox:131072:65536\n")
    host = doctor.Host(subuid=subuid, subgid=subgid, uid=0, user="root")
    subuid.write_text("jailbox:131072:65536\nalice:100000:65536\n")  # useradd's lowest free, before ours was seen
    probe = doctor.root_range(host)
    assert probe.status == "failing" and "alice:100000:65536 overlaps them" in probe.detail, probe
    assert probe.fix is not None and probe.fix.startswith("restore the line 'jailbox:131072:65536'")
    pool = f"jailbox-jails:196608:{POOL}\n"
    subuid.write_text(f"jailbox:131072:65536\n{pool}bob:300000:65536\n")  # a user given ids in the pool
    subgid.write_text(f"jailbox:131072:65536\n{pool}")
    probe = doctor.root_range(host)
    assert probe.status == "failing" and "no longer gives 'jailbox-jails' alone (bob:300000:65536" in probe.detail
    subuid.write_text(f"jailbox:131072:65536\n{pool}bob:{196608 + POOL}:65536\n")
    assert doctor.root_range(host).status == "ok"
