"""`jailbox rootfs build`: real mmdebstrap builds from Debian's mirror (rootless in the unprivileged
pass, root mode in the root pass), then real sandboxes on the built trees."""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import os
import subprocess
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cli import JAILBOX
from support.paper_tree import paper_store

from jailbox.sandbox import Sandbox, SandboxConfig
from jailbox.sandbox.errors import ConfigError, RootfsBuildError
from jailbox.sandbox.rootfs import build, shipped
from jailbox.sandbox.rootfs.store import Store
from jailbox.sandbox.sandbox import DEFAULT_PATH

REPO = Path(__file__).resolve().parent.parent
PAPER_IMPORTS = "import numpy, scipy, sympy, matplotlib, mpmath, IPython, chardet"

needs_mmdebstrap = pytest.mark.needs("mmdebstrap", "subids")


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory):
    """A store of this module's own; its trees belong to subordinate ids, so the store removes them."""
    root = tmp_path_factory.mktemp("rootfs-cache")
    old = os.environ.get("JAILBOX_CACHE_DIR")
    os.environ["JAILBOX_CACHE_DIR"] = str(root)
    yield root
    store = Store(root)
    for entry in store.list():
        store.remove(entry.name)
    if old is None:
        del os.environ["JAILBOX_CACHE_DIR"]
    else:
        os.environ["JAILBOX_CACHE_DIR"] = old


def _jailbox(*args: str, cache: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAILBOX_CACHE_DIR": str(cache)}
    return subprocess.run([*JAILBOX, *args], capture_output=True, text=True, env=env, timeout=timeout)


@pytest.fixture(scope="module")
def paper() -> Iterator[Path]:
    """The store holding the paper's environment as ``default``: built once by the CLI with no
    arguments, as docs/rootfs.md says, and kept between runs (``paper_tree``)."""
    root = paper_store()
    old = os.environ.get("JAILBOX_CACHE_DIR")
    os.environ["JAILBOX_CACHE_DIR"] = str(root)
    yield root
    if old is None:
        del os.environ["JAILBOX_CACHE_DIR"]
    else:
        os.environ["JAILBOX_CACHE_DIR"] = old


def test_shipped_recipes_load():
    assert {"default", "debian", "slim"} <= set(shipped.names())
    paper = build.load_recipe("default")
    assert paper.suite == "trixie"
    # the base is python:3.11-slim's (ca-certificates, netbase, tzdata); the Dockerfile's tools come in a
    # later step, with their recommended packages
    assert paper.packages == ("ca-certificates", "netbase", "tzdata")
    assert any("Install-Recommends=true git curl wget build-essential ca-certificates" in step for step in paper.run)
    assert not any(p.startswith("python3") for p in paper.packages)  # CPython 3.11 is compiled, as the image's
    assert paper.workdir == "/testbed"
    assert not paper.apt_lists
    assert paper.env["PIP_DISABLE_PIP_VERSION_CHECK"] == "1"
    assert "PYTHONUNBUFFERED" not in paper.env  # how stdout and stderr interleave depends on it
    assert paper.env["PATH"].startswith("/root/.local/bin:")
    debian = build.load_recipe("debian")
    assert "python-is-python3" in debian.packages and debian.suite == "bookworm"


def test_bad_recipes_get_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"no recipe named 'nope'.*default.*slim"):
        build.load_recipe("nope")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\npackages: ['ok', 'rm -rf /']\nsuite: bookworm\n")
    with pytest.raises(ConfigError, match="not Debian package names: rm -rf /"):
        build.load_recipe(bad)
    bad.write_text("name: x\npackagez: [bash]\n")
    with pytest.raises(ConfigError, match="packagez"):
        build.load_recipe(bad)
    bad.write_text("name: x\npackages: [bash\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        build.load_recipe(bad)
    with pytest.raises(ConfigError, match=r"nothere\.yaml"):
        build.load_recipe(tmp_path / "nothere.yaml")


# What the paper's trajectories show of the reference image, and what python:3.11-slim makes.
PAPER_FACTS = {
    "python": "Python 3.11.2",
    "site": "/usr/local/lib/python3.11/site-packages",
    "numpy": "2.4.1",
    "PIL": "12.1.0",
    "scipy": "1.17.0",
    "matplotlib": "3.10.8",
    "mpmath": "1.3.0",
    "chardet": "5.2.0",
}


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.root  # the tree takes minutes to build: CI builds it in the root pass only (paper_tree)
@pytest.mark.paper_tree
@pytest.mark.timeout(3600)  # the build, if the tests before left it unfinished
def test_paper_environment(paper):
    entry = Store(paper).require("default")
    assert entry.kind == "build"
    listing = _jailbox("rootfs", "list", cache=paper)
    assert listing.returncode == 0 and "default" in listing.stdout and "build" in listing.stdout
    with Sandbox(SandboxConfig(rootfs="default")) as sb:
        r = sb.exec(f"python3 -c '{PAPER_IMPORTS}; print(numpy.arange(4).sum())'")
        assert r.exit_code == 0, r.stderr
        assert r.stdout == "6\n"
        r = sb.exec("pwd; id -u; python --version; pip --version; echo $PIP_DISABLE_PIP_VERSION_CHECK")
        lines = r.stdout.splitlines()
        assert lines[0] == "/testbed" and lines[1] == "0"
        assert lines[2] == PAPER_FACTS["python"]
        assert lines[3].startswith("pip 25.3 from /usr/local/lib/python3.11/site-packages/pip") and lines[4] == "1"
        modules = ("numpy", "PIL", "scipy", "matplotlib", "mpmath", "chardet")
        versions = "; ".join(f"print({m}.__version__)" for m in modules)
        imports = f"import {', '.join(modules)}, IPython, site"
        r = sb.exec(f"python -c '{imports}; {versions}; print(site.getsitepackages()[0]); print(IPython.__version__)'")
        assert r.exit_code == 0, r.stderr
        *got, site, ipython = r.stdout.splitlines()
        assert got == [PAPER_FACTS[m] for m in modules]
        assert site == PAPER_FACTS["site"] and ipython.startswith("9.")
        markers = "/usr/lib/python3*/EXTERNALLY-MANAGED /usr/local/lib/python3.11/EXTERNALLY-MANAGED"
        assert sb.exec(f"ls {markers}").exit_code != 0
        sb.write_file("/testbed/script.py", "import sympy\nprint(sympy.factorint(588))\n")
        r = sb.exec("python script.py")  # recorded trajectories call `python`, not `python3`
        assert r.stdout == "{2: 2, 3: 1, 7: 2}\n", r.stderr
        r = sb.exec("gcc --version && git --version && curl --version && wget --version && uv --version", timeout=60)
        assert r.exit_code == 0, r.stderr
        assert sb.exec("command -v uv").stdout == "/root/.local/bin/uv\n"
        env = sb.exec("env").stdout
        assert "PYTHONUNBUFFERED" not in env and "DEBIAN_FRONTEND=noninteractive" in env
        assert sb.exec("ls /var/lib/apt/lists | grep -c Packages").stdout.strip() == "0"  # deleted, as in the image
        r = sb.exec("python -c 'import setuptools, wheel; print(setuptools.__version__, wheel.__version__)'")
        assert r.stdout == "79.0.1 0.45.1\n", r.stderr  # what python:3.11-slim pinned
        # debian:trixie-slim's apt: updates and security sources, no translations; no docs but copyrights
        sources = sb.exec("cat /etc/apt/sources.list.d/debian.sources").stdout
        assert "Suites: trixie trixie-updates" in sources and "Suites: trixie-security" in sources
        assert 'Acquire::Languages:: "none";' in sb.exec("apt-config dump Acquire::Languages").stdout
        assert sb.exec("find /usr/share/doc /usr/share/man -type f ! -name copyright | wc -l").stdout == "0\n"
        # the Dockerfile's apt-get install kept its recommended packages: git's pager and ssh client
        assert sb.exec("command -v less ssh xauth").stdout == "/usr/bin/less\n/usr/bin/ssh\n/usr/bin/xauth\n"


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.root  # the tree takes minutes to build: CI builds it in the root pass only (paper_tree)
@pytest.mark.paper_tree
@pytest.mark.timeout(3600)  # the build, if the tests before left it unfinished
def test_apt_get_install_lands_in_the_overlay(paper):
    tree = Store(paper).require("default").tree
    assert not (tree / "usr/bin/hello").exists()
    with Sandbox(SandboxConfig(rootfs="default", network="host")) as sb:
        # the image keeps no package lists: `apt-get update` first, as the paper's agents do
        r = sb.exec("apt-get update -q && apt-get install -y --no-install-recommends hello && hello", timeout=300)
        assert r.exit_code == 0, r.stdout[-2000:] + r.stderr[-2000:]
        assert r.stdout.endswith("Hello, world!\n")
    assert not (tree / "usr/bin/hello").exists()  # the stored tree is untouched
    with Sandbox(SandboxConfig(rootfs="default")) as sb:
        assert sb.exec("command -v hello").exit_code != 0


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.root  # the tree takes minutes to build: CI builds it in the root pass only (paper_tree)
@pytest.mark.paper_tree
@pytest.mark.timeout(3600)  # the build, if the tests before left it unfinished
def test_sandboxes_share_the_tree_without_copying_it(paper, _state_dir):
    entry = Store(paper).require("default")
    assert entry.size > 500_000_000
    with Sandbox(SandboxConfig(rootfs="default")) as sb:
        sb.exec("true")
        used = sum(
            os.lstat(os.path.join(d, f)).st_size for d, _, files in os.walk(_state_dir / "sandboxes") for f in files
        )
        assert used < 1_000_000  # the writable layer only: the tree is the overlay's lower layer


def _wheel(name: str, version: str, source: str) -> tuple[str, bytes]:
    """A minimal pure-Python wheel, so the test needs no index but its own."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": source.encode(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: jailbox-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return f"{name}-{version}-py3-none-any.whl", buf.getvalue()


@pytest.fixture
def package_index(tmp_path):
    """A PEP 503 simple index on 127.0.0.1 holding one wheel."""
    filename, data = _wheel("jbprobe", "1.0", "ANSWER = 42\n")
    project = tmp_path / "index" / "simple" / "jbprobe"
    project.mkdir(parents=True)
    (project / filename).write_bytes(data)
    (project / "index.html").write_text(f'<a href="{filename}">{filename}</a>\n')
    handler = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(tmp_path / "index"))  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    server.shutdown()
    server.server_close()


@needs_mmdebstrap
@pytest.mark.slow
@pytest.mark.network
def test_custom_recipe_with_pip_and_run_steps(tmp_path, cache, package_index):
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(
        "name: tiny\n"
        "packages: [python3-pip]\n"
        "pip: [jbprobe]\n"
        f"pip_index_url: {package_index}\n"
        "run:\n  - echo built-by-recipe > /etc/jailbox-recipe\n  - chown 42:42 /etc/jailbox-recipe\n"
        "  - env > /etc/jailbox-step-env\n"
        f"  - cat {build.BUILD_DPKG_CFG} > /etc/jailbox-step-dpkg\n"
        "env: {GREETING: hello}\n"
        "workdir: /work\n"
        "apt_lists: false\n"
    )
    r = _jailbox("rootfs", "build", "mine", "--recipe", str(recipe), "--quiet", cache=cache)
    assert r.returncode == 0, r.stderr[-3000:]
    with Sandbox(SandboxConfig(rootfs="mine")) as sb:
        r = sb.exec("import_ok=$(python3 -c 'import jbprobe; print(jbprobe.ANSWER)'); echo $import_ok $GREETING; pwd")
        assert r.stdout == "42 hello\n/work\n", r.stderr
        assert sb.exec("cat /etc/jailbox-recipe").stdout == "built-by-recipe\n"
        # owners come out as the recipe left them, seen through the jail's id map
        owners = sb.exec("stat -c '%u:%g' / /etc/jailbox-recipe").stdout.split()
        assert owners[0] == "0:0"
        assert owners[1] == ("42:42" if os.getuid() == 0 or _has_subids() else "0:0")
        assert sb.exec("ls /var/lib/apt/lists | grep -c Packages").stdout.strip() == "0"
        # steps see the recipe's environment and nothing of the host's (its TMPDIR, HOME, PATH)
        step_env = dict(line.split("=", 1) for line in sb.exec("cat /etc/jailbox-step-env").stdout.splitlines())
        assert step_env.pop("PWD", "/") == "/" and step_env.pop("SHLVL", "1") == "1"
        expected = {"PATH": DEFAULT_PATH, "HOME": "/root", "LANG": "C.UTF-8", "GREETING": "hello"}
        ca = build._host_ca()  # the host's CA bundle, there for the steps' downloads and gone after them
        if ca is not None:
            expected |= dict.fromkeys(("PIP_CERT", "SSL_CERT_FILE"), f"{build.BUILD_CA_DIR}/{ca.name}")
        assert step_env == expected
        assert sb.exec(f"ls -d {build.BUILD_CA_DIR}").exit_code != 0
        # dpkg skipped its fsyncs while the tree was built, and the tree does not keep that setting
        assert sb.exec("cat /etc/jailbox-step-dpkg").stdout == "force-unsafe-io\n"
        assert sb.exec(f"ls {build.BUILD_DPKG_CFG}").exit_code != 0
    removed = _jailbox("rootfs", "rm", "mine", cache=cache)
    assert removed.returncode == 0, removed.stderr
    assert not (cache / "rootfs" / "mine").exists()


@needs_mmdebstrap
@pytest.mark.slow
@pytest.mark.network
def test_failed_build_reports_mmdebstrap_and_stores_nothing(tmp_path, cache):
    recipe = tmp_path / "broken.yaml"
    # the smallest variant: mmdebstrap looks for the recipe's packages once Debian's essential set is
    # installed, so the failure comes as late in the build as ever, in 17 s rather than 27
    recipe.write_text("name: broken\nvariant: essential\npackages: [no-such-package-jailbox]\n")
    with pytest.raises(RootfsBuildError, match=r"(?s)mmdebstrap failed.*no-such-package-jailbox"):
        build.build(recipe=recipe)
    store = Store(cache)
    assert store.get("broken") is None
    assert not any((cache / "tmp").iterdir())


def _has_subids() -> bool:
    from jailbox.sandbox import hostids

    return hostids.full_range_available()
