"""The attack battery, file transfer: what ``get`` writes on the host stays beneath its destination.

A jail names every entry ``get`` copies out, and an earlier copy into the same directory may have left
symlinks there that point anywhere on the host. Each class is tried several ways; the host paths outside
the destination must come out untouched (content, mode, listing).
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest
from conftest import snapshot

from jailbox.sandbox import Mount, Sandbox
from jailbox.sandbox.errors import SandboxFileError
from jailbox.sandbox.hostfs import Destination, components


def test_a_directory_swapped_for_a_link_between_two_copies(sb, tmp_path, outside):
    before = snapshot(outside)
    dst = tmp_path / "out"
    sb.exec(f"mkdir -p /tmp/t && ln -s {outside} /tmp/t/d && ln -s {outside}/secret /tmp/t/f")
    sb.get("/tmp/t", dst)  # the host now holds two links to the outside, as a first copy would leave them
    assert os.readlink(dst / "d") == str(outside) and os.readlink(dst / "f") == f"{outside}/secret"
    sb.exec("rm /tmp/t/d /tmp/t/f && mkdir -m 0777 /tmp/t/d && echo planted > /tmp/t/d/x && echo new > /tmp/t/f")
    sb.get("/tmp/t", dst)
    assert snapshot(outside) == before
    assert (dst / "d").is_dir() and not (dst / "d").is_symlink() and (dst / "d" / "x").read_text() == "planted\n"
    assert (dst / "f").read_text() == "new\n" and not (dst / "f").is_symlink()


def test_a_link_deep_in_the_destination_is_replaced_not_followed(sb, tmp_path, outside):
    before = snapshot(outside)
    dst = tmp_path / "out"
    (dst / "a").mkdir(parents=True)
    os.symlink(outside, dst / "a" / "b")  # as if left by an earlier copy
    os.symlink(outside / "sub", dst / "a" / "c")
    sb.exec("mkdir -p /tmp/t/a/b/deeper /tmp/t/a/c && echo x > /tmp/t/a/b/deeper/secret && echo y > /tmp/t/a/c/z")
    sb.get("/tmp/t", dst)
    assert snapshot(outside) == before
    assert (dst / "a" / "b" / "deeper" / "secret").read_text() == "x\n"
    assert (dst / "a" / "c" / "z").read_text() == "y\n"


def test_a_single_file_onto_a_link_to_a_host_file(sb, tmp_path, outside):
    before = snapshot(outside)
    os.symlink(outside / "secret", tmp_path / "copy")
    sb.exec("echo from-jail > /tmp/one")
    sb.get("/tmp/one", tmp_path / "copy")
    assert snapshot(outside) == before
    assert (tmp_path / "copy").read_text() == "from-jail\n" and not (tmp_path / "copy").is_symlink()


SPECIAL = "test -u {t}/suid && test -g {t}/g && test -k {t}/s && test -p {t}/fifo && echo made"


def _no_special_bits_reached(dst: Path) -> None:
    assert stat.S_IMODE((dst / "suid").stat().st_mode) == 0o755
    assert stat.S_IMODE((dst / "g").stat().st_mode) == 0o775
    assert stat.S_IMODE((dst / "s").stat().st_mode) == 0o777
    assert sorted(os.listdir(dst)) == ["g", "s", "suid"]


def test_setuid_setgid_sticky_or_fifo_a_jail_makes_never_reaches_the_host(sb, tmp_path):
    r = sb.exec(
        "mkdir -p /tmp/t/g /tmp/t/s && cp /bin/sh /tmp/t/suid && chmod 6755 /tmp/t/suid && chmod 2775 /tmp/t/g"
        " && chmod 1777 /tmp/t/s && mkfifo /tmp/t/fifo && " + SPECIAL.format(t="/tmp/t")
    )
    assert r.stdout == "made\n", r.stderr  # each is there to copy
    dst = tmp_path / "out"
    sb.get("/tmp/t", dst)
    _no_special_bits_reached(dst)


@pytest.mark.root
def test_no_setuid_setgid_sticky_fifo_or_device_reaches_the_host(tmp_path):
    """A jail's user namespace cannot make a device node (mknod is EPERM there), so the host makes the
    tree, a character device included, and binds it in: what the copy out must pass over is there."""
    src = tmp_path / "src"
    (src / "g").mkdir(parents=True)
    (src / "s").mkdir()
    shutil.copy("/bin/sh", src / "suid")
    os.chmod(src / "suid", 0o6755)
    os.chmod(src / "g", 0o2775)
    os.chmod(src / "s", 0o1777)
    os.mkfifo(src / "fifo")
    os.mknod(src / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    with Sandbox(mounts=[Mount(src, "/testbed/t")]) as sb:
        r = sb.exec(SPECIAL.format(t="/testbed/t") + " && test -c /testbed/t/null && echo device")
        assert r.stdout == "made\ndevice\n", r.stderr
        dst = tmp_path / "out"
        sb.get("/testbed/t", dst)
    _no_special_bits_reached(dst)


def test_a_fifo_on_the_host_where_a_file_goes_does_not_block_the_copy(sb, tmp_path):
    dst = tmp_path / "out"
    dst.mkdir()
    os.mkfifo(dst / "f")  # opening it for writing would wait for a reader forever
    sb.exec("mkdir -p /tmp/t && echo data > /tmp/t/f")
    sb.get("/tmp/t", dst)
    assert stat.S_ISREG((dst / "f").lstat().st_mode) and (dst / "f").read_text() == "data\n"


def test_names_that_are_not_utf8_copy_exactly(sb, tmp_path):
    r = sb.exec(r"mkdir -p /tmp/t/$'\xff\xfe' && printf x > /tmp/t/$'\xff\xfe'/$'\x01\xc3' && ln -s $'\xe9' /tmp/t/l")
    assert r.exit_code == 0, r.stderr
    dst = tmp_path / "out"
    sb.get("/tmp/t", dst)
    assert sorted(os.listdir(os.fsencode(dst))) == [b"l", b"\xff\xfe"]
    assert os.listdir(os.fsencode(dst) + b"/\xff\xfe") == [b"\x01\xc3"]
    assert os.readlink(os.fsencode(dst) + b"/l") == b"\xe9"


def test_a_sparse_file_costs_the_host_what_it_costs_the_jail(sb, tmp_path):
    r = sb.exec(
        "printf head > /tmp/huge && printf tail | dd of=/tmp/huge bs=1 seek=$((1<<40)) conv=notrunc status=none"
    )
    assert r.exit_code == 0, r.stderr
    sb.get("/tmp/huge", tmp_path / "huge")
    st = (tmp_path / "huge").stat()
    assert st.st_size == (1 << 40) + 4
    assert st.st_blocks * 512 < 1 << 20  # a terabyte apparent, a few blocks on disk
    with open(tmp_path / "huge", "rb") as f:
        assert f.read(4) == b"head"
        f.seek(1 << 40)
        assert f.read() == b"tail"


@pytest.mark.parametrize("rel", ["", ".", "..", "a/../b", "a//b", "/abs", "a/.", "nul\0byte", b"a/\xff/.."])
def test_unsafe_names_are_refused_before_any_write(tmp_path, rel):
    with pytest.raises(SandboxFileError, match="unsafe relative path"):
        components(rel)
    with Destination(tmp_path / "d") as out, pytest.raises(SandboxFileError):
        out.write(rel, b"x")
    assert os.listdir(tmp_path / "d") == []


def test_destination_never_chmods_or_writes_through_links(tmp_path, outside):
    before = snapshot(outside)
    dst = tmp_path / "d"
    dst.mkdir()
    os.symlink(outside, dst / "dir")
    os.symlink(outside / "secret", dst / "file")
    os.symlink(outside / "sub", dst / "mid")
    with Destination(dst) as out:
        with pytest.raises(SandboxFileError, match="in the way"):
            out.write("mid/x", b"through a link")  # a parent that is a link is never entered
        out.mkdir("dir", 0o7777)
        out.write("file", b"mine", 0o6777)
        out.symlink("dir/link", "/etc/passwd")
    assert snapshot(outside) == before
    assert stat.S_IMODE((dst / "dir").lstat().st_mode) == 0o777
    assert stat.S_IMODE((dst / "file").lstat().st_mode) == 0o777 and (dst / "file").read_bytes() == b"mine"
    assert os.readlink(dst / "dir" / "link") == "/etc/passwd"
