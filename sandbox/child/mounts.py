"""Child side: assemble the jail's filesystem and pivot into it.

Runs inside the new user and mount namespaces, before any untrusted code. The lower layer may be a
pulled image full of hostile symlinks, so every mount point is resolved with
``openat2(RESOLVE_IN_ROOT)`` and created component by component inside the new root. The mounts
are a plan of ops (``plan``) run by one loop; only the fixed paths of a trusted host lower skip
the resolution. Stdlib only.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass

from ..floor import linux as L
from . import trust
from .protocol import Step, step
from .spec import DEV_INODES, DEV_SIZE, PTYS, Bind, JailSpec

# Host-wide state nobody in a jail needs: Docker's default masked paths, plus page-frame and slab
# statistics, kernel addresses and memory layout, physical-memory and I/O port maps, and sysfs's
# energy counters, idle-page bitmap and slab caches (side channels on other tenants).
MASKED_PATHS = (
    "/proc/asound",
    "/proc/acpi",
    "/proc/interrupts",
    "/proc/kcore",
    "/proc/keys",
    "/proc/key-users",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/proc/kpagecount",
    "/proc/kpageflags",
    "/proc/kpagecgroup",
    "/proc/slabinfo",
    "/proc/kallsyms",
    "/proc/kmsg",
    "/proc/vmallocinfo",
    "/proc/pagetypeinfo",
    "/proc/iomem",
    "/proc/ioports",
    "/proc/mtrr",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
    "/sys/kernel/mm/page_idle",
    "/sys/kernel/slab",
    "/sys/kernel/vmcoreinfo",
)
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
DEV_LINKS = {
    "fd": "/proc/self/fd",
    "stdin": "/proc/self/fd/0",
    "stdout": "/proc/self/fd/1",
    "stderr": "/proc/self/fd/2",
    "ptmx": "pts/ptmx",
}


@dataclass(frozen=True)
class Op:
    """One step of the mount plan: mount something at ``dst`` inside the new root."""

    step: Step  # what a failure is reported as
    dst: str  # absolute path inside the jail
    is_dir: bool  # the mount point is a directory (else a file)
    system: bool  # a fixed path of the layout: a trusted host lower may use it without resolving it
    run: Callable[[str], None]  # given the resolved host-side path of ``dst``


def plan(spec: JailSpec, trees: set[str]) -> list[Op]:
    """The mounts of the new root, in order (later ones may land inside earlier ones). ``trees``:
    the sources that are detached idmapped mounts not attached yet (``_attach``)."""
    ops = [Op(Step.BIND, b.dst, b.is_dir, True, functools.partial(_bind, b, trees)) for b in spec.system_binds]
    ops += [
        Op(Step.PROC, "/proc", True, True, _mount_proc),
        Op(Step.SYS, "/sys", True, True, _mount_sys),
        Op(Step.DEV, "/dev", True, True, _mount_dev),
        Op(Step.TMP, "/tmp", True, True, functools.partial(_mount_scratch, "tmp")),
        Op(Step.WORKDIR, spec.workdir, True, False, _workdir),
    ]
    ops += [Op(Step.BIND, b.dst, b.is_dir, False, functools.partial(_bind, b, trees)) for b in spec.user_binds]
    return ops


def build(spec: JailSpec, trees: dict[str, int]) -> int:
    """Mount the whole jail and pivot_root into it. ``trees``: host path -> a detached idmapped
    mount of it (the launcher's, for a jail with ids of its own), used in place of a bind.

    The staging directory is shared by all jails on the host but each jail mounts its own tmpfs
    over it in its private mount namespace, so the mount points cost nothing on disk. Only a disk
    writable layer lives in the sandbox's own state directory. That tmpfs is the jail's only
    writable one: /tmp and /dev/shm are directories of it, so its one size and inode count bound
    all the memory the jail can hold in files.

    Returns an ``O_PATH`` descriptor of the writable layer's directory, for the host: the one way
    to reach it once the staging tmpfs is detached, opened before anything untrusted runs.
    """
    root = "root"  # relative to the staging tmpfs, our working directory from here on
    rw = "." if spec.upper == "tmpfs" else "rw"  # the writable layer, relative to the staging tmpfs
    held: list[int] = []
    try:
        with step(Step.STAGE):
            L.mount(None, "/", None, L.MS_REC | L.MS_PRIVATE)
            spec, attached = _hold_host_paths(spec, held, trees)
            bounds = f"mode=0755,size={spec.tmpfs_size}"
            if spec.tmpfs_inodes:
                bounds += f",nr_inodes={spec.tmpfs_inodes}"
            # owned by the namespace's root, which is not who mounts it as host root (see _become_root)
            L.mount("tmpfs", spec.stage, "tmpfs", L.MS_NOSUID | L.MS_NODEV, bounds + ",uid=0,gid=0")
            # The overlay names its layers relative to the staging tmpfs, so /proc/self/mountinfo inside
            # shows "lowerdir=lower,upperdir=rw/upper" rather than the host's state directory.
            os.chdir(spec.stage)
            if spec.userns:
                _become_root(spec)
        return _assemble(spec, root, rw, attached)
    finally:
        for fd in held:  # descriptors of host directories: none may outlive the setup
            os.close(fd)


def _hold_host_paths(spec: JailSpec, held: list[int], trees: dict[str, int]) -> tuple[JailSpec, set[str]]:
    """``spec`` with its host paths (the lower, the sandbox directory, every bind's source) as
    descriptors opened now, under the ids the jail was forked with. As host root those are host
    root's own: its 0700 state and store directories are searchable now, and not once the jail
    has become root of its namespace (a subordinate id), which happens before anything is made.
    A path the launcher gave as a detached mount (``trees``) is that mount's descriptor, named in
    the set returned until its first use attaches it; a later use binds the attached mount, which
    keeps its idmap."""
    attached: set[str] = set()

    def hold(path: str) -> str:
        tree = trees.get(path)
        if tree is None:
            held.append(os.open(path, os.O_PATH | os.O_CLOEXEC))
            return f"/proc/self/fd/{held[-1]}"
        if tree not in held:
            held.append(tree)
            attached.add(f"/proc/self/fd/{tree}")
        return f"/proc/self/fd/{tree}"

    held_spec = dataclasses.replace(
        spec,
        lower=hold(spec.lower),
        layers=tuple(hold(layer) for layer in spec.layers),
        dir=None if spec.dir is None else hold(spec.dir),
        system_binds=tuple(dataclasses.replace(b, src=hold(b.src)) for b in spec.system_binds),
        user_binds=tuple(dataclasses.replace(b, src=hold(b.src)) for b in spec.user_binds),
    )
    return held_spec, attached


def _become_root(spec: JailSpec) -> None:
    """Become uid and gid 0 of the namespace, with no supplementary groups where the map allows
    it. As host root the jail was forked as host uid 0, which the map does not name: every file it
    made (the overlay's copies, a bind's new files) would be host root's. The overlay records its
    mounter's ids, so this comes before it is mounted."""
    if not spec.idmap.deny_setgroups:
        os.setgroups([])
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)
    # changing ids made us undumpable, which gives our /proc files to host root; the init's own
    # setup writes some (comm, timer slack) and turns this off again once it has
    L.prctl(L.PR_SET_DUMPABLE, 1)


def _assemble(spec: JailSpec, root: str, rw: str, trees: set[str]) -> int:
    with step(Step.STAGE):
        for path in ("root", "lower"):
            os.mkdir(path, 0o755)
        for path in ("tmp", "shm"):
            os.mkdir(path)
            os.chmod(path, 0o1777)
        if rw != ".":
            assert spec.dir is not None  # a disk writable layer has a sandbox directory (JailSpec.dir)
            os.mkdir(rw, 0o755)
            L.mount(spec.dir, rw, None, L.MS_BIND)
        for path in (rw + "/upper", rw + "/work"):
            os.mkdir(path, 0o755)
        _write_generated(rw + "/upper", spec.generated)
    with step(Step.LOWER):
        _attach(spec.lower, "lower", trees)
        # a checkpoint's layers, by short names: the overlay's options are one page
        names = [f"l{i}" for i in range(len(spec.layers))]
        for name, layer in zip(names, spec.layers, strict=True):
            os.mkdir(name, 0o755)
            _attach(layer, name, trees)
            L.make_readonly(name)
    with step(Step.OVERLAY):
        options = f"lowerdir={':'.join([*names, 'lower'])},upperdir={rw}/upper,workdir={rw}/work"
        if spec.userns:
            options += ",userxattr"  # trusted.* xattrs are out of reach in a user namespace
        L.mount("overlay", root, "overlay", 0, options)
        root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        upper = os.open(rw + "/upper", os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        here = os.readlink("/proc/self/cwd") + "/"
    try:
        if spec.ca_certs:
            # before anything is mounted inside the root: a bundle's path reaches the tree and nothing else
            with step(Step.CA_CERTS):
                trust.append(root_fd, spec.ca_certs)
        for op in plan(spec, trees):
            with step(op.step):
                # a hostile image's symlinks are resolved inside the new root, never on the host
                trusted = spec.trusted_lower and op.system
                op.run(root + op.dst if trusted else _mountpoint(root_fd, op.dst, op.is_dir, here))
    finally:
        os.close(root_fd)
    with step(Step.PIVOT):
        os.chdir(root)
        L.pivot_root(".", ".")
        L.umount2(".", L.MNT_DETACH)
        os.chdir("/")
    return upper


def _write_generated(upper: str, files: dict[str, str]) -> None:
    for rel, content in files.items():
        path = f"{upper}/{rel}"
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(content)


def _mountpoint(root_fd: int, path: str, is_dir: bool, here: str) -> str:
    """Create ``path`` inside the root if missing; return where it really is, relative to ``here``
    (the staging tmpfs, our working directory: as host root the directories above it are host
    root's own and no longer searchable, see ``_become_root``)."""
    parts = [p for p in path.split("/") if p]
    fd = os.dup(root_fd)
    try:
        for i, name in enumerate(parts):
            want_dir = is_dir or i < len(parts) - 1
            try:
                nfd = L.open_in_root(root_fd, "/".join(parts[: i + 1]), os.O_PATH)
            except FileNotFoundError:
                if os.path.islink(f"/proc/self/fd/{fd}/{name}"):
                    os.unlink(name, dir_fd=fd)  # a dangling link in the image: replace it in the overlay
                if want_dir:
                    os.mkdir(name, 0o755, dir_fd=fd)
                else:
                    os.close(os.open(name, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644, dir_fd=fd))
                nfd = L.open_in_root(root_fd, "/".join(parts[: i + 1]), os.O_PATH)
            os.close(fd)
            fd = nfd
        real = os.readlink(f"/proc/self/fd/{fd}")
        if not real.startswith(here):
            raise OSError(errno.EXDEV, f"{path} resolved outside the new root")
        return "./" + real[len(here) :]
    finally:
        os.close(fd)


def _attach(src: str, target: str, trees: set[str]) -> None:
    """Bind ``src`` (a held host path) at ``target``, or attach it there if it is a detached mount
    (once: the descriptor then stands for the attached mount, which a later use binds)."""
    if src in trees:
        L.move_mount(int(src.rsplit("/", 1)[1]), target)
        trees.discard(src)
    else:
        L.mount(src, target, None, L.MS_BIND | L.MS_REC)


def _bind(bind: Bind, trees: set[str], target: str) -> None:
    _attach(bind.src, target, trees)
    if bind.readonly:
        L.make_readonly(target)
    else:  # a setuid file or device node made here would be one on the host too: never honoured inside
        L.set_mount_attrs(target, L.MOUNT_ATTR_NOSUID | L.MOUNT_ATTR_NODEV)


def _mount_scratch(src: str, target: str) -> None:
    """A directory of the staging tmpfs (nosuid, nodev, bounded) at ``target``. ``src`` is relative to
    the staging tmpfs, the working directory during setup: as host root the jail is a subordinate id
    by now, which cannot search root's state directory above it."""
    L.mount(src, target, None, L.MS_BIND)


def _workdir(target: str) -> None:
    """Open to every user of the jail. Through a descriptor of a directory only: an image's
    ``WorkingDir: /dev/null`` must not chmod a device node (the host's, bound in)."""
    try:
        fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (NotADirectoryError, OSError) as exc:
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
        raise NotADirectoryError(errno.ENOTDIR, "the working directory is not a directory") from None
    try:
        os.fchmod(fd, 0o755)
    finally:
        os.close(fd)


def _mount_proc(proc: str) -> None:
    """Writable until the init has opened what it writes itself (``seal_proc``)."""
    L.mount("proc", proc, "proc", L.MS_NOSUID | L.MS_NODEV | L.MS_NOEXEC)
    _mask(proc, "/proc")


def seal_proc() -> tuple[int, int]:
    """Make the jail's /proc read-only, all of it, and return the init's own timer-slack file and
    the detached copy (where the init sets its own and its commands' ``oom_score_adj``).

    Every per-process knob is then out of commands' reach, not only the ones a list would name:
    the init's ``oom_score_adj`` (which a jail's root could raise), every ``timerslack_ns`` (the
    tag a timeout finds a command's processes by), ``comm``, ``mem``, ``sys``, ``sysrq-trigger``.
    The init writes its own through a detached copy of the mount, which nothing else can reach
    (a file open for writing on /proc itself would keep it from turning read-only).
    """
    tree = L.clone_mount("/proc")
    try:
        slack = os.open("self/timerslack_ns", os.O_WRONLY | os.O_CLOEXEC, dir_fd=tree)
    except BaseException:
        os.close(tree)
        raise
    L.make_readonly("/proc")
    return slack, tree


def _mount_sys(target: str) -> None:
    """A fresh read-only sysfs where the kernel allows it (own netns), else a read-only bind."""
    try:
        L.mount("sysfs", target, "sysfs", L.MS_RDONLY | L.MS_NOSUID | L.MS_NODEV | L.MS_NOEXEC)
    except PermissionError:
        L.mount("/sys", target, None, L.MS_BIND | L.MS_REC)
        L.make_readonly(target)
    _mask(target, "/sys")


def _mask(mounted_at: str, prefix: str) -> None:
    for path in MASKED_PATHS:
        if not path.startswith(prefix + "/"):
            continue
        target = mounted_at + path[len(prefix) :]
        if os.path.isdir(target) and not os.path.islink(target):
            L.mount("tmpfs", target, "tmpfs", L.MS_RDONLY, "size=0")
        elif os.path.exists(target):
            L.mount("/dev/null", target, None, L.MS_BIND)
            L.make_readonly(target)  # the host's /dev/null: its mode must not change through here


def _mount_dev(dev: str) -> None:
    L.mount("tmpfs", dev, "tmpfs", L.MS_NOSUID | L.MS_NOEXEC, f"mode=0755,size={DEV_SIZE},nr_inodes={DEV_INODES}")
    for name in DEVICES:
        node = f"{dev}/{name}"
        os.close(os.open(node, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o666))
        L.mount("/dev/" + name, node, None, L.MS_BIND)
        # The host's own node: read-only, so no chmod or chown reaches its inode through the jail
        # (reads and writes of a device are not writes to its filesystem and keep working).
        L.make_readonly(node)
    os.mkdir(dev + "/pts", 0o755)
    # Every devpts instance but the host's first draws on one count (kernel.pty.max less its reserve:
    # 3072 by default), which other sandboxes and containers share: a jail gets at most PTYS of them.
    options = f"newinstance,ptmxmode=0666,mode=0620,max={PTYS}"
    L.mount("devpts", dev + "/pts", "devpts", L.MS_NOSUID | L.MS_NOEXEC, options)
    os.mkdir(dev + "/shm", 0o1777)
    _mount_scratch("shm", dev + "/shm")  # relative: our working directory is the staging tmpfs
    for name, target in DEV_LINKS.items():
        os.symlink(target, f"{dev}/{name}")
