"""What a command inside a jail can see: acceptance point 2, for root and unprivileged runs alike."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jailbox.sandbox import Mount, Sandbox


def test_pid1_is_the_init_and_no_host_process_is_visible(sb):
    r = sb.exec("for p in /proc/[0-9]*; do echo ${p#/proc/} $(tr '\\0' ' ' < $p/cmdline); done")
    assert r.exit_code == 0, r.stderr
    procs = dict(line.split(" ", 1) for line in r.stdout.strip().splitlines())
    assert "jailbox.sandbox.child.zygote" in procs["1"]
    assert sb.exec("cat /proc/1/comm").stdout == "jailbox-init\n"
    assert str(os.getpid()) not in procs or "pytest" not in procs.get(str(os.getpid()), "")
    assert all("pytest" not in cmd for cmd in procs.values())
    assert len(procs) <= 4  # init, the shell, its subshells


def test_hostname_is_the_sandboxs():
    with Sandbox(hostname="box-7") as sb:
        assert sb.exec("hostname").stdout.strip() == "box-7"
        assert "box-7" in sb.read_file("/etc/hosts").decode()
    with Sandbox() as sb:
        assert sb.exec("cat /proc/sys/kernel/hostname").stdout.strip() == "sandbox"


HOST_SECRETS = ("/etc/shadow", "/etc/ssl/private", "/etc/ssh", "/etc/sudoers", "/var/log/syslog")


def _plant(path: Path, secret: str) -> Path | None:
    """Write ``secret`` to ``path`` if this user may; the path, or None where it may not."""
    try:
        path.write_text(secret)
    except OSError:
        return None
    return path


def test_host_home_root_and_environment_are_absent(monkeypatch, tmp_path):
    """Secrets are planted first (root: in /etc, /etc/ssl/private, /var/log and /root too), so each
    check looks for something the host has; the jail's view of /etc, /var, /run, /root and /home
    holds none of them by name or content."""
    secret = f"jailbox-planted-secret-{os.getpid()}"
    monkeypatch.setenv("JAILBOX_TEST_SECRET", secret)
    name = f".jailbox-marker-{os.getpid()}"
    places = [Path.home() / name, Path("/etc") / name, Path("/etc/ssl/private") / name, Path("/var/log") / name]
    places += [Path("/root") / name, Path("/tmp") / name, Path("/run") / name, Path("/var/tmp") / name]
    planted = [p for p in (_plant(place, secret) for place in dict.fromkeys(places)) if p is not None]
    try:
        assert Path.home() / name in planted and Path("/tmp") / name in planted
        if os.getuid() == 0:
            assert len(planted) == len(set(places)), planted
        with Sandbox() as sb:
            r = sb.exec("env; ls -A /home /root; ls -A /run /var/tmp; ls / ")
            assert r.exit_code == 0, r.stderr
            assert secret not in r.stdout and "JAILBOX_TEST_SECRET" not in r.stdout
            assert name not in r.stdout
            env = dict(line.split("=", 1) for line in sb.exec(["env"]).stdout.splitlines())
            assert set(env) <= {"PATH", "HOME", "LANG", "TERM", "PWD", "SHLVL", "_", "OLDPWD"}
            assert env["HOME"] == "/root" and env["LANG"] == "C.UTF-8"
            for path in planted:
                assert sb.exec(["test", "-e", str(path)]).exit_code == 1, path
            found = sb.exec(["grep", "-rlsF", secret, "/etc", "/var", "/run", "/root", "/home", "/tmp"])
            assert (found.exit_code, found.stdout) == (1, ""), found.stdout
            present = [path for path in HOST_SECRETS if os.path.lexists(path)]
            assert "/etc/shadow" in present
            for path in present:
                assert sb.exec(["test", "-e", path]).exit_code == 1, path
    finally:
        for path in planted:
            path.unlink()


def test_write_to_usr_fails_on_host_rootfs(sb):
    r = sb.exec("touch /usr/jailbox-probe")
    assert r.exit_code != 0
    assert "Read-only file system" in r.stderr
    assert not Path("/usr/jailbox-probe").exists()
    ok = sb.exec("echo data > /etc/new-file && cat /etc/new-file && echo x > /testbed/f && cat /testbed/f")
    assert ok.exit_code == 0 and ok.stdout == "data\nx\n"
    assert not Path("/etc/new-file").exists()


def test_writes_to_a_directory_rootfs_land_in_the_overlay(mini_rootfs):
    before = sorted(p.name for p in (mini_rootfs / "etc").iterdir())
    with Sandbox(rootfs=str(mini_rootfs)) as sb:
        r = sb.exec("echo changed > /etc/motd && echo new > /etc/created && cat /etc/motd /etc/created")
        assert r.exit_code == 0, r.stderr
        assert r.stdout == "changed\nnew\n"
    assert (mini_rootfs / "etc" / "motd").read_text() == "original motd\n"
    assert sorted(p.name for p in (mini_rootfs / "etc").iterdir()) == before


def test_tmpfs_upper_layer(mini_rootfs):
    with Sandbox(rootfs=str(mini_rootfs), upper="tmpfs", tmpfs_size="8M") as sb:
        assert sb.exec("echo hi > /etc/x && cat /etc/x").stdout == "hi\n"
        big = sb.exec("cat /dev/zero > /testbed/fill")
        assert big.exit_code != 0 and "No space left" in big.stderr
    assert not (mini_rootfs / "etc" / "x").exists()


def test_network_none_has_only_loopback_and_no_host_services(sb, loopback_server):
    devices = sb.exec("tail -n +3 /proc/net/dev | cut -d: -f1").stdout.split()
    assert devices == ["lo"]
    r = sb.exec(f"echo > /dev/tcp/127.0.0.1/{loopback_server.port}")
    assert r.exit_code != 0
    assert loopback_server.accepted == 0
    local = sb.exec('python3 -c \'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print("ok")\'')
    assert local.stdout.strip() == "ok"


def test_network_host_reaches_host_loopback(loopback_server):
    with Sandbox(network="host") as sb:
        r = sb.exec(f"exec 3<>/dev/tcp/127.0.0.1/{loopback_server.port}; head -1 <&3")
        assert r.exit_code == 0, r.stderr
        assert r.stdout == "host-secret-service\n"


def test_no_new_privs_and_no_capabilities(sb):
    status = sb.exec("cat /proc/self/status").stdout
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    assert fields["NoNewPrivs"].strip() == "1"
    for cap in ("CapEff", "CapPrm", "CapInh", "CapBnd", "CapAmb"):
        assert int(fields[cap], 16) == 0, cap
    assert sb.exec("id -u").stdout.strip() == "0"


def test_cap_add_all_keeps_namespace_capabilities():
    with Sandbox(cap_add=["ALL"]) as sb:
        status = sb.exec("grep CapEff /proc/self/status").stdout
        assert int(status.split()[1], 16) != 0


def test_proc_masked_and_readonly_paths(sb):
    assert sb.exec("cat /proc/kcore | head -c 10 | wc -c").stdout.strip() == "0"
    r = sb.exec("echo 1 > /proc/sys/kernel/domainname")
    assert r.exit_code != 0 and "Read-only" in r.stderr
    assert sb.exec("ls /proc/acpi 2>/dev/null | wc -l").stdout.strip() == "0"


def test_dev_is_minimal(sb):
    names = set(sb.exec("ls /dev").stdout.split())
    assert {"null", "zero", "full", "random", "urandom", "tty", "ptmx", "pts", "shm", "fd", "stdout"} <= names
    assert not {"vda", "sda", "mem", "kmsg"} & names
    assert sb.exec("head -c 16 /dev/urandom | wc -c").stdout.strip() == "16"
    assert sb.exec("echo x > /dev/full").exit_code != 0
    assert sb.exec("python3 -c 'import os; m, s = os.openpty(); print(os.ttyname(s))'").stdout.startswith("/dev/pts/")


def test_user_mounts_readonly_and_readwrite(tmp_path):
    inp, out = tmp_path / "in", tmp_path / "out"
    inp.mkdir()
    out.mkdir()
    (inp / "data.txt").write_text("input data")
    mounts = [Mount(inp, "/testbed/input"), Mount(out, "/testbed/output", readonly=False, give=True)]
    with Sandbox(mounts=mounts) as sb:
        assert sb.exec("cat /testbed/input/data.txt").stdout == "input data"
        denied = sb.exec("echo x > /testbed/input/new")
        assert denied.exit_code != 0 and "Read-only" in denied.stderr
        assert sb.exec("echo result > /testbed/output/answer.txt").exit_code == 0
    assert (out / "answer.txt").read_text() == "result\n"
    assert not (inp / "new").exists()


def test_mount_points_in_a_hostile_rootfs_stay_inside(mini_rootfs, tmp_path):
    hostile = tmp_path / "hostile"
    hostile.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(str(outside), hostile / "testbed")
    (hostile / "bin").symlink_to(mini_rootfs / "bin")
    with Sandbox(rootfs=str(hostile)) as sb:
        sb.write_file("/testbed/x", b"data")
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("upper", ["disk", "tmpfs"])
def test_workdir_is_testbed_and_writable(upper):
    with Sandbox(upper=upper) as sb:
        r = sb.exec("pwd; touch file; ls")
        assert r.stdout == "/testbed\nfile\n"


def test_deleting_and_recreating_lower_layer_entries(mini_rootfs):
    with Sandbox(rootfs=str(mini_rootfs)) as sb:
        r = sb.exec(
            "rm /etc/motd && rm -rf /bin/../etc && mkdir /etc && echo again > /etc/motd && ls /etc && cat /etc/motd"
        )
        assert r.exit_code == 0, r.stderr
        assert r.stdout == "motd\nagain\n"
    assert (mini_rootfs / "etc" / "motd").read_text() == "original motd\n"


def test_no_host_descriptors_reach_commands(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("host descriptor")
    fd = os.open(secret, os.O_RDONLY)
    os.set_inheritable(fd, True)
    try:
        with Sandbox() as sb:
            r = sb.exec(["ls", "/proc/self/fd"])
            assert r.stdout.split() == ["0", "1", "2", "3"]  # 3: ls's own directory handle
            assert sb.exec(f"cat /proc/self/fd/{fd}").exit_code != 0
    finally:
        os.close(fd)
