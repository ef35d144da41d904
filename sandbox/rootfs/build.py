"""Build a root filesystem from a recipe with mmdebstrap, rootless or as root, into the store.

mmdebstrap writes a tar stream on stdout whose owners are the ids *inside* its namespace (root is
0), and the store's extractor unpacks that stream inside a user namespace with the jail's own id map.
So a built tree has the owners a jail expects (in-jail root may write everything root owns, apt's
``_apt`` is ``_apt``) without a chown pass over 1 GB, and the same path serves rootless and root builds.
As root, mmdebstrap runs ``--mode=root`` (a recipe's steps are trusted code, run as host root in its
chroot) and the tree it streams lands owned in root's jail range (``0 R 65536``), never host root's.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, ClassVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..config import check_env, jail_path
from ..errors import ConfigError, RootfsBuildError
from ..sandbox import DEFAULT_PATH
from . import shipped, unpack
from . import store as store_mod
from .image import ImageConfig

_PACKAGE = re.compile(r"^[a-z0-9][a-z0-9+.\-]*(:[a-z0-9]+)?(=[A-Za-z0-9.+~:\-]+)?$")
TERM_WAIT = 20.0  # mmdebstrap's own cleanup on SIGTERM (unmounting its chroot, removing its temp dir)
KILL_WAIT = 10.0
BUILD_CA_DIR = "/tmp/jailbox-build-ca"  # in the tree, during its steps only
# dpkg's fsync per file buys nothing in a tree that is thrown away if the build stops; the setting is in
# the tree while it is built only (--dpkgopt would leave it there for good)
BUILD_DPKG_CFG = "/etc/dpkg/dpkg.cfg.d/jailbox-build-unsafe-io"


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a build, raised once mmdebstrap and everything it started are gone and the
    unfinished tree (``removed``, None if there was none yet) is deleted: nothing was stored."""

    def __init__(self, removed: Path | None) -> None:
        super().__init__(str(removed) if removed else "")
        self.removed = removed


class Recipe(BaseModel):
    """A recipe file (``rootfs/*.yaml``): what goes into the tree and how sandboxes start in it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$")
    description: str = ""
    suite: str = Field("bookworm", pattern=r"^[a-z0-9][a-z0-9.-]*$")
    mirror: str = Field("http://deb.debian.org/debian", pattern=r"^(https?|file)://\S+$")
    components: tuple[str, ...] = ("main",)
    variant: str = Field("apt", pattern=r"^(apt|minbase|required|important|standard|essential)$")
    packages: tuple[str, ...] = ()
    pip: tuple[str, ...] = Field((), description="pip requirements installed after the packages")
    pip_index_url: str | None = None
    run: tuple[str, ...] = Field((), description="shell commands run as root inside the tree, in order")
    apt_lists: bool = Field(True, description="keep apt's package lists so apt-get install works at once")
    env: dict[str, str] = Field(default_factory=dict, description="added to every command's environment")
    workdir: str = "/testbed"

    @field_validator("packages")
    @classmethod
    def _packages(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        bad = [p for p in v if not _PACKAGE.match(p)]
        if bad:
            raise ValueError(f"not Debian package names: {', '.join(bad)}")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        return check_env(v)

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, v: str) -> str:
        return jail_path(v)


def unknown_recipe(name: str) -> ConfigError:
    """The error for a recipe name that is not shipped: a typo must not build something else."""
    return ConfigError(
        f"no recipe named {name!r}; shipped recipes: {', '.join(shipped.names())} "
        "(or give a recipe file with --recipe FILE)"
    )


def load_recipe(name_or_path: str | Path) -> Recipe:
    """A shipped recipe by name, or a recipe file by path."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        try:
            text = path.read_text()
        except OSError as e:
            raise ConfigError(f"recipe {path}: {e.strerror}") from e
        where = str(path)
    else:
        recipe_file = shipped.directory() / f"{name_or_path}.yaml"
        if not recipe_file.is_file():
            raise unknown_recipe(str(name_or_path))
        text, where = recipe_file.read_text(), f"recipe {name_or_path}"
    try:
        data = yaml.safe_load(text)
        return Recipe.model_validate(data if isinstance(data, dict) else {})
    except yaml.YAMLError as e:
        raise ConfigError(f"{where} is not valid YAML: {e}") from e
    except ValidationError as e:
        raise ConfigError(f"{where} is not a valid recipe:\n{e}") from e


def mmdebstrap_argv(recipe: Recipe, mode: str) -> list[str]:
    """The mmdebstrap command line for a recipe; the tree comes out as a tar stream on stdout."""
    argv = [
        "mmdebstrap",
        f"--mode={mode}",
        f"--variant={recipe.variant}",
        f"--components={','.join(recipe.components)}",
        # apt inside a jail runs as (namespaced) root: without subordinate ids there is no _apt user.
        '--aptopt=APT::Sandbox::User "root"',
        "--verbose",  # apt's and dpkg's line per package: what BuildProgress counts
    ]
    if recipe.packages:
        argv.append(f"--include={','.join(recipe.packages)}")
    if recipe.apt_lists:
        argv.append("--skip=cleanup/apt/lists")
    cfg_dir = BUILD_DPKG_CFG.rsplit("/", 1)[0]
    argv.append(f'--setup-hook=mkdir -p "$1"{cfg_dir} && echo force-unsafe-io > "$1"{BUILD_DPKG_CFG}')
    hooks = [f"mkdir -p {shlex.quote(recipe.workdir)}"]
    if recipe.pip:
        index = f" --index-url {shlex.quote(recipe.pip_index_url)}" if recipe.pip_index_url else ""
        reqs = " ".join(shlex.quote(r) for r in recipe.pip)
        pip = "python3 -m pip install --no-cache-dir --break-system-packages --root-user-action=ignore"
        hooks.append(f"{pip}{index} {reqs}")
    hooks.extend(recipe.run)
    # Steps see the environment the tree's sandboxes will (as a Dockerfile's ENV reaches its RUN
    # lines), and nothing of the host's: its TMPDIR, PATH or HOME would point into the wrong tree.
    step_env = {"PATH": DEFAULT_PATH, "HOME": "/root", "LANG": "C.UTF-8", **recipe.env}
    ca = _host_ca()
    if ca is not None:
        # Steps trust what the host trusts (a TLS-inspecting proxy's CA included) while the tree is
        # built; the copy goes before the tree is stored.
        argv.append(f'--customize-hook=chroot "$1" /bin/mkdir -p {BUILD_CA_DIR}')
        argv.append(f"--customize-hook=copy-in {shlex.quote(str(ca))} {BUILD_CA_DIR}")
        step_env |= dict.fromkeys(("PIP_CERT", "SSL_CERT_FILE"), f"{BUILD_CA_DIR}/{ca.name}")
    env = " ".join(shlex.quote(f"{k}={v}") for k, v in step_env.items())
    for hook in hooks:
        argv.append(f'--customize-hook=chroot "$1" /usr/bin/env -i {env} /bin/sh -euc {shlex.quote(hook)}')
    # removed from inside: a step may have made /tmp or /etc/dpkg a link out of the tree
    argv.append(f'--customize-hook=chroot "$1" /bin/rm -f {BUILD_DPKG_CFG}')
    if ca is not None:
        argv.append(f'--customize-hook=chroot "$1" /bin/rm -rf {BUILD_CA_DIR}')
    argv += [recipe.suite, "-", recipe.mirror]
    return argv


def _host_ca() -> Path | None:
    """The host's CA bundle (OpenSSL's default file), if it has one."""
    cafile = ssl.get_default_verify_paths().cafile
    return Path(cafile) if cafile and Path(cafile).is_file() else None


def _mode() -> str:
    if os.getuid() == 0:
        return "root"
    from .. import hostids

    if not hostids.full_range_available():
        raise RootfsBuildError(
            "a rootless build needs this user's subordinate ids (mmdebstrap --mode=unshare); fix: "
            f"sudo apt-get install uidmap && {hostids.subuid_fix(os.environ.get('USER') or str(os.getuid()))}"
        )
    return "unshare"


def build(
    name: str | None = None,
    recipe: str | Path = "default",
    *,
    log: Callable[[Update], None] | None = None,
    root: Path | None = None,
) -> store_mod.Entry:
    """Build ``recipe`` into the store as ``name`` (default: the recipe's name) and return the entry.

    ``log`` is told the build's progress (``BuildProgress``: stages, and a line per package).
    The tree is unpacked into a staging directory and renamed into place only when mmdebstrap
    succeeded, so a failed or interrupted build leaves the previous tree (if any) untouched.
    """
    spec = load_recipe(recipe)
    if shutil.which("mmdebstrap") is None:
        raise RootfsBuildError("rootfs build needs mmdebstrap; fix: apt-get install mmdebstrap")
    argv = mmdebstrap_argv(spec, _mode())
    name = name or spec.name
    store = store_mod.Store(root)
    staged: Path | None = None
    try:
        with store.create(name, source=f"recipe {recipe}", kind="build") as staging:
            staged = staging.path
            staging.add_stats(_run(argv, staging.tree, log))
            staging.config = ImageConfig(env=spec.env, workdir=spec.workdir)
    except KeyboardInterrupt as e:  # ``create`` has removed the staging tree by now
        raise Interrupted(staged) from e
    return store.require(name)


def _run(argv: list[str], tree: Path, log: Callable[[Update], None] | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "http_proxy", "https_proxy")}
    # mmdebstrap's temporary files go in a directory of ours, removed whatever happens: interrupted
    # early, mmdebstrap leaves its gpg home or chroot there, owned by subordinate ids when rootless.
    work = Path(tempfile.mkdtemp(prefix="jailbox-mmdebstrap-"))
    work.chmod(0o755)  # rootless, mmdebstrap's namespace (subordinate ids) must reach it
    env["TMPDIR"] = str(work)
    try:
        return _mmdebstrap(argv, env, tree, log)
    finally:
        unpack.rmtree(work)


def _mmdebstrap(argv: list[str], env: dict[str, str], tree: Path, log: Callable[[Update], None] | None) -> dict:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True)
    assert proc.stdout is not None and proc.stderr is not None
    tail: list[str] = []
    reader = threading.Thread(target=_read_log, args=(proc.stderr, tail, log), daemon=True)
    reader.start()
    try:
        stats = unpack.extract_tar(proc.stdout, tree)
        code = proc.wait()
    except BaseException as e:
        if isinstance(e, Exception):  # a failing mmdebstrap ends the stream: let it exit and explain
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
        failed_first = proc.returncode
        _stop(proc)
        reader.join(KILL_WAIT)  # EOF once the group is gone, unless one of its daemons left it
        if isinstance(e, Exception) and failed_first is not None and failed_first > 0:
            raise _failed(failed_first, tail) from e
        raise
    reader.join()
    if code != 0:
        raise _failed(code, tail)
    return stats


def _stop(proc: subprocess.Popen) -> None:
    """End mmdebstrap and everything it started: its session holds tar, apt, dpkg and, rootless,
    its user namespace's processes. SIGTERM first, so mmdebstrap unmounts and removes its chroot;
    then SIGKILL for whatever is left. Our end of the tar pipe is closed first: a tar blocked
    writing to it would otherwise wait for a reader that is gone."""
    assert proc.stdout is not None
    proc.stdout.close()
    _signal_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=TERM_WAIT)
    except subprocess.TimeoutExpired:
        pass
    _signal_group(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + KILL_WAIT
    while _signal_group(proc.pid, 0):  # killed members linger as zombies until reaped
        if time.monotonic() > deadline:
            raise RootfsBuildError(f"mmdebstrap's processes (process group {proc.pid}) did not end on SIGKILL")
        time.sleep(0.1)


def _signal_group(pgid: int, sig: int) -> bool:
    """Signal a process group; whether it still has members."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member that switched ids (apt's _apt) is still a member
        return True
    return True


@dataclass(frozen=True)
class Update:
    """One line for the user: a stage (``transient`` False: keep it), or a package's progress, which a
    terminal redraws in place (``transient``); ``phase``/``count``/``total`` say which package event."""

    text: str
    transient: bool = False
    phase: str = ""
    count: int = 0
    total: int = 0


class BuildProgress:
    """mmdebstrap --verbose's output made into progress: its ``I:``/``W:``/``E:`` stage lines as they are,
    and a line per package downloaded (apt's ``Get:``), unpacked and set up (dpkg's) with counts and an
    ETA; everything else (dpkg's chatter) is dropped, though a failed build still shows the raw tail.

    The total is the sum of apt's ``N newly installed`` lines (one for the essential set, one for the
    rest), so it grows once mid-build; the ETA assumes the remaining steps go at the average pace so far.
    """

    NEW = re.compile(r"^\d+ upgraded, (\d+) newly installed")
    GET = re.compile(r"^Get:\d+ \S+ \S+ \S+ (\S+) \S+ \S+ \[")  # Get:N URL SUITE/COMPONENT ARCH PKG ARCH VER [SIZE]
    DPKG = re.compile(r"^(Unpacking|Setting up) (\S+) ")
    PHASES: ClassVar[dict[str, str]] = {"Get": "downloaded", "Unpacking": "unpacked", "Setting up": "set up"}

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.total = 0
        self.counts = dict.fromkeys(self.PHASES.values(), 0)
        self._first: float | None = None

    def feed(self, line: str) -> Update | None:
        if line[:3] in ("I: ", "W: ", "E: "):
            return Update(line)
        new = self.NEW.match(line)
        if new:
            self.total += int(new.group(1))
            return Update(f"I: {new.group(1)} packages to install ({self.total} in all)")
        get = self.GET.match(line) if self.total else None  # before a total, Get: lines are package indexes
        dpkg = self.DPKG.match(line)
        if get:
            verb, package = "Get", get.group(1)
        elif dpkg:
            verb, package = dpkg.group(1), dpkg.group(2).split(":")[0]
        else:
            return None
        phase = self.PHASES[verb]
        self.counts[phase] = min(self.counts[phase] + 1, max(self.total, 1))
        now = self.clock()
        if self._first is None:
            self._first = now
        count, total = self.counts[phase], max(self.total, self.counts[phase])
        text = f"{phase:>10} {count:>4}/{total} {package}  ETA {self.eta(now)}"
        return Update(text, transient=True, phase=phase, count=count, total=total)

    def eta(self, now: float) -> str:
        done = sum(self.counts.values())
        left = 3 * self.total - done
        if self._first is None or done < 2 or left <= 0:
            return "-" if left > 0 else "0:00"
        seconds = int((now - self._first) / (done - 1) * left)
        return f"{seconds // 60}:{seconds % 60:02}"


def _failed(code: int, tail: list[str]) -> RootfsBuildError:
    # A failed step's error is followed by mmdebstrap repeating the step's whole text (a recipe step
    # can be longer than the tail shown): show what came before that, and its first line.
    end = next((i for i, line in enumerate(tail) if line.startswith("E: setup failed")), len(tail))
    shown = [*tail[max(0, end - 25) : end], *tail[end : end + 1]]
    return RootfsBuildError(f"mmdebstrap failed (exit {code}):\n" + "\n".join(shown))


def _read_log(stream: IO[bytes], tail: list[str], log: Callable[[Update], None] | None) -> None:
    progress = BuildProgress()
    for raw in stream:
        line = raw.decode(errors="replace").rstrip()
        tail.append(line)
        del tail[:-200]
        update = progress.feed(line)
        if log is not None and update is not None:
            log(update)
