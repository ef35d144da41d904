"""A new user's first hour: the suite's guards skip what the machine lacks, naming the fix (and
fail it under JAILBOX_TEST_STRICT=1, as every other skip fails there); and ``jailbox rootfs build``
through the real CLI: a mistyped recipe name is an error that lists the recipes (not a 1.4 GB build
of the default), the not-found message suggests nothing that would do that, and Ctrl-C (a real SIGINT
to the command's process group, as a terminal sends it) ends mmdebstrap and everything it started
and leaves nothing behind."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import conftest
import psutil
import pytest
from conftest import need, require
from support.cli import JAILBOX
from support.waits import wait_until

from jailbox.sandbox.rootfs.store import Store

INTERRUPT_BOUND = 30.0


def test_a_missing_prerequisite_skips_naming_the_fix_and_fails_under_strict(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(conftest.TOOLS, "jailbox-no-such-tool", "jailbox-no-such-package")
    monkeypatch.setattr(conftest, "SHARED_DATA", tmp_path / "shared" / "data")
    monkeypatch.setattr(conftest, "STRICT", False)
    with pytest.raises(pytest.skip.Exception, match=r"fix: sudo apt-get install jailbox-no-such-package$"):
        need("jailbox-no-such-tool")
    with pytest.raises(pytest.skip.Exception, match=r"reference data at .*shared/data; fix: place"):
        need("shared-data")
    monkeypatch.setitem(conftest.TOOLS, "sh", "dash")
    need("sh")  # present: nothing happens
    monkeypatch.setattr(conftest, "STRICT", True)
    with pytest.raises(pytest.fail.Exception, match=r"jailbox-no-such-package .*JAILBOX_TEST_STRICT=1"):
        need("jailbox-no-such-tool")
    (tmp_path / "shared" / "data").mkdir(parents=True)
    need("shared-data")
    with pytest.raises(ValueError, match="unknown prerequisite"):
        need("jailbox-no-such-tool-unlisted")


SKIPS = {  # every way a test can skip itself, outside conftest.need
    "test_plain.py": "import pytest\n\ndef test_it():\n    pytest.skip('plain')\n",
    "test_skipif.py": "import pytest\n\n@pytest.mark.skipif(True, reason='marked')\ndef test_it():\n    pass\n",
    "test_module.py": "import pytest\n\npytest.importorskip('jailbox_no_such_module')\n\ndef test_it():\n    pass\n",
    "test_fixture.py": "import pytest\n\n@pytest.fixture\ndef f():\n    pytest.skip('fixture')\n\n"
    "def test_it(f):\n    pass\n",
}


@pytest.mark.slow
@pytest.mark.parametrize("strict", [False, True])
def test_under_strict_every_kind_of_skip_fails(tmp_path: Path, strict: bool) -> None:
    for name, text in SKIPS.items():
        (tmp_path / name).write_text(text)
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(conftest.__file__).parent),
        "JAILBOX_TEST_STRICT": "1" if strict else "0",
    }
    argv = [sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-q", "-rN"]
    argv += ["--continue-on-collection-errors", "-c", "/dev/null", "--rootdir", str(tmp_path), str(tmp_path)]
    r = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    tail = r.stdout.splitlines()[-1]
    assert tail.startswith("1 failed, 3 errors" if strict else "4 skipped"), r.stdout
    if strict:  # once per failure's own section: no summary, whose lines the terminal's width cuts
        assert r.stdout.count("JAILBOX_TEST_STRICT=1 runs every test") == 4, r.stdout


def test_a_mistyped_recipe_is_an_error_that_lists_the_recipes(store: Store) -> None:
    for args in (["slimm"], ["mine", "--recipe", "slimm"]):
        r = subprocess.run([*JAILBOX, "rootfs", "build", *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 1, r.stderr
        assert "no recipe named 'slimm'; shipped recipes: code-interpreter, debian, default, e2b-base, slim" in r.stderr
        assert "--recipe FILE" in r.stderr
        assert "mmdebstrap" not in r.stderr  # refused before anything was started
    assert store.list() == []
    assert not (store.root / "tmp").exists() or not any((store.root / "tmp").iterdir())


def test_not_found_suggests_only_builds_that_exist(store: Store) -> None:
    r = subprocess.run([*JAILBOX, "exec", "--rootfs", "python:3.11-slim", "--", "true"], capture_output=True, text=True)
    assert r.returncode != 0
    assert "jailbox rootfs pull python:3.11-slim" in r.stderr
    assert "rootfs build python:3.11-slim" not in r.stderr  # that would be an error (it used to build default)
    assert (
        "jailbox rootfs build --recipe RECIPE python:3.11-slim" in r.stderr
        and "debian, default, e2b-base, slim" in r.stderr
    )
    r = subprocess.run([*JAILBOX, "exec", "--rootfs", "slim", "--", "true"], capture_output=True, text=True)
    assert "Build it with `jailbox rootfs build slim`" in r.stderr


def _descendants(pid: int, seen: dict[psutil.Process, str]) -> None:
    """Record every process below ``pid`` with its name (processes come and go while we look)."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return
    for proc in children:
        try:
            seen.setdefault(proc, proc.name())
        except psutil.NoSuchProcess:
            continue


def _alive(procs: list[psutil.Process]) -> list[str]:
    left = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{proc.pid} {proc.name()}")
        except psutil.NoSuchProcess:
            continue
    return left


@pytest.mark.needs("mmdebstrap", "subids")
@pytest.mark.slow
@pytest.mark.network
@pytest.mark.parametrize("moment", ["downloading", "tarball"])
def test_ctrl_c_during_rootfs_build_ends_everything_and_leaves_nothing(store: Store, moment: str) -> None:
    try:
        resolvable = bool(socket.getaddrinfo("deb.debian.org", 80))
    except OSError:
        resolvable = False
    require(resolvable, "Debian's mirror (deb.debian.org)", "network access with a working DNS resolver")
    # mmdebstrap's own temporary directory goes here, and must go too. Rootless, its subordinate ids
    # must reach it, which pytest's 0700 tmp_path does not allow.
    tmpdir = Path(tempfile.mkdtemp(prefix="jbhour-", dir="/tmp"))
    tmpdir.chmod(0o755)
    env = {**os.environ, "TMPDIR": str(tmpdir)}
    cli = subprocess.Popen(
        [*JAILBOX, "rootfs", "build", "slim"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group, as a shell's foreground job
    )
    seen: dict[psutil.Process, str] = {}
    staging = store.root / "tmp"

    def at_the_moment() -> bool:  # mmdebstrap running, and either its download or the tar stream begun
        assert cli.poll() is None, cli.communicate()[1][-3000:]
        _descendants(cli.pid, seen)
        running = bool(_alive([p for p, name in seen.items() if name == "mmdebstrap"]))
        trees = list(staging.glob("*/tree/*")) if staging.is_dir() else []
        return running and bool(trees if moment == "tarball" else staging.is_dir() and any(staging.iterdir()))

    try:
        wait_until(at_the_moment, f"the {moment} moment", 900, every=0.1)
        time.sleep(0.5)
        _descendants(cli.pid, seen)
        os.killpg(cli.pid, signal.SIGINT)  # what Ctrl-C does: the whole foreground process group
        started = time.monotonic()
        _, err = cli.communicate(timeout=INTERRUPT_BOUND)
        took = time.monotonic() - started
    finally:
        if cli.poll() is None:
            os.killpg(cli.pid, signal.SIGKILL)
            cli.wait()
        left = list(tmpdir.iterdir())
        shutil.rmtree(tmpdir, ignore_errors=True)
    lines = err.decode(errors="replace").splitlines()
    assert cli.returncode == 130, lines[-20:]
    assert took < INTERRUPT_BOUND
    assert lines[-1].startswith("jailbox: interrupted; stopped mmdebstrap, removed the unfinished tree "), lines[-20:]
    assert "nothing stored" in lines[-1]
    assert "mmdebstrap" in seen.values() and (moment != "tarball" or "tar" in seen.values())
    assert _alive(list(seen)) == []
    assert list(staging.iterdir()) == []
    assert store.list() == []
    assert left == []
