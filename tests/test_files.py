"""put/get/read_file/write_file: exact bytes, trees, symlinks resolved in the jail (acceptance point 3)."""

from __future__ import annotations

import hashlib
import os

import pytest

from jailbox.sandbox import Sandbox
from jailbox.sandbox.errors import SandboxFileError


def test_fifty_megabyte_file_round_trips_byte_for_byte(sb, tmp_path):
    data = os.urandom(50 * 1024 * 1024)
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    sb.put(src, "/testbed/input/big.bin")
    inside = sb.exec("sha256sum /testbed/input/big.bin").stdout.split()[0]
    assert inside == hashlib.sha256(data).hexdigest()
    sb.get("/testbed/input/big.bin", tmp_path / "back.bin")
    assert (tmp_path / "back.bin").read_bytes() == data
    assert sb.read_file("/testbed/input/big.bin") == data


def test_write_file_and_read_file(sb):
    sb.write_file("/testbed/deep/dir/script.sh", "#!/bin/sh\necho from-script\n", mode=0o755)
    assert sb.exec("/testbed/deep/dir/script.sh").stdout == "from-script\n"
    assert sb.exec("stat -c %a /testbed/deep/dir/script.sh").stdout.strip() == "755"
    sb.write_file("relative.txt", b"\x00\xffbinary")
    assert sb.read_file("/testbed/relative.txt") == b"\x00\xffbinary"
    sb.write_file("relative.txt", b"short")
    assert sb.read_file("relative.txt") == b"short"


def test_directory_tree_round_trips(sb, tmp_path):
    src = tmp_path / "tree"
    (src / "a" / "b").mkdir(parents=True)
    (src / "empty").mkdir()
    (src / "a" / "b" / "deep.txt").write_text("deep")
    (src / "top.bin").write_bytes(os.urandom(4096))
    (src / "exe.sh").write_text("#!/bin/sh\necho run\n")
    os.chmod(src / "exe.sh", 0o750)
    os.symlink("a/b/deep.txt", src / "link")
    sb.put(src, "/testbed/tree")
    listing = sb.exec("cd /testbed/tree && find . | sort && readlink link && ./exe.sh").stdout
    assert listing.split("\n")[:8] == [
        ".",
        "./a",
        "./a/b",
        "./a/b/deep.txt",
        "./empty",
        "./exe.sh",
        "./link",
        "./top.bin",
    ]
    assert "a/b/deep.txt\nrun\n" in listing
    sb.exec("echo made-inside > /testbed/tree/a/new.txt")
    out = tmp_path / "out"
    sb.get("/testbed/tree", out)
    assert (out / "a" / "b" / "deep.txt").read_text() == "deep"
    assert (out / "a" / "new.txt").read_text() == "made-inside\n"
    assert (out / "top.bin").read_bytes() == (src / "top.bin").read_bytes()
    assert os.readlink(out / "link") == "a/b/deep.txt"
    assert (out / "empty").is_dir()
    assert os.stat(out / "exe.sh").st_mode & 0o777 == 0o750


def test_symlink_to_a_host_secret_resolves_inside_the_jail(mini_rootfs, tmp_path):
    secret = tmp_path / "host-secret"
    secret.write_text("HOST SECRET")
    with Sandbox(rootfs=str(mini_rootfs)) as sb:
        sb.exec(f"ln -s /etc/shadow /testbed/shadow-link; ln -s {secret} /testbed/host-link")
        assert sb.read_file("/testbed/shadow-link") == b"jail-shadow-content\n"
        with pytest.raises(SandboxFileError) as info:
            sb.read_file("/testbed/host-link")
        assert info.value.filename == "/testbed/host-link"
        sb.get("/testbed/shadow-link", tmp_path / "got")
        assert (tmp_path / "got").read_text() == "jail-shadow-content\n"
        with pytest.raises(SandboxFileError):
            sb.write_file("/testbed/host-link", b"the link's target directory is not in the jail")
        sb.exec(f"mkdir -p {secret.parent}")
        sb.write_file("/testbed/host-link", b"written through the link")
        assert sb.read_file(str(secret)) == b"written through the link"
    assert secret.read_text() == "HOST SECRET"


def test_file_errors_name_the_path(sb):
    with pytest.raises(SandboxFileError) as info:
        sb.read_file("/no/such/file")
    assert info.value.filename == "/no/such/file" and "No such file" in str(info.value)
    with pytest.raises(SandboxFileError, match="Is a directory"):
        sb.read_file("/testbed")
    sb.exec("mkfifo /testbed/fifo")
    with pytest.raises(SandboxFileError, match="regular file"):
        sb.read_file("/testbed/fifo")
    with pytest.raises(SandboxFileError):
        sb.read_file("/dev/zero")
    with pytest.raises(SandboxFileError):
        sb.put("/nonexistent/host/path", "/testbed/x")
    with pytest.raises(SandboxFileError):
        sb.write_file("/usr/bin/jailbox-probe", b"x")
    sb.write_file("/testbed/big", b"x" * 100)
    with pytest.raises(SandboxFileError, match="max_bytes"):
        sb.read_file("/testbed/big", max_bytes=10)
