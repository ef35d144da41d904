"""jailbox doctor: correct on this machine, and every fix it prints turns its failure into OK."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import JAILBOX

from jailbox.sandbox.checks import doctor
from jailbox.sandbox.checks.doctor import Host
from jailbox.sandbox.child import spec

ROOT = Path(__file__).resolve().parent.parent


def fake_host(tmp_path: Path, uid: int = 1000, **sysctls: str) -> Host:
    proc_sys = tmp_path / "sys"
    for name, value in {"user/max_user_namespaces": "15000", **sysctls}.items():
        (proc_sys / name).parent.mkdir(parents=True, exist_ok=True)
        (proc_sys / name).write_text(value + "\n")
    return Host(proc_sys=proc_sys, subuid=tmp_path / "subuid", subgid=tmp_path / "subgid",
                path=str(tmp_path / "bin"), uid=uid, user="alice")  # fmt: skip


@pytest.mark.parametrize(
    ("sysctl", "bad", "good", "fix"),
    [
        ("kernel/unprivileged_userns_clone", "0", "1", "sudo sysctl -w kernel.unprivileged_userns_clone=1"),
        ("kernel/apparmor_restrict_unprivileged_userns", "1", "0",
         "sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0"),
        ("user/max_user_namespaces", "0", "28633", "sudo sysctl -w user.max_user_namespaces=28633"),
    ],
)  # fmt: skip
def test_userns_sysctl_failures_and_their_fixes(tmp_path, sysctl, bad, good, fix):
    probe = doctor.userns_settings(fake_host(tmp_path, **{sysctl: bad}))
    assert probe.status == "failing" and probe.fix.startswith(fix)
    value = fix.split("=")[-1].split()[0]  # apply the fix to the simulated host
    assert value == good
    assert doctor.userns_settings(fake_host(tmp_path, **{sysctl: value})).status == "ok"


def test_id_range_failures_and_their_fixes(tmp_path):
    host = fake_host(tmp_path)
    probe = doctor.id_ranges(host)
    assert probe.status == "degraded" and "newuidmap missing" in probe.detail
    assert probe.fix.startswith("sudo apt-get install uidmap && sudo usermod --add-subuids 100000-165535")
    (tmp_path / "bin").mkdir()
    tool = tmp_path / "bin" / "newuidmap"
    shutil.copy("/bin/true", tool)
    os.chmod(tool, 0o4755)  # what installing uidmap gives
    probe = doctor.id_ranges(host)
    assert probe.status == "degraded" and "no range for alice" in probe.detail
    for path in (host.subuid, host.subgid):  # what usermod --add-subuids/--add-subgids writes
        path.write_text("alice:100000:65536\n")
    assert doctor.id_ranges(host).status == "ok"


def test_slirp4netns_and_state_dir_fixes(tmp_path):
    host = fake_host(tmp_path)
    probe = doctor.slirp4netns(host)
    assert probe.status == "degraded" and probe.fix == "sudo apt-get install slirp4netns"
    (tmp_path / "bin").mkdir()
    shutil.copy("/bin/true", tmp_path / "bin" / "slirp4netns")
    host = dataclasses.replace(host, tun=tmp_path / "tun")
    probe = doctor.slirp4netns(host)
    assert probe.status == "degraded" and probe.fix.startswith(f"sudo chmod 0666 {host.tun}")
    host.tun.write_text("")
    assert doctor.slirp4netns(host).status == "ok"
    blocked = tmp_path / "file"
    blocked.write_text("")
    probe = doctor.state(blocked / "state")
    assert probe.status == "failing" and "JAILBOX_STATE_DIR" in probe.fix
    assert doctor.state(tmp_path / "state").status == "ok"


def test_rootfs_build_fixes(tmp_path):
    host = fake_host(tmp_path)
    probe = doctor.rootfs_build(host)
    assert probe.status == "degraded" and probe.fix == "sudo apt-get install mmdebstrap"
    (tmp_path / "bin").mkdir()
    shutil.copy("/bin/true", tmp_path / "bin" / "mmdebstrap")
    probe = doctor.rootfs_build(host)
    assert probe.status == "degraded" and probe.fix.endswith("--add-subgids 100000-165535 alice")
    (tmp_path / "subuid").write_text("alice:100000:65536\n")
    (tmp_path / "subgid").write_text("alice:100000:65536\n")
    assert doctor.rootfs_build(host).status == "ok"
    assert doctor.rootfs_build(dataclasses.replace(host, uid=0, subuid=tmp_path / "none")).status == "ok"


def test_doctor_on_this_machine_line_by_line():
    r = subprocess.run([*JAILBOX, "doctor", "--json"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    probes = {p["name"]: p for p in json.loads(r.stdout)}
    expected = {
        "kernel": "ok",
        "user namespaces": "ok",
        "user namespace (live)": "ok",
        "overlayfs in a user namespace": "ok",
        "id ranges": "ok" if os.getuid() == 0 or doctor.id_ranges(Host()).status == "ok" else "degraded",
        "seccomp user notification": "ok",
        "cgroups": "ok" if os.getuid() == 0 else "degraded",
        "memory and disk bounds": "ok" if os.getuid() == 0 else "degraded",
        "pids budget and kernel counters": "ok",
        "slirp4netns": "ok"
        if shutil.which("slirp4netns") and os.access("/dev/net/tun", os.R_OK | os.W_OK)
        else "degraded",
        "rootfs build": "ok"
        if shutil.which("mmdebstrap") and (os.getuid() == 0 or doctor.id_ranges(Host()).status == "ok")
        else "degraded",
        "state directory": "ok",
    }
    assert {name: p["status"] for name, p in probes.items()} == expected
    assert r.returncode == 0
    if os.getuid() != 0:
        assert "cpus not enforced" in probes["cgroups"]["detail"]
    assert f"/dev: 64 KiB, 256 inodes; ptys: {spec.PTYS} per jail" in probes["memory and disk bounds"]["detail"]
    text = subprocess.run([*JAILBOX, "doctor"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120).stdout  # fmt: skip
    assert len([line for line in text.splitlines() if not line.startswith(" ")]) == len(expected)


def test_live_userns_failure_is_reported_with_the_fix():
    """A real refusal: inside a user namespace whose own namespace limit is 0."""
    doctor_json = shlex.join([*JAILBOX, "doctor", "--json"])
    script = f"echo 0 > /proc/sys/user/max_user_namespaces && exec {doctor_json}"
    r = subprocess.run(["unshare", "--user", "--map-root-user", "sh", "-c", script], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    probes = {p["name"]: p for p in json.loads(r.stdout)}
    assert r.returncode == 1
    assert probes["user namespaces"]["status"] == "failing"
    assert probes["user namespaces"]["fix"] == "sudo sysctl -w user.max_user_namespaces=28633"
    assert probes["user namespace (live)"]["status"] == "failing"


def test_doctor_inside_a_jail_names_the_container_fix():
    """A real container-like host: jailbox's own sandbox, whose seccomp policy refuses unshare."""
    from jailbox.sandbox import Mount, Sandbox

    mounts = [Mount(ROOT, str(ROOT))]
    if not Path(sys.prefix).is_relative_to(ROOT):
        mounts.append(Mount(sys.prefix, sys.prefix))
    if not Path(sys.base_prefix).is_relative_to("/usr"):  # the venv's python (pyenv's, under /root)
        mounts.append(Mount(sys.base_prefix, sys.base_prefix))
    with Sandbox(mounts=mounts, env={"JAILBOX_STATE_DIR": "/tmp/jb"}) as sb:
        r = sb.exec([f"{sys.prefix}/bin/jailbox", "doctor", "--json"], cwd=str(ROOT), timeout=120)
    probes = {p["name"]: p for p in json.loads(r.stdout)}
    assert r.exit_code == 1, r.stderr
    live = probes["user namespace (live)"]
    assert live["status"] == "failing" and "Operation not permitted" in live["detail"]
    assert "seccomp=unconfined" in live["fix"]
    assert probes["overlayfs in a user namespace"]["fix"] == "fix the user namespace line first"
    assert probes["seccomp user notification"]["status"] == "degraded"
    assert "nested sandbox" in probes["seccomp user notification"]["detail"]
    assert "unshare" in r.refused_syscalls
