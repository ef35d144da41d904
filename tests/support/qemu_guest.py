"""Boot a throwaway QEMU guest (software emulation) with a real cgroup v2 hierarchy, sharing this
host's filesystem read-only, and run a shell script in it as pid 1's child.

This host has cgroup v1 only; the guest lets the same test code run against cgroup v2 for real.
The guest kernel is Debian's generic kernel package and a busybox-static initramfs; both are
fetched with ``apt-get download`` once and cached.

The host's filesystem is mounted with ``cache=loose``: nothing changes it while the guest runs (the
test that boots it waits), and without the guest's cache every file Python opens or stats is a round
trip to QEMU; under emulation that was a third of the guest's time (the cgroup v2 test took 132 s
without it, 95 s with it, its two passes one after the other).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

MODULES = (
    "drivers/virtio/virtio_ring", "drivers/virtio/virtio", "drivers/virtio/virtio_pci_legacy_dev",
    "drivers/virtio/virtio_pci_modern_dev", "drivers/virtio/virtio_pci", "fs/netfs/netfs", "fs/fscache/fscache",
    "net/9p/9pnet", "net/9p/9pnet_virtio", "fs/9p/9p", "fs/overlayfs/overlay",
)  # fmt: skip
OUTPUT_TAIL = 20000  # bytes of each output file returned
# MiB of translated code QEMU keeps (its default, 1 GiB, is touched as it fills: the host would see
# QEMU grow while the guest runs)
CODE_CACHE_MIB = 256

INIT = """#!/bin/busybox sh
B=/bin/busybox
$B mkdir -p /proc /dev /newroot
$B mount -t proc proc /proc
$B mount -t devtmpfs dev /dev
for m in {modules}; do $B insmod /mods/$m.ko; done
$B mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose host /newroot
$B mount -o bind /newroot /newroot/mnt
$B mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 scratch /newroot/var/tmp
$B mount -t proc proc /newroot/proc
$B mount -t sysfs sys /newroot/sys
$B mount -t cgroup2 none /newroot/sys/fs/cgroup
$B mount -t devtmpfs dev /newroot/dev
$B mount -t devpts devpts /newroot/dev/pts
for d in tmp run home root; do $B mount -t tmpfs tmpfs /newroot/$d; done  # the host's, unhidden, at /mnt
exec $B switch_root /newroot /bin/sh -c \
  '/bin/sh /var/tmp/run.sh > /var/tmp/out.txt 2>&1; echo $? > /var/tmp/rc.txt; sync'
"""


def cache_dir() -> Path:
    return Path(os.environ.get("JAILBOX_QEMU_CACHE", "/var/tmp/jailbox-qemu"))


def _download(package: str, into: Path) -> Path:
    subprocess.run(["apt-get", "download", package], cwd=into, check=True, capture_output=True)
    return next(into.glob(f"{package.replace('+', '?')}_*.deb"))


def assets() -> tuple[Path, Path]:
    """(kernel, initramfs), built once into the cache directory."""
    cache = cache_dir()
    version = hashlib.sha256((INIT + repr(MODULES)).encode()).hexdigest()[:12]
    kernel, initrd = cache / "vmlinuz", cache / f"initrd-{version}.gz"
    if kernel.exists() and initrd.exists():
        return kernel, initrd
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as work_dir:
        work = Path(work_dir)
        depends = subprocess.run(["apt-cache", "depends", "linux-image-amd64"], capture_output=True, text=True,
                                 check=True).stdout  # fmt: skip
        image = next(line.split()[-1] for line in depends.splitlines() if "Depends: linux-image-" in line)
        for package in (image, "busybox-static"):
            subprocess.run(["dpkg-deb", "-x", str(_download(package, work)), str(work / "x")], check=True)
        root = work / "initrd"
        (root / "bin").mkdir(parents=True)
        (root / "mods").mkdir()
        shutil.copy(work / "x/bin/busybox", root / "bin/busybox")
        modules = next((work / "x/lib/modules").iterdir()) / "kernel"
        for module in MODULES:
            shutil.copy(modules / f"{module}.ko", root / "mods")
        names = " ".join(m.rsplit("/", 1)[1] for m in MODULES)
        (root / "init").write_text(INIT.format(modules=names))
        os.chmod(root / "init", 0o755)
        listing = "\n".join(str(p.relative_to(root)) for p in sorted(root.rglob("*"))).encode()
        archive = subprocess.run(["cpio", "-o", "-H", "newc"], cwd=root, input=listing, capture_output=True,
                                 check=True).stdout  # fmt: skip
        (work / "initrd.gz").write_bytes(gzip.compress(archive, 1))
        shutil.copy(next((work / "x/boot").glob("vmlinuz-*")), work / "vmlinuz")
        os.replace(work / "initrd.gz", initrd)
        if not kernel.exists():
            os.replace(work / "vmlinuz", kernel)
    return kernel, initrd


def run(script: str, timeout: float = 1200, booted: Callable[[], None] | None = None) -> tuple[int, str]:
    """Boot, run ``script`` with /bin/sh inside the guest, power off; (exit code, its output).

    The guest sees the host's filesystem read-only at / (with fresh /tmp, /run, /home and /root)
    and all of it, unhidden, at /mnt. Its /var/tmp is this run's scratch folder: files the script
    writes there named ``*.out`` come back before its output (also when the guest timed out, with
    exit code -1 and the console's tail). ``booted`` is called once the script has started.

    QEMU boots at the caller's priority (the caller holds the host alone meanwhile, and a guest kernel
    starved of CPU at boot can fail its timer check and panic), then runs at the lowest (``nice`` 19):
    it is background work that tests beside it do not wait for. Its memory is taken at boot, so the
    host's available memory moves by the guest's 2 GiB before ``booted``; after it only QEMU's code
    cache grows (``CODE_CACHE_MIB`` at most)."""
    kernel, initrd = assets()
    with tempfile.TemporaryDirectory(prefix="jailbox-guest-") as scratch_dir, tempfile.TemporaryFile() as console:
        scratch = Path(scratch_dir)
        os.chmod(scratch, 0o777)
        (scratch / "run.sh").write_text(script)
        command = [
            "qemu-system-x86_64", "-accel", f"tcg,tb-size={CODE_CACHE_MIB}", "-m", "2048", "-mem-prealloc",
            "-smp", "2", "-nographic", "-nodefaults",
            "-serial", "stdio", "-no-reboot", "-kernel", str(kernel), "-initrd", str(initrd),
            "-append", "console=ttyS0 quiet panic=-1 no_timer_check rdinit=/init",
            "-virtfs", "local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap",
            "-virtfs", f"local,path={scratch},mount_tag=scratch,security_model=none,multidevs=remap",
        ]  # fmt: skip
        guest = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        ended = ""
        started = False
        while True:
            try:
                guest.wait(0.2)
                break
            except subprocess.TimeoutExpired:
                pass
            if not started and (scratch / "out.txt").exists():  # the init's redirect made it
                started = True
                _lowest_priority(guest.pid)
                if booted is not None:
                    booted()
            if time.monotonic() > deadline:  # say how far the guest got, not only that it did not end
                guest.kill()
                guest.wait()
                ended = f"\n=== the guest was still running after {timeout:.0f} s and was killed\n"
                break
        console.seek(max(0, os.fstat(console.fileno()).st_size - 4000))
        console_tail = console.read().decode(errors="replace")
        rc_file = scratch / "rc.txt"
        output = "".join(
            f"=== {path.name}\n{_tail(path, OUTPUT_TAIL)}\n"
            for path in [*sorted(scratch.glob("*.out")), scratch / "out.txt"]
            if path.exists()
        )
        if ended or not rc_file.exists():
            return -1, output + "=== console\n" + console_tail + ended
        return int(_tail(rc_file, 16).strip() or -1), output


def _lowest_priority(pid: int) -> None:
    """``nice`` 19 for every thread of ``pid`` (a nice value is a thread's: the vCPUs are threads)."""
    with contextlib.suppress(FileNotFoundError):  # QEMU ended meanwhile
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                os.setpriority(os.PRIO_PROCESS, int(tid), 19)


def _tail(path: Path, limit: int) -> str:
    """The last ``limit`` bytes of a file the guest wrote: not through a link it made, and not read whole."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        return f"(not read: {exc.strerror})"
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "(not a regular file)"
        file.seek(max(0, os.fstat(fd).st_size - limit))
        return file.read(limit).decode(errors="replace")
