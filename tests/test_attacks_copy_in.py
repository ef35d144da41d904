"""The attack battery, copies into a jail: a source tree the jail can rewrite never hands it a host file.

``Sandbox.put``, ``jailbox cp HOST ID:PATH`` and ``--input_dir`` read a host tree that may be a read-write
bind of a jail (or of another jail). A racer in that jail swaps components of the tree for symlinks to a host
directory holding a secret, at every depth: the directory the copy is walking, a parent of it, the last
component. The host copies many times meanwhile. Not one byte of the secret may reach the jail: each copy
either lands, the jail's links copied as links (never followed), or stops with a one-line error. As root the
secret is a root-only file; rootless it is a file of the user's outside the source.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.cli import JAILBOX
from support.service_probe import ended, listener_pid

from jailbox.agent import inputs
from jailbox.sandbox import Mount, Sandbox, SandboxConfig, hostfs
from jailbox.sandbox.errors import SandboxFileError

HANG = 120  # seconds: a hang guard only, never a measure
COPIES = 100  # copies the host makes while the racer swaps (the unfixed walk leaked within a few dozen)
LEVELS = ("a", "a/b", "a/b/c")  # directories of the source, each swapped, its files too
FILES = ("f0", "f1", "f2")


class Source:
    """A source tree beside a vault of the same shape whose files hold the secret, and the racer's script."""

    def __init__(self, base: Path) -> None:
        self.mark = f"SECRET-{secrets.token_hex(8)}"
        self.src, self.vault = base / "src", base / "vault"
        for top, text in ((self.src, "benign\n"), (self.vault, f"{self.mark}\n")):
            for level in LEVELS:
                (top / level).mkdir(parents=True, exist_ok=True)
                for name in FILES:
                    (top / level / name).write_text(text)
        (self.vault / "secret").write_text(f"{self.mark}\n")
        for here, _dirs, files in os.walk(self.vault):  # root's private files as root; the user's rootless
            os.chmod(here, 0o700)
            for name in files:
                os.chmod(Path(here, name), 0o600)

    def racer(self, jail_src: str) -> str:
        """A shell loop swapping each directory and a file at each depth for a link into the vault, and
        back, until the host makes ``.stop``."""
        swaps = [*LEVELS, *(f"{level}/{FILES[0]}" for level in LEVELS)]
        hold = "sleep 0.005"  # the link stays a moment: long enough for a walk by path to read through it
        steps = "; ".join(f"mv {p} {p}.x && ln -s {self.vault}/{p} {p}; {hold}; rm -f {p}; mv {p}.x {p}" for p in swaps)
        return f"cd {jail_src} || exit 1; while [ ! -e .stop ]; do {steps}; done"

    def stop(self) -> None:
        (self.src / ".stop").touch()


def mount(src: Path) -> Mount:
    return Mount(src, "/src", readonly=False, give=os.getuid() == 0)


def check_jail(run: Callable[[str], str], mark: str, vault: Path) -> int:
    """No byte of the secret anywhere in the jail's copies; the links it holds are the racer's, kept as
    links. Returns how many links the copies hold (the race was met)."""
    assert run(f"grep -rlF {mark} /dst; true") == ""  # grep -r follows no link
    links = run("find /dst -type l -exec readlink {} +; true").split()
    assert all(t.startswith(f"{vault}/") for t in links), links
    return len(links)


def copy_many(copy: Callable[[int], None]) -> tuple[int, list[str]]:
    """``COPIES`` copies; how many landed and the errors of those that did not (each one line)."""
    landed, errors = 0, []
    for n in range(COPIES):
        try:
            copy(n)
        except (OSError, inputs.InputDirError) as exc:  # OSError: a SandboxFileError is one, but not every
            errors.append(f"{type(exc).__name__}: {exc}")
        else:
            landed += 1
    return landed, errors


def assert_outcome(landed: int, errors: list[str], links: int) -> None:
    assert all(e.startswith(("SandboxFileError: ", "InputDirError: ")) and "\n" not in e for e in errors), errors
    assert landed > 0, errors[:5]
    assert links > 0  # the racer was met: its links arrived, as links


def race(racer_box: Sandbox, source: Source, body: Callable[[], None]) -> None:
    racing = threading.Thread(target=racer_box.exec, args=(source.racer("/src"),), kwargs={"timeout": HANG})
    racing.start()
    try:
        body()
    finally:
        source.stop()
        racing.join(HANG)
    assert not racing.is_alive()


@pytest.mark.slow
def test_put_of_a_tree_the_jail_rewrites_never_reads_through_its_links(tmp_path):
    source = Source(tmp_path)
    with Sandbox(SandboxConfig(mounts=[mount(source.src)])) as sb:
        outcome: list[tuple[int, list[str]]] = []
        race(sb, source, lambda: outcome.append(copy_many(lambda n: sb.put(source.src, f"/dst/{n}"))))
        links = check_jail(lambda cmd: sb.exec(cmd).stdout, source.mark, source.vault)
    assert_outcome(*outcome[0], links)


@pytest.mark.slow
def test_put_follows_the_callers_own_link_and_nothing_beneath_it(tmp_path):
    """The path the caller names is theirs and is followed as given (here a link of the user's to the bind);
    everything below it is the jail's."""
    source = Source(tmp_path)
    given = tmp_path / "given"
    given.symlink_to(source.src)
    with Sandbox(SandboxConfig(mounts=[mount(source.src)])) as sb:
        outcome: list[tuple[int, list[str]]] = []
        race(sb, source, lambda: outcome.append(copy_many(lambda n: sb.put(given, f"/dst/{n}"))))
        links = check_jail(lambda cmd: sb.exec(cmd).stdout, source.mark, source.vault)
        assert sb.exec("cat /dst/0/a.x/f1 /dst/0/a/f1 2>/dev/null; true").stdout.startswith("benign\n")
    assert_outcome(*outcome[0], links)


@pytest.mark.slow
def test_input_dir_another_jail_rewrites_never_hands_over_host_files(tmp_path):
    source = Source(tmp_path)
    with Sandbox(SandboxConfig(mounts=[mount(source.src)])) as racer, Sandbox(SandboxConfig()) as sb:
        outcome: list[tuple[int, list[str]]] = []
        race(racer, source, lambda: outcome.append(copy_many(lambda n: inputs.copy_dir(sb, source.src, f"/dst/{n}"))))
        links = check_jail(lambda cmd: sb.exec(cmd).stdout, source.mark, source.vault)
    assert_outcome(*outcome[0], links)


@pytest.fixture
def cli() -> Iterator[dict[str, str]]:
    """The environment of a state directory of the test's own; its service stopped after."""
    base = Path(tempfile.mkdtemp(prefix="jbc-", dir="/tmp"))  # short: a UNIX socket's path has at most 107 bytes
    env = {**os.environ, "JAILBOX_STATE_DIR": str(base), "JAILBOX_SERVICE_IDLE": "600"}
    try:
        yield env
    finally:
        pid = listener_pid(base / "service.sock")
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            assert ended(pid, HANG)
        subprocess.run([*JAILBOX, "cleanup", "--force"], env=env, capture_output=True, timeout=HANG)
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow
def test_cp_into_a_jail_from_its_own_rw_bind_never_reads_through_its_links(tmp_path, cli):
    source = Source(tmp_path)

    def jailbox(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*JAILBOX, *args], capture_output=True, text=True, env=cli, timeout=HANG)

    bind = f"{source.src}:/src:{'give' if os.getuid() == 0 else 'rw'}"
    made = jailbox("create", "--bind", bind)
    assert made.returncode == 0, made.stderr
    sid = made.stdout.strip()
    racer = subprocess.Popen(
        [*JAILBOX, "exec", "--id", sid, "--", "sh", "-c", source.racer("/src")], env=cli, stdout=subprocess.DEVNULL
    )
    landed, errors = 0, []
    try:
        for n in range(COPIES // 2):  # each copy is a process of its own
            r = jailbox("cp", str(source.src), f"{sid}:/dst/{n}")
            if r.returncode == 0:
                landed += 1
            else:
                errors.append(f"SandboxFileError: {r.stderr.rstrip()}")  # the CLI's own line: one, no traceback
    finally:
        source.stop()
        assert racer.wait(HANG) == 0
    links = check_jail(
        lambda cmd: jailbox("exec", "--id", sid, "--", "sh", "-c", cmd).stdout, source.mark, source.vault
    )
    assert_outcome(landed, errors, links)
    os.mkfifo(source.src / "a" / "fifo")  # the walk by path waited on it for ever, and the service with it
    r = jailbox("cp", str(source.src), f"{sid}:/dst/fifo")
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and f"{source.src}/a/fifo" in r.stderr, r.stderr


def held_beneath(top: Path) -> list[str]:
    """What this process holds open beneath ``top`` (the sandbox's own descriptors come and go meanwhile)."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target == str(top) or target.startswith(f"{top}/"):
            held.append(target)
    return held


@pytest.mark.timeout(HANG)  # the walk by path opened a FIFO and waited on it for ever
def test_a_fifo_or_socket_in_the_tree_stops_the_copy_with_one_line(sb, tmp_path):
    for kind in ("fifo", "socket"):
        src = tmp_path / kind
        (src / "sub").mkdir(parents=True)
        (src / "ok").write_text("ok\n")
        with socket.socket(socket.AF_UNIX) as sock:
            if kind == "fifo":
                os.mkfifo(src / "sub" / "special")
            else:
                sock.bind(str(src / "sub" / "special"))
            with pytest.raises(SandboxFileError) as caught:
                sb.put(src, f"/dst/{kind}")
        assert "\n" not in str(caught.value) and str(caught.value.filename) == str(src / "sub" / "special")


def test_a_tree_past_its_bounds_is_refused_in_one_line_and_holds_no_descriptor(sb, tmp_path):
    wide = tmp_path / "wide"
    wide.mkdir()
    for n in range(10):
        (wide / f"f{n}").write_bytes(b"x" * 100)
    deep = tmp_path / "deep"
    os.makedirs(deep / "/".join(["d"] * (hostfs.SOURCE_DEPTH + 1)))
    sb.exec("mkdir -p /dst/in/d/d/d/d && touch /dst/in/d/d/d/d/d")  # the jail refuses a copy six levels down
    with pytest.raises(SandboxFileError, match="more than 5 files, directories and links"):
        sb.put(wide, "/dst/wide", max_entries=5)
    with pytest.raises(SandboxFileError, match="more than 500 bytes of files"):
        sb.put(wide, "/dst/bytes", max_bytes=500)
    with pytest.raises(SandboxFileError, match=f"deeper than {hostfs.SOURCE_DEPTH} directories"):
        sb.put(deep, "/dst/deep")
    with pytest.raises(SandboxFileError) as refused:
        sb.put(deep, "/dst/in")
    assert held_beneath(tmp_path) == [], refused.value  # the walk's descriptors closed, its frames still held
    sb.put(wide, "/dst/fits", max_entries=10, max_bytes=1000)
    assert sb.exec("ls /dst/fits | wc -l").stdout.strip() == "10"


def test_a_copy_into_the_tree_it_reads_ends(tmp_path):
    """The jail's view of the source is the destination: each directory made is one more to walk. The walk
    ends at its depth bound instead of chasing its own copies."""
    source = Source(tmp_path)
    with Sandbox(SandboxConfig(mounts=[mount(source.src)])) as sb:
        with pytest.raises(SandboxFileError) as caught:
            sb.put(source.src, "/src/again")
    assert "\n" not in str(caught.value)
    assert len(str(caught.value.filename).split("/again")) <= hostfs.SOURCE_DEPTH + 2
