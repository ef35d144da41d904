"""One command as another user of the tree than the sandbox's own (``exec(..., user=...)``).

Real jails on a small directory tree whose /etc/passwd has root and ``user`` (1000:1000).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from conftest import own_for_jails

from jailbox.sandbox import Sandbox
from jailbox.sandbox.errors import ConfigError, ExecError


@pytest.fixture
def tree(mini_rootfs: Path, tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    shutil.copytree(mini_rootfs, root, symlinks=True)
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\n")
    (root / "etc" / "group").write_text("root:x:0:\nuser:x:1000:\nextra:x:2000:user\n")
    if os.getuid() == 0:
        own_for_jails(root)
    return root


def test_a_command_runs_as_the_user_it_names(tree: Path) -> None:
    with Sandbox(rootfs=str(tree)) as sb:
        assert sb.exec("id -u; id -g").stdout == "0\n0\n"
        r = sb.exec('id -u; id -g; id -G; echo "$HOME"', user="user")
        assert r.stdout.split() == ["1000", "1000", "1000", "2000", "/home/user"], r
        assert sb.exec("id -u; id -g", user="1234:1235").stdout == "1234\n1235\n"
        assert sb.exec("id -u", user="root").stdout == "0\n"
        for bad in ("nobody", "user:nogroup"):
            with pytest.raises(ConfigError, match="not in the root filesystem"):
                sb.exec("true", user=bad)
        for bad in ("", "x" * 65, "a\0b"):
            with pytest.raises(ExecError, match="user must be"):
                sb.exec("true", user=bad)
        tty = sb.exec_tty(["/bin/bash", "-c", "id -u"], user="user")
        out = b""
        while chunk := _read(tty.master):
            out += chunk
        tty.close()
        assert b"1000" in out, out


def test_a_sandbox_of_a_user_runs_one_command_as_root(tree: Path) -> None:
    with Sandbox(rootfs=str(tree), user="user") as sb:
        assert sb.exec("id -u").stdout == "1000\n"
        assert sb.exec('id -u; echo "$HOME"', user="root").stdout == "0\n/root\n"
        assert sb.exec("id -u").stdout == "1000\n"


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 4096)
    except OSError:  # EIO: no process holds the terminal any more
        return b""
