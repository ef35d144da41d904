"""The launcher: a small single-threaded process that forks jails on request.

Why a separate process: forking the caller (often multi-threaded, often big) is unsafe and slow,
and a fresh interpreter per jail costs milliseconds. The launcher is started once per host
process with ``python -I -S`` in a session of its own, forks once more so that it is not the host's
child (``LauncherUp`` tells the host its pid, with a pidfd), imports the child-side modules, freezes
its heap, and then each jail costs three forks:

    launcher --fork--> A: unshare(user); launcher writes A's id maps (host ids onto themselves);
                          A caps the per-user counters (sysctls, and soft rlimits for A2's)
                       A --fork--> A2: unshare(user); A writes A2's id maps (the planned ones);
                                   unshare(mnt pid ipc uts cgroup [net])
                       A2 --fork--> B: pid 1 of the new pid namespace, becomes the init
                       A2 and A exit; B is re-parented to the launcher (a child subreaper)

A's namespace is one nothing in the jail enters; its limits bound the jail (``_in_bounded_userns``).

B then arms PR_SET_PDEATHSIG against the launcher, and the launcher exits as soon as the host
process dies (a pidfd of it) or closes the control socket. The host talks to each init directly
over a socketpair handed back here with SCM_RIGHTS, together with a pidfd of the init.
Every message here is a typed one of ``child/protocol.py``; a failure names its setup step. The
removal of a tree owned by subordinate ids runs in a child of its own that answers the host itself,
so however big the tree, the launcher goes on making jails meanwhile. Stdlib only.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import resource
import select
import signal
import socket
from collections.abc import Callable
from typing import NoReturn, TypeVar

from ..floor import linux as L
from ..floor import wire
from ..floor.idmap import IdMap, write_maps
from ..floor.tree import remove_tree
from . import init, layers
from .protocol import (
    TRASH,
    Created,
    CreateRequest,
    Failed,
    Go,
    InitPid,
    Laid,
    LauncherUp,
    LayerRequest,
    Removed,
    RmtreeRequest,
    SetupFailed,
    Step,
    UsernsReady,
    decode,
    failure,
    fresh_name,
    step,
)
from .spec import JailSpec

STEP_TIMEOUT = 10.0
VIEWS = 64  # user namespaces kept for idmapped mounts: one per jail id range in recent use
Body = Callable[[socket.socket], None]
Expected = TypeVar("Expected", UsernsReady, Go, InitPid)
NS_FLAGS = L.CLONE_NEWNS | L.CLONE_NEWPID | L.CLONE_NEWIPC | L.CLONE_NEWUTS | L.CLONE_NEWCGROUP


def main(argv: list[str]) -> None:
    """argv: the control socket's descriptor and the host process's pid."""
    ctl_fd, host_pid = int(argv[0]), int(argv[1])
    ctl = socket.socket(fileno=ctl_fd)
    host = os.pidfd_open(host_pid)
    if os.getppid() != host_pid:  # the host is gone already: the pidfd may be of another process
        os._exit(0)
    # Leave the host's children (its first child, this process, ends here): what kills a process's
    # children, or its process group, when it ends (Ray's workers do both) must leave alive the one
    # that kills the jails and removes their files after it. The host's pidfd says when that is.
    if os.fork() != 0:
        os._exit(0)
    me = os.pidfd_open(os.getpid())
    wire.send(ctl, LauncherUp(os.getpid()).to_wire(), [me])
    os.close(me)
    L.prctl(L.PR_SET_CHILD_SUBREAPER, 1)
    init.set_name("jailbox-launch")
    lifeline_r, _lifeline_w = os.pipe()
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    zygote = Zygote(lifeline_r, host_pid)
    gc.collect()
    gc.freeze()
    poller = select.poll()
    for fd in (ctl.fileno(), host, wake_r):
        poller.register(fd, select.POLLIN)
    while True:
        try:
            events = poller.poll()
        except InterruptedError:
            continue
        for fd, _ in events:
            if fd == host:
                zygote.shutdown()
            if fd == wake_r:
                zygote.reap(wake_r)
                continue
            # the reply socket; a layer request's sources (its layers, the upper) and the lower beneath
            msg = wire.recv(ctl, max_fds=3 + layers.MAX_LAYERS)
            if msg is None:
                zygote.shutdown()
            req, fds = msg
            zygote.handle(req, fds)


class Zygote:
    def __init__(self, lifeline: int, host: int) -> None:
        self.lifeline = lifeline
        self.jails: dict[str, JailSpec] = {}  # sandbox dir -> spec, for cleanup after the host dies
        self.pending: dict[int, int] = {}  # pid of an A -> "go" pipe of its init
        self.live: dict[int, str | None] = {}  # unreaped init pid -> sandbox dir (reaped pids get reused)
        self.host = host  # the host process that started us, named in the directories it makes
        self.bases: set[str] = set()  # state directories' "sandboxes" folders seen in requests
        self.views: dict[str, int] = {}  # id map -> a user namespace with it, for idmapped mounts (_view)
        self.copying: set[int] = set()  # processes copying layers (_layer), ended before their trees are removed

    def reap(self, wake_r: int) -> None:
        for pid, _, _ in L.reaped(wake_r):
            self.live.pop(pid, None)
            self.copying.discard(pid)
            go = self.pending.pop(pid, None)
            if go is not None:  # that was an A: its init is now re-parented to us
                with contextlib.suppress(BrokenPipeError):  # the init already failed and exited
                    os.write(go, b"1")
                os.close(go)

    def shutdown(self) -> NoReturn:
        """The host process is gone: kill every jail it left and remove their state, then exit."""
        for pid in [*self.live, *self.copying]:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for pid in self.live:
            _thaw(pid)  # a paused jail: its init would not die, and waiting for it would hang us
        for pid in [*self.live, *self.copying]:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        # made by the host for a jail it had not asked us for yet, and the layers of its checkpoints
        left = [*self._half_made(), *((path, spec.idmap if spec.userns else None) for path, spec in self.jails.items())]
        for path, idmap in left:
            with contextlib.suppress(OSError):
                remove_tree(path)
            if os.path.lexists(path) and idmap is not None:
                try:
                    mine, theirs = wire.seqpacket_pair()
                    with mine, theirs:
                        os.waitpid(self._rmtree_in_userns(RmtreeRequest(path, idmap), theirs), 0)
                except Exception:
                    pass
        os._exit(0)

    def _half_made(self) -> list[tuple[str, IdMap | None]]:
        """Sandbox directories beside ours that our host made (its meta names it) but no jail of ours
        uses: the host died between making one and asking for its jail, or it held a layer (a
        checkpoint's), or closed one and had not removed it yet (``removal.py``), or was making one
        (in the trash under ``fresh_name``, with or without its meta yet). Only the host writes
        a meta (the jail never sees its sandbox directory); read bounded all the same. Each with the
        id map its files may belong to."""
        found: list[tuple[str, IdMap | None]] = []
        for base in self.bases:
            trash = os.path.join(os.path.dirname(base), TRASH)
            for folder, closed in ((base, False), (trash, True)):
                try:
                    names = os.listdir(folder)
                except OSError:
                    continue
                for name in names[:4096]:
                    path = os.path.join(folder, name)
                    if path in self.jails:
                        continue
                    if closed and name.startswith(fresh_name(self.host, "")):  # being made when the host died
                        found.append((path, None))
                        continue
                    try:
                        fd = os.open(os.path.join(path, "meta.json"), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                        with os.fdopen(fd, "rb") as f:
                            meta = json.loads(f.read(1 << 16))
                    except (OSError, ValueError):
                        continue
                    ours = isinstance(meta, dict) and meta.get("host_pid") == self.host
                    if ours and (closed or "init_pid" not in meta):
                        found.append((path, _meta_idmap(meta)))
        return found

    def _forget_removed(self) -> None:
        for path in [p for p in self.jails if not os.path.lexists(p)]:
            del self.jails[path]

    def handle(self, obj: dict, fds: list[int]) -> None:
        if not fds:  # every request carries its reply socket first
            return
        reply = socket.socket(fileno=fds[0])
        sources = fds[1:]  # a layer request's source directories
        try:
            req = decode(obj, CreateRequest, RmtreeRequest, LayerRequest)
            if isinstance(req, LayerRequest) and len(sources) == len(req.shifts) + req.beneath:
                self._layer(req, sources, reply)
            elif isinstance(req, CreateRequest) and not sources:
                self.create(req.spec, reply)
            elif isinstance(req, RmtreeRequest) and not sources:
                self._rmtree_in_userns(req, reply)
            else:
                _send(reply, Failed(Step.PROTOCOL, 0, "a request with the wrong number of descriptors"))
        except Exception as exc:
            _send(reply, failure(exc, Step.PROTOCOL))
        finally:
            reply.close()
            for fd in sources:  # the copying process holds its own
                os.close(fd)

    def _layer(self, req: LayerRequest, sources: list[int], reply: socket.socket) -> None:
        """Copy a writable layer, or squash layers, into ``req.dir``'s new ``tree`` (``child/layers.py``),
        in a process that answers the host itself (the launcher goes on making jails meanwhile)."""
        self.bases.add(os.path.dirname(req.dir))  # if the host dies, its half-made layers go too

        def body(chan: socket.socket) -> None:
            try:
                with step(Step.LAYER):
                    parent = os.open(req.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
                    os.mkdir("tree", 0o700, dir_fd=parent)
                    tree = os.open("tree", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
                    budget = layers.Budget()
                    beneath = sources[-1] if req.beneath else None
                    for src, (uids, gids) in zip(sources, req.shifts, strict=False):
                        layers.apply(src, tree, layers.Shift(uids), layers.Shift(gids), budget, beneath)
                    os.fsync(tree)
                _send(reply, Laid(budget.entries))
            except Exception as exc:
                _send(reply, failure(exc, Step.LAYER))

        chan, pid = self._spawn_in_userns(req.idmap, body)
        chan.close()
        self.copying.add(pid)

    def _spawn_in_userns(
        self, idmap: IdMap | None, body: Body, soft: dict[str, int] | None = None, creator: int | None = None
    ) -> tuple[socket.socket, int]:
        """Fork A, let it unshare its user namespace (unless ``idmap`` is None), write its id maps.
        ``soft``: RLIMIT_* name -> A's soft limit as it creates the namespace, which the kernel keeps
        as the namespace's cap on the calling user's counts (processes: the pids budget; pending
        signals, message-queue bytes, locked shm: ``budget.rlimit_budget``). ``creator``: the host
        uid A creates it as (``JailSpec.creator``), root again inside. Returns (channel, pid)."""
        mine, theirs = wire.seqpacket_pair()
        with step(Step.FORK):
            pid = os.fork()
        if pid == 0:
            mine.close()
            _child_a(theirs, body, idmap is not None, soft or {}, creator)
        theirs.close()
        try:
            _expect(mine, UsernsReady)
            if idmap is not None:
                with step(Step.ID_MAP):
                    write_maps(pid, idmap)
            wire.send(mine, Go().to_wire())
        except BaseException:
            os.kill(pid, signal.SIGKILL)
            mine.close()
            raise
        return mine, pid

    def create(self, spec: JailSpec, reply: socket.socket) -> None:
        trees = self._idmapped_trees(spec)
        try:
            self._create(spec, reply, trees)
        finally:
            for fd in trees.values():  # the jail's setup process holds its own copies
                os.close(fd)

    def _idmapped_trees(self, spec: JailSpec) -> dict[str, int]:
        """For a jail with ids of its own: host path -> a detached mount of it that shows the ids
        on disk as the jail's, for the lower and each user bind. Made here, as host root: the
        kernel lets only who holds CAP_SYS_ADMIN over the filesystem make one."""
        if spec.shown_as is None:
            return {}
        with step(Step.ID_MAP):
            userns = self._view(spec.shown_as)
        trees: dict[str, int] = {}
        try:
            for path in (spec.lower, *spec.layers, *(b.src for b in spec.user_binds)):
                if path not in trees:
                    with step(Step.LOWER if path == spec.lower else Step.BIND):
                        trees[path] = L.idmapped_clone(path, userns)
        except BaseException:
            for fd in trees.values():
                os.close(fd)
            raise
        return trees

    def _view(self, shown_as: IdMap) -> int:
        """A user namespace whose map is ``shown_as`` (nothing runs in it): what an idmapped mount
        shows ids through. Kept for the next jail given the same ids (``VIEWS`` at most)."""
        key = shown_as.uid_map + "|" + shown_as.gid_map
        fd = self.views.pop(key, None)
        if fd is None:
            chan, pid = self._spawn_in_userns(shown_as, _until_closed)
            try:
                fd = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
            finally:
                chan.close()  # its process exits, and is reaped as any child
            while len(self.views) >= VIEWS:
                os.close(self.views.pop(next(iter(self.views))))
        self.views[key] = fd  # most recently used last
        return fd

    def _create(self, spec: JailSpec, reply: socket.socket, trees: dict[str, int]) -> None:
        host_end, jail_end = wire.seqpacket_pair()
        lifeline = self.lifeline
        go_r, go_w = os.pipe()  # "your parent is now the launcher": arm PDEATHSIG only after that

        def jail(chan: socket.socket) -> None:
            with step(Step.UNSHARE):
                L.unshare(NS_FLAGS | (L.CLONE_NEWNET if spec.net.new_netns else 0))
                pid = os.fork()
            if pid == 0:
                chan.close()
                _keep_only([jail_end.fileno(), lifeline, go_r, *trees.values()])
                init.boot(spec, jail_end, lifeline, go_r, trees)
                os._exit(0)
            wire.send(chan, InitPid(pid).to_wire())

        def body(chan: socket.socket) -> None:
            os.close(go_w)
            if spec.userns:
                _in_bounded_userns(chan, spec, jail)
            else:
                jail(chan)

        try:
            outer = _host_ids(spec.idmap) if spec.userns else None
            soft = dict(spec.counter_budget)
            if spec.pids_budget is not None:
                soft["RLIMIT_NPROC"] = spec.pids_budget
            chan, a_pid = self._spawn_in_userns(outer, body, soft, spec.creator)
            os.close(go_r)
            go_r = -1
            with chan:
                started = _expect(chan, InitPid)
            self.pending[a_pid] = go_w  # reap() says "go" once A has fully exited
            go_w = -1
            if len(self.jails) > 64:
                self._forget_removed()
            if spec.dir:
                self.jails[spec.dir] = spec
                self.bases.add(os.path.dirname(spec.dir))
            self.live[started.pid] = spec.dir
            pidfd = os.pidfd_open(started.pid)
            try:
                wire.send(reply, Created(started.pid).to_wire(), [host_end.fileno(), pidfd])
            finally:
                os.close(pidfd)
        finally:
            for fd in (go_r, go_w):
                if fd >= 0:
                    os.close(fd)
            host_end.close()
            jail_end.close()

    def _rmtree_in_userns(self, req: RmtreeRequest, reply: socket.socket) -> int:
        """Remove a tree whose files belong to subordinate ids, as root of a matching namespace. The
        removing process answers on ``reply`` itself, so a huge tree never holds up the launcher (new
        jails start while it is removed). Returns that process's pid."""

        def body(chan: socket.socket) -> None:
            try:
                with step(Step.RMTREE), contextlib.suppress(OSError):
                    remove_tree(req.path)
                _send(reply, Removed(not os.path.lexists(req.path)))
            except Exception as exc:
                _send(reply, failure(exc, Step.RMTREE))

        chan, pid = self._spawn_in_userns(req.idmap, body)
        chan.close()
        return pid


def _child_a(chan: socket.socket, body: Body, userns: bool, soft: dict[str, int], creator: int | None) -> NoReturn:
    try:
        with step(Step.RLIMITS):
            for name, limit in soft.items():
                _soft_limit(name, limit)
        if userns:
            try:
                if creator is not None:
                    # The kernel gives a user namespace that host root (uid 0 of the first namespace)
                    # creates no cap on processes (RLIMIT_NPROC), whatever its limit: created as
                    # ``creator``, with root's capabilities kept, it has the budget as its cap, and
                    # every root jail's processes are counted together, against that one uid.
                    L.setuid_keeping_capabilities(creator)
                L.unshare(L.CLONE_NEWUSER)
            except OSError as exc:
                raise SetupFailed(
                    Failed(Step.USERNS, exc.errno or 0, f"creating a user namespace: {exc.strerror}")
                ) from exc
        wire.send(chan, UsernsReady().to_wire())
        _expect(chan, Go)
        if creator is not None:
            os.setresuid(0, 0, 0)  # mapped onto the launcher's own uid (``_host_ids``): as before, in A
        body(chan)
    except BaseException as exc:
        _report(chan, exc)
    finally:
        os._exit(0)


def _thaw(pid: int) -> None:
    """Thaw the freezer group of ``pid`` (a jail's init) if ``pause()`` froze it: a frozen process does
    not die of SIGKILL until thawed. The group is the kernel's name for it (``/proc/PID/cgroup``, read
    bounded); what is written there only ever continues processes."""
    try:
        with open(f"/proc/{pid}/cgroup", "rb") as f:
            lines = f.read(1 << 16).decode(errors="replace").splitlines()
    except OSError:
        return
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[2].startswith("/"):
            continue
        if "freezer" in parts[1].split(","):
            target, value = f"/sys/fs/cgroup/freezer{parts[2]}/freezer.state", b"THAWED"
        elif parts[0] == "0" and parts[1] == "":
            target, value = f"/sys/fs/cgroup{parts[2]}/cgroup.freeze", b"0"
        else:
            continue
        with contextlib.suppress(OSError):
            fd = os.open(target, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.write(fd, value)
            finally:
                os.close(fd)


def _meta_idmap(meta: dict) -> IdMap | None:
    try:
        return IdMap.from_wire(meta["idmap"]) if isinstance(meta.get("idmap"), dict) else None
    except wire.WireError:
        return None


def _until_closed(chan: socket.socket) -> None:
    """A process whose user namespace is all that is wanted of it: it lives until the launcher has opened that."""
    chan.recv(1)


def _report(chan: socket.socket, exc: BaseException) -> None:
    """Tell the host why a forked setup process failed; it exits next, whether or not the host hears."""
    try:
        wire.send(chan, failure(exc, Step.PROTOCOL).to_wire())
    except BaseException:
        pass


def _in_bounded_userns(chan: socket.socket, spec: JailSpec, then: Body) -> None:
    """Run ``then`` (the jail) in a user namespace nested in A's, whose counters bound it as a whole.

    The kernel counts inotify instances, namespaces and the like per (user namespace, uid), and
    charges each count up the chain to the namespace's creator, checking each level against that
    level's ``/proc/sys/user`` limits. A limit in the jail's own namespace would bind each of its
    uids apart (a root jail could setuid through 65536 of them), and its root could raise it. So
    the limits go in A's namespace, which nothing in the jail ever enters: every process of the
    jail, whatever its uid, is charged to the one uid that created the nested namespace there.
    A's namespace maps the host ids one to one and the jail's gets the planned map, so the jail
    has the ids it was planned with; its own limits are set to the same values, for programs inside
    that read them.

    The nested namespace also keeps A2's soft rlimits as its caps on the counts of all the jail's
    uids together: RLIMIT_NPROC, when the plan has one (``limits/plan.py``), and the jail's share of
    pending signals, message-queue bytes and locked shm, which ``_write_counters`` set in A."""
    with step(Step.RLIMITS):
        _write_counters(spec.counters)
    unshared_r, unshared_w = os.pipe()
    mapped_r, mapped_w = os.pipe()
    with step(Step.FORK):
        pid = os.fork()
    if pid == 0:  # A2: creates the jail's user namespace, then its other namespaces and the init
        os.close(unshared_r)
        os.close(mapped_w)
        try:
            nproc = spec.rlimits.get("RLIMIT_NPROC")
            if nproc is not None:
                with step(Step.RLIMITS):
                    _soft_limit("RLIMIT_NPROC", nproc)
            with step(Step.USERNS):
                L.unshare(L.CLONE_NEWUSER)
            os.write(unshared_w, b"1")
            if os.read(mapped_r, 1) != b"1":
                os._exit(0)  # A failed and reported it
            with step(Step.RLIMITS):
                _write_counters(spec.counters, own=True)
            then(chan)
        except BaseException as exc:
            _report(chan, exc)
        finally:
            os._exit(0)
    os.close(unshared_w)
    os.close(mapped_r)
    try:
        if os.read(unshared_r, 1) != b"1":
            return  # A2 failed and reported it
        with step(Step.ID_MAP):  # A holds CAP_SETUID in its namespace: no helper, no setgroups rule
            inner = _lines(spec.idmap.uid_map, False), _lines(spec.idmap.gid_map, False)
            write_maps(pid, IdMap(*inner, helper=False, deny_setgroups=False))
        os.write(mapped_w, b"1")
    except BaseException:
        os.kill(pid, signal.SIGKILL)
        raise
    finally:
        os.close(unshared_r)
        os.close(mapped_w)
        os.waitpid(pid, 0)  # A exits after A2, so the init is re-parented to the launcher when A is reaped


SOFT_LIMITS = ("RLIMIT_NPROC", "RLIMIT_SIGPENDING", "RLIMIT_MSGQUEUE", "RLIMIT_MEMLOCK")  # user-namespace caps
PAGE = os.sysconf("SC_PAGE_SIZE")


def _soft_limit(name: str, limit: int) -> None:
    """Set a soft rlimit, which a user namespace created next keeps as its cap on the counts of all
    processes under it (the hard one stays, so the init can still set the sandbox's own limit above
    it). The kernel keeps RLIMIT_MEMLOCK's cap as given, in bytes, but charges locked shm against it
    in pages (``create_user_ns`` and ``user_shm_lock``), so that one is given in pages."""
    if name not in SOFT_LIMITS:
        raise ValueError(f"not a user-namespace rlimit: {name!r}")
    which = getattr(resource, name)
    hard = resource.getrlimit(which)[1]
    cap = limit // PAGE if name == "RLIMIT_MEMLOCK" else limit
    resource.setrlimit(which, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))


def _write_counters(counters: dict[str, int], own: bool = False) -> None:
    """Set the per-user counter limits of the calling process's user namespace (``/proc/sys/user``),
    and of its rlimits: as the caps of a user namespace created next, or (``own``, in the jail's
    namespace) as the jail's soft and hard limits, which nothing in it can raise."""
    for name, value in counters.items():
        if name in SOFT_LIMITS and not own:
            _soft_limit(name, value)
        elif name in SOFT_LIMITS:
            which = getattr(resource, name)
            hard = resource.getrlimit(which)[1]
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(which, (value, value))
        elif name.startswith("max_") and name[4:].replace("_", "").isalpha():
            with open(f"/proc/sys/user/{name}", "w") as f:
                f.write(str(value))
        else:
            raise ValueError(f"not a per-user counter: {name!r}")


def _host_ids(idmap: IdMap) -> IdMap:
    """A's map: the host ids ``idmap`` uses, each onto itself. The jail's namespace, nested in A's,
    then gets ``idmap`` itself, and reads the same ``/proc/self/uid_map`` as without A's.

    The kernel lets A2 create the nested namespace only if its own ids are mapped in A's. Rootless
    they are among ``idmap``'s; host root's jails map a subordinate range and never uid 0, so A's
    map names the launcher's own ids too (A's namespace is never entered by anything in the jail)."""
    uid_map, gid_map = _lines(idmap.uid_map, True), _lines(idmap.gid_map, True)
    uid_map = _with_own(uid_map, os.getuid())
    gid_map = _with_own(gid_map, os.getgid())
    return IdMap(uid_map, gid_map, idmap.helper, idmap.deny_setgroups)


def _with_own(lines: str, own: int) -> str:
    """``lines`` (one "inside outside count" triple each) plus ``own`` onto itself, unless it is mapped."""
    for line in lines.splitlines():
        _, outside, count = (int(n) for n in line.split())
        if outside <= own < outside + count:
            return lines
    return f"{own} {own} 1\n" + lines


def _lines(text: str, host_ids: bool) -> str:
    """A map's "inside outside count" triples one to a line (what /proc/PID/uid_map takes; newuidmap
    takes them split either way); with ``host_ids``, each outside range onto itself."""
    numbers = text.split()
    rows = [numbers[i : i + 3] for i in range(0, len(numbers), 3)]
    return "".join(f"{outside if host_ids else inside} {outside} {count}\n" for inside, outside, count in rows)


def _keep_only(fds: list[int]) -> None:
    """Close every descriptor but ``fds``; stdio becomes /dev/null so nothing reaches the host's."""
    null = os.open("/dev/null", os.O_RDWR)
    for target in (0, 1, 2):
        os.dup2(null, target, inheritable=False)
    os.close(null)
    keep = sorted(set(fds))
    low = 3
    for fd in keep:
        if fd > low:
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 20)


def _expect(chan: socket.socket, kind: type[Expected]) -> Expected:
    """The peer's next message, which must be ``kind``; its own failure is raised as it reported it.
    Silence, EOF or a wrong message are the protocol's failure, not that of the step awaited."""
    with step(Step.PROTOCOL):
        if not wire.wait_readable(chan, STEP_TIMEOUT):
            raise TimeoutError("jail setup step timed out")
        msg = wire.recv(chan, max_fds=0)
        if msg is None:
            raise OSError(0, "jail setup process exited early")
        got = decode(msg[0], kind)
    if isinstance(got, Failed):
        raise SetupFailed(got)
    if not isinstance(got, kind):  # decode admits only ``kind`` and Failed
        raise SetupFailed(Failed(Step.PROTOCOL, 0, f"unexpected {type(got).__name__} message"))
    return got


def _send(sock: socket.socket, msg: Created | Removed | Laid | Failed) -> None:
    try:
        wire.send(sock, msg.to_wire())
    except OSError:
        pass
