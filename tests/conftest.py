"""Shared fixtures. Every test runs real jails on the real kernel, as whoever runs pytest.

What a user's machine may lack (a tool, subordinate ids, /dev/net/tun, the reference data beside
the checkout) is declared with ``@pytest.mark.needs("slirp4netns", "tun")`` or checked with
``require(...)``: without it the test is skipped with a reason that names the fix, and under
``JAILBOX_TEST_STRICT=1`` (CI, which installs everything) it fails instead, so CI runs every test.
Strict mode fails every other skip too (``pytest.skip``, ``skipif``, ``importorskip``, at collection
or in a fixture), but one: a public registry on the Internet (``need("registry")``), which no
install step can give a machine whose network reaches only package mirrors (CI's); such a skip says
``BEYOND_CI`` in its reason. A test deselected by what the host allows (``root``/``rootless``,
``cgroup``/``nocgroup``) is listed in the file ``JAILBOX_TEST_DESELECTED`` names: ``.ci/run`` fails
when a test is in the lists of both its passes, i.e. ran in neither.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import psutil
import pytest

from jailbox.sandbox import ExecResult, Mount, Sandbox, SandboxConfig, hostids
from jailbox.sandbox.limits import cgroupfs, cgroups
from jailbox.sandbox.rootfs.store import Store

MINI_TOOLS = ("bash", "sh", "cat", "ls", "rm", "echo", "touch", "mkdir", "id", "ln", "readlink", "sleep", "env")
STRICT = os.environ.get("JAILBOX_TEST_STRICT") == "1"
REGISTRY = ("registry-1.docker.io", 443)  # what the README's registry blocks pull from
BEYOND_CI = "not something CI can install"  # in the reason of the one skip strict mode lets stand
DESELECTED_LIST = "JAILBOX_TEST_DESELECTED"  # a file this pass appends its deselected tests' ids to
SHARED_DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
TOOLS = {  # tool: the Debian package that has it
    "slirp4netns": "slirp4netns",
    "mmdebstrap": "mmdebstrap",
    "gcc": "gcc",
    "git": "git",
    "openssl": "openssl",
    "curl": "curl",
    "podman": "podman",
    "skopeo": "skopeo",
    "docker-registry": "docker-registry",
    "zstd": "zstd",
    "qemu-system-x86_64": "qemu-system-x86",
    "cpio": "cpio",
    "dpkg-deb": "dpkg",
    "apt-get": "apt",
    "unshare": "util-linux",
    "node": "nodejs",
    "npm": "npm",
}
KERNEL_PACKAGES = "python3-ipykernel python3-jupyter-client python3-numpy python3-pandas python3-matplotlib"
SUBIDS_FIX = "sudo apt-get install uidmap && sudo usermod --add-subuids 100000-165535 --add-subgids 100000-165535 " + (
    pwd.getpwuid(os.getuid()).pw_name
)


def require(present: bool, what: str, fix: str) -> None:
    """Skip the test where this machine lacks ``what`` (the reason names ``fix``); fail it under
    JAILBOX_TEST_STRICT=1, where a missing prerequisite is CI's bug, not the user's."""
    if present:
        return
    reason = f"needs {what}; fix: {fix}"
    if STRICT:
        pytest.fail(f"{reason} (JAILBOX_TEST_STRICT=1 runs every test)", pytrace=False)
    pytest.skip(reason)


def need(thing: str) -> None:
    """``require`` for one of the named prerequisites that ``@pytest.mark.needs`` takes."""
    if thing in TOOLS:
        require(shutil.which(thing) is not None, thing, f"sudo apt-get install {TOOLS[thing]}")
    elif thing == "shared-data":
        require(
            SHARED_DATA.is_dir(),
            f"the reference data at {SHARED_DATA}",
            "place the shared data directory (reference-trajectories/, reference-examples/) beside the checkout "
            "as ../shared/data",
        )
    elif thing == "subids":
        require(
            os.getuid() == 0 or hostids.full_range_available(),
            "a subordinate id range for this user (/etc/subuid, /etc/subgid) and newuidmap",
            SUBIDS_FIX,
        )
    elif thing == "ray":
        require(importlib.util.find_spec("ray") is not None, "the jailbox[ray] extra", "pip install 'jailbox[ray]'")
    elif thing == "registry":
        if not _reachable(REGISTRY):
            where = f"{REGISTRY[0]}:{REGISTRY[1]}"
            pytest.skip(f"needs a connection to {where} ({BEYOND_CI}); fix: connect this host to the Internet")
    elif thing == "lan":
        from support.standin import host_address  # it imports this module: not at the top

        require(host_address() is not None, "a non-loopback IPv4 address on this host", "connect a network interface")
    elif thing == "test-user":
        require(
            ci_user() is not None,
            "a user with a /etc/subuid range to run checks as (JAILBOX_TEST_USER picks one)",
            "sudo useradd -m jailbox-ci && sudo usermod --add-subuids 300000-365535 --add-subgids 300000-365535 "
            "jailbox-ci",
        )
    elif thing == "kernel":  # run_code on the host rootfs: the host's Debian Python with a Jupyter kernel
        probe = "import ipykernel, jupyter_client, matplotlib, pandas, numpy"
        found = subprocess.run(["/usr/bin/python3", "-c", probe], capture_output=True).returncode == 0
        require(
            found,
            "a Jupyter kernel and the data stack in the host's python3",
            f"sudo apt-get install {KERNEL_PACKAGES}",
        )
    elif thing == "tun":
        require(os.access("/dev/net/tun", os.R_OK | os.W_OK), "read-write /dev/net/tun", "sudo chmod 0666 /dev/net/tun")
    else:
        raise ValueError(f"unknown prerequisite {thing!r}")


def pytest_configure(config: pytest.Config) -> None:
    # Started as a background job (``cmd &`` in a script), the suite inherits SIGINT ignored, and an
    # ignored signal stays ignored across exec: the Ctrl-C tests' children would never see theirs.
    # A handler here is reset to the default in each child, which Python then turns into KeyboardInterrupt.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    config.addinivalue_line("markers", "paper_tree: uses the default recipe's tree (tests/support/paper_tree.py)")
    config.addinivalue_line("markers", "alone: runs while no other test runs (pytest-xdist; conftest._alone)")
    # A `jailbox exec -- CMD` the tests run would start the per-user service of the fast path, which then
    # holds two warm sandboxes (and their counter shares) in the session's state directory for minutes.
    # The tests of that path (test_cli_fast.py, test_cli_imports.py) turn it back on, each with a
    # state directory and a service of its own.
    os.environ["JAILBOX_NO_SERVICE"] = "1"
    config.addinivalue_line(
        "markers",
        "needs(*things): tools, 'shared-data', 'subids', 'tun', 'ray', 'lan', 'registry', 'test-user', 'kernel' "
        "(conftest.need)",
    )


def _reachable(address: tuple[str, int]) -> bool:
    try:
        socket.create_connection(address, timeout=5).close()
    except OSError:
        return False
    return True


def ci_user() -> pwd.struct_passwd | None:
    """An unprivileged user with a subordinate range (``JAILBOX_TEST_USER``, else the first in
    /etc/subuid), for root's checks that run as a user; None when there is none."""
    wanted = os.environ.get("JAILBOX_TEST_USER")
    subuid = Path("/etc/subuid")
    for line in subuid.read_text().splitlines() if subuid.exists() else []:
        name = line.split(":")[0]
        if wanted in (None, name):
            with contextlib.suppress(KeyError):
                user = pwd.getpwnam(name)
                if user.pw_uid != 0:
                    return user
    return None


def _strict_skip(report: pytest.TestReport | pytest.CollectReport) -> None:
    """Under strict mode a skip, however raised, fails: CI installs everything, so a test that did
    not run is CI's bug. An expected failure (xfail) stays what it is."""
    if STRICT and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if BEYOND_CI in reason:
            return
        report.outcome = "failed"
        report.longrepr = f"{reason} (skipped; JAILBOX_TEST_STRICT=1 runs every test)"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    _strict_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, Any, None]:
    outcome = yield
    _strict_skip(outcome.get_result())


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("needs"):
        for thing in mark.args:
            need(thing)


def _cgroup_usable() -> bool:
    if cgroupfs.v2_mounted():
        return cgroups.v2_parent()[0] is not None
    return cgroups.v1_usable()


def _uses_a_module_fixture(item: pytest.Item) -> bool:
    """Whether the test uses a fixture made once a module (a server, a browser, a built wheel): its
    module's tests that do are one group, so that the fixture is made on one worker, not on each."""
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else ()
    return any(d.scope in ("module", "class") for found in defs for d in found)


# first: pytest-xdist's own hook reads the groups added here (as a plain hook it ran before this one)
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``root`` run in the root pass, ``rootless`` in the unprivileged pass, ``cgroup``
    where this user gets per-sandbox cgroups and ``nocgroup`` where it does not (deselected, not
    skipped: CI runs the suite as root, as a user, and in a cgroup v2 guest, so each runs somewhere;
    the ids go to the ``JAILBOX_TEST_DESELECTED`` file, where ``.ci/run`` finds any that ran nowhere).
    Tests marked ``once`` (what they attack is the same whoever runs it) run in CI's root pass only;
    a user's own rootless run has them."""
    wrong = {"rootless" if os.getuid() == 0 else "root", "nocgroup" if _cgroup_usable() else "cgroup"}
    if os.getuid() != 0 and os.environ.get(DESELECTED_LIST):  # CI's rootless pass, after its root pass
        wrong.add("once")
    deselected = [item for item in items if wrong & set(item.keywords)]
    if os.environ.get(DESELECTED_LIST):
        with open(os.environ[DESELECTED_LIST], "a") as listed:
            listed.writelines(f"{item.nodeid}\n" for item in deselected)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if not wrong & set(item.keywords)]
    # pytest-xdist hands the tests out in this order (``--no-loadscope-reorder``), a group
    # (``xdist_group``) where its first test is, each group to one worker:
    # - the tests on the paper's tree first: on a fresh machine its build (about 17 minutes on two
    #   loaded cores) then runs beside the other workers' tests, in the first test's setup;
    # - then the other groups, then the ``slow`` tests, then the rest: the long ones do not end the
    #   phase with one worker busy and the others idle;
    # - the tests marked ``alone`` last: run one after another they wait once for the other workers
    #   to drain, not once each (about a hundred drains of a few seconds each, with workers idle,
    #   otherwise). A group with an ``alone`` test goes with them.
    # The emulated guest is handed out just before the ``alone`` tests and runs beside them
    # (``_alone``): they leave about half of the two cores idle, which the guest, at the lowest
    # priority, takes; beside the other tests its fork bomb outran the 60 s its command is given (a CI
    # run with the guest first).
    from support.paper_tree import BUILD_TIMEOUT  # it imports this module: not at the top

    def group(item: pytest.Item) -> str | None:
        mark = item.get_closest_marker("xdist_group")
        return None if mark is None else str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))

    for item in items:
        if item.get_closest_marker("paper_tree"):
            item.add_marker(pytest.mark.xdist_group("paper_tree"))
            item.add_marker(pytest.mark.timeout(BUILD_TIMEOUT))
        elif group(item) is None and _uses_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(Path(item.nodeid.split("::")[0]).stem))

    def order(item: pytest.Item) -> tuple[bool, bool, bool, bool, bool]:
        paper, guest, alone, slow = (
            item.get_closest_marker(name) is not None for name in ("paper_tree", "guest", "alone", "slow")
        )
        return not paper, guest or alone, alone, group(item) is None, not slow

    groups: dict[str, tuple[bool, bool, bool, bool, bool]] = {}
    for item in items:
        if (name := group(item)) is not None:
            key = order(item)
            first = groups.setdefault(name, key)
            groups[name] = (first[0] and key[0], first[1] or key[1], first[2] or key[2], False, first[4] and key[4])
    items.sort(key=lambda item: groups[name] if (name := group(item)) is not None else order(item))


@pytest.fixture(autouse=True)
def _alone(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Generator[Callable[[], None], None, None]:
    """Under pytest-xdist, a test marked ``alone`` runs while no other test of the session runs: it
    counts what jails share across a user or the host (a per-user budget, the host's mounts or open
    files), which other workers' jails would change. Readers-writer locks in the session's shared
    directory: each test holds ``running`` shared, an ``alone`` test exclusively; ``turnstile`` keeps
    new tests from starting ahead of an ``alone`` test that waits. A test on the paper's tree waits for
    its build before it counts as running.

    The emulated guest (``guest``) holds ``running`` exclusively until it calls what this fixture
    gives it, once booted, and nothing after: the ``alone`` tests then run beside it. It makes no jail
    and no network on the host, its QEMU is niced and takes its memory at boot (after it, only its code
    cache grows, capped at 256 MiB), so what they count moves little while they run. For other tests
    what it gives does nothing."""
    if request.node.get_closest_marker("paper_tree"):
        from support.paper_tree import paper_store  # it imports this module: not at the top

        paper_store()
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield lambda: None
        return
    shared = tmp_path_factory.getbasetemp().parent  # each worker's base is a directory of the session's
    guest = request.node.get_closest_marker("guest") is not None
    exclusive = guest or request.node.get_closest_marker("alone") is not None
    with open(shared / "turnstile", "a") as turnstile, open(shared / "running", "a") as running:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        fcntl.flock(running, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        fcntl.flock(turnstile, fcntl.LOCK_UN)
        yield (lambda: fcntl.flock(running, fcntl.LOCK_UN)) if guest else (lambda: None)


@pytest.fixture(autouse=True)
def _state_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test session gets its own state directory, so counts of leftovers are exact."""
    base = tmp_path_factory.getbasetemp() / "state"
    monkeypatch.setenv("JAILBOX_STATE_DIR", str(base))
    return base


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """An empty rootfs store of the test's own. Its trees may belong to subordinate ids, which
    pytest could not remove, so the store removes them."""
    monkeypatch.setenv("JAILBOX_CACHE_DIR", str(tmp_path / "cache"))
    store = Store()
    yield store
    for entry in store.list():
        store.remove(entry.name)


@pytest.fixture
def with_python(tmp_path: Path) -> SandboxConfig:
    """The host rootfs with the `python` command the paper's image has (its recorded runs call it)."""
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "python").symlink_to("/usr/bin/python3")
    return SandboxConfig(mounts=[Mount(shim, "/opt/shim")], env={"PATH": "/opt/shim:/usr/local/bin:/usr/bin:/bin"})


@pytest.fixture
def sb():
    with Sandbox() as box:
        yield box


def _libs(binary: str) -> set[str]:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=False).stdout
    libs = set()
    for line in out.splitlines():
        parts = line.split()
        for part in parts:
            if part.startswith("/"):
                libs.add(part)
    return libs


@pytest.fixture(scope="session")
def mini_rootfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small directory root filesystem: bash, a few coreutils and their libraries."""
    root = tmp_path_factory.mktemp("minirootfs")
    (root / "bin").mkdir()
    (root / "etc").mkdir()
    needed: set[str] = set()
    for tool in MINI_TOOLS:
        path = shutil.which(tool, path="/usr/bin:/bin")
        assert path, f"{tool} missing on the host"
        real = os.path.realpath(path)
        shutil.copy2(real, root / "bin" / tool)
        needed |= _libs(real)
    for lib in needed:
        target = root / lib.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.realpath(lib), target)
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (root / "etc" / "shadow").write_text("jail-shadow-content\n")
    (root / "etc" / "motd").write_text("original motd\n")
    (root / "usr").mkdir(exist_ok=True)
    os.symlink("../bin", root / "usr" / "bin")
    if os.getuid() == 0:  # root's jails are a subordinate range: a tree they use is owned in it
        own_for_jails(root)
    return root


def own_for_jails(tree: Path) -> None:
    """Give a directory tree to the jails' root (host root's jails map a subordinate range)."""
    uid, gid = hostids.plan("auto").host_root()
    for top, dirs, files, fd in os.fwalk(tree):
        os.chown(top, uid, gid, follow_symlinks=False)
        for name in dirs + files:
            os.chown(name, uid, gid, dir_fd=fd, follow_symlinks=False)


class LoopbackServer:
    """A TCP server on the host's 127.0.0.1 that answers every connection with a fixed line."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            with conn:
                conn.sendall(b"host-secret-service\n")

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def loopback_server():
    server = LoopbackServer()
    yield server
    server.close()


def run_threads(target: Callable[[int], None], count: int) -> list[BaseException]:
    """Run ``target(n)`` in ``count`` threads at once; return what they raised."""
    errors: list[BaseException] = []

    def guarded(n: int) -> None:
        try:
            target(n)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(n,)) for n in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def eventually_usable(sb: Sandbox, attempts: int = 100) -> ExecResult:
    """After a fork bomb the pids cap stays full until the init has reaped the killed processes:
    retry a trivial command until it runs (bounded), and return its result."""
    for _ in range(attempts):
        r = sb.exec("echo usable")
        if r.stdout == "usable\n":
            return r
        time.sleep(0.05)
    return r


def host_tree(host: int | None = None) -> list[psutil.Process]:
    """The processes host process ``host`` (default: this one) runs, its own and jailbox's: its
    descendants, and its launchers with the jails below them. A launcher is not its host's child
    (``sandbox/launcher.py``); its command line ends in the host's pid."""
    host = os.getpid() if host is None else host
    found: list[psutil.Process] = []
    with contextlib.suppress(psutil.NoSuchProcess):
        found += psutil.Process(host).children(recursive=True)
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if cmd[-2:-1] and cmd[-1] == str(host) and any(arg.endswith(".sandbox.child.zygote") for arg in cmd):
            with contextlib.suppress(psutil.NoSuchProcess):
                found += [proc, *proc.children(recursive=True)]
    return found


def jail_processes(ns: str) -> list[psutil.Process]:
    """Host-side view of every process in a pid namespace (``readlink /proc/PID/ns/pid``)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if os.readlink(f"/proc/{proc.pid}/ns/pid") == ns:
                found.append(proc)
        except OSError:
            continue
    return found


def _ns_of(pid: int, ns: str) -> int | None:
    """A descriptor of process ``pid``'s pid namespace if that is still ``ns``."""
    try:
        fd = os.open(f"/proc/{pid}/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    if os.readlink(f"/proc/self/fd/{fd}") == ns:
        return fd
    os.close(fd)
    return None


@contextlib.contextmanager
def pid_namespace_held(*namespaces: str) -> Generator[None, None, None]:
    """Keep live pid namespaces from being freed while the block runs, by a descriptor of each (taken
    through one of its visible processes). The kernel gives a freed namespace's number to the next
    namespace made, another worker's jail's, in which ``jail_processes`` would then find processes."""
    with contextlib.ExitStack() as held:
        for ns in namespaces:
            fd = next(filter(None, (_ns_of(proc.pid, ns) for proc in jail_processes(ns))), None)
            assert fd is not None, f"no process of {ns} to hold it by"
            held.callback(os.close, fd)
        yield


HOST_SECRET = "host secret\n"


def snapshot(top: Path) -> dict[str, tuple[int, bytes | str | None]]:
    """Every entry below ``top`` (and ``top`` itself): its mode and content or link target, to show
    that a host directory came out of an attack untouched."""
    out: dict[str, tuple[int, bytes | str | None]] = {}
    for here, dirs, files in os.walk(top):
        for name in [".", *dirs, *files]:
            path = Path(here, name)
            st = path.lstat()
            data: bytes | str | None = None
            if stat.S_ISLNK(st.st_mode):
                data = os.readlink(path)
            elif stat.S_ISREG(st.st_mode):
                data = path.read_bytes()
            out[str(path.relative_to(top))] = (st.st_mode, data)
    return out


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A host directory the jail must never reach: a secret file, a subdirectory, modes that show any chmod."""
    top = tmp_path / "outside"
    (top / "sub").mkdir(parents=True)
    (top / "secret").write_text(HOST_SECRET)
    os.chmod(top / "secret", 0o600)
    os.chmod(top, 0o750)
    return top
