"""``jailbox serve`` driven by the unmodified JavaScript SDKs, npm's ``e2b`` and ``@e2b/code-interpreter``, under
Node, pointed at the server by environment variables alone.

The scenarios are ``tests/support/js_sdk.cjs``; each test runs a few of them in one Node process against one
server for the module, with the latest release of each package and with the previous minor release. The
packages are looked for in ``$JAILBOX_JS_SDK`` and ``$JAILBOX_JS_SDK_PREVIOUS`` (directories holding
``node_modules``), else where ``.ci/run``'s ``JS_SDK_INSTALL`` and ``JS_SDK_PREVIOUS_INSTALL`` put them,
``.venv/js-sdk`` and ``.venv/js-sdk-previous`` in the checkout (a missing one's skip names its command). Over
``http://`` the SDK's fetch (undici, HTTP/2 allowed only where TLS offers it) speaks HTTP/1.1, the server's,
with no variable to set."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import require
from support.serve import KEY_A, KEY_B, Served, key_file, start_server

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = Path(__file__).resolve().parent / "support" / "js_sdk.cjs"
TABLE = ROOT / "docs" / "e2b-compat.md"
JS_ROW = re.compile(r"^\| `([A-Za-z.]+)` \| `[A-Za-z_.]+` \| (served|not served) \|", re.MULTILINE)
PROPERTIES = {"Sandbox.git"}  # rows for what is an attribute in JS, not a method
RELEASES = {
    "latest": ("JS_SDK_INSTALL", "JAILBOX_JS_SDK"),
    "previous": ("JS_SDK_PREVIOUS_INSTALL", "JAILBOX_JS_SDK_PREVIOUS"),
}
"""Each release tested: ``.ci/run``'s variable that installs it, and the variable that may name another place."""


def ci_install(release: str) -> str:
    """``.ci/run``'s command that installs ``release`` (npm, ``--prefix`` a directory of the checkout)."""
    found = re.search(rf'^{RELEASES[release][0]}="(.*)"$', (ROOT / ".ci" / "run").read_text(), re.MULTILINE)
    return found.group(1) if found else ""


def packages(release: str) -> dict[str, str]:
    """Each package's name and the version of it tested in ``release``."""
    return dict(re.findall(r"\s(@?[\w./-]+)@([\d.]+)", ci_install(release)))


def sdk_dir(release: str) -> Path:
    prefix = re.search(r"--prefix (\S+)", ci_install(release))
    return Path(os.environ.get(RELEASES[release][1]) or ROOT / (prefix.group(1) if prefix else "")) / "node_modules"


def install_command(release: str) -> str:
    """The command that fills ``sdk_dir(release)``."""
    command, chosen = ci_install(release), os.environ.get(RELEASES[release][1])
    if chosen:
        return re.sub(r"--prefix \S+", f"--prefix {chosen}", command)
    return f"cd {ROOT} && {command}"


def need_js_sdk(release: str = "latest") -> Path:
    """Skip (strict: fail) unless node and both packages, at the versions ``release`` tests, are installed."""
    wanted = packages(release)
    assert set(wanted) == {"e2b", "@e2b/code-interpreter"}, f".ci/run no longer sets {RELEASES[release][0]}"
    require(shutil.which("node") is not None, "Node.js 20 or newer", "sudo apt-get install nodejs npm")
    modules = sdk_dir(release)
    for name, version in wanted.items():
        manifest = modules / name / "package.json"
        found = json.loads(manifest.read_text())["version"] if manifest.exists() else None
        require(
            found == version,
            f"npm's {name} {version} in {modules} (found: {found or 'none'})",
            install_command(release),
        )
    return modules


def serve(tmp: Path) -> Served:
    """A server with a state directory of its own: its jails' share of their user's inotify instances
    (``sandbox/limits/budget.py``, a ledger in the state directory) is not another server's, so its
    watches are inotify's, with RENAME, whatever other servers hold (a jail's share is given back only
    once its removal is done, which lags behind a kill)."""
    need_js_sdk()
    state = {"JAILBOX_STATE_DIR": str(tmp / "state")}
    return start_server(tmp, "--api-key-file", str(key_file(tmp, KEY_A, KEY_B)), env=state)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    served = serve(tmp_path_factory.mktemp("serve-js"))
    yield served
    served.stop()


def node(server: Served, tmp: Path, *scenarios: str, release: str = "latest") -> str:
    """Run ``scenarios`` of js_sdk.cjs in one Node process pointed at ``server``, with ``release`` of the
    packages; its asserts are the test. Returns what it printed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    env.update(
        NODE_PATH=str(need_js_sdk(release)),
        E2B_API_URL=server.url,
        E2B_SANDBOX_URL=server.url,
        E2B_API_KEY=KEY_A,
        JB_OTHER_KEY=KEY_B,
    )
    r = subprocess.run(
        ["node", str(SCENARIOS), *scenarios], cwd=tmp, env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stdout + r.stderr + "".join(server.log[-20:])
    done = [line.split()[1] for line in r.stdout.splitlines() if line.startswith("ok ")]
    assert done == list(scenarios), r.stdout
    assert "Traceback" not in "".join(server.log), "".join(server.log)
    return r.stdout


@pytest.mark.parametrize("release", RELEASES)
def test_sandboxes_and_branching(server: Served, tmp_path: Path, release: str) -> None:
    """Create, getInfo, list with metadata and state filters, connect, setTimeout, getMetrics, another
    key's view, kill; pause and resume, fork, snapshots."""
    node(server, tmp_path, "sandboxes", "branching", release=release)


@pytest.mark.slow
def test_sandboxes_made_at_once(tmp_path: Path) -> None:
    """16 sandboxes made at once over the SDK's shared connections, each running a command; on a server
    of its own, whose ledger their shares fill until their removals are done."""
    served = serve(tmp_path)
    try:
        node(served, tmp_path, "burst")
    finally:
        served.stop()


@pytest.mark.slow
@pytest.mark.needs("git")
@pytest.mark.parametrize("release", RELEASES)
def test_commands_and_pty(server: Served, tmp_path: Path, release: str) -> None:
    """run (output, callbacks, exit errors, cwd, user, envs, timeouts), background with stdin, list,
    connect, kill; git; a terminal typed into, connected to, resized and killed."""
    node(server, tmp_path, "commands", "pty", release=release)


@pytest.mark.slow
@pytest.mark.parametrize("release", RELEASES)
def test_files_and_watch(server: Served, tmp_path: Path, release: str) -> None:
    node(server, tmp_path, "files", release=release)


@pytest.mark.slow
@pytest.mark.parametrize("release", RELEASES)
def test_ports_signed_urls_network_and_what_is_not_served(server: Served, tmp_path: Path, release: str) -> None:
    node(server, tmp_path, "host", "network", "unserved", release=release)


@pytest.mark.slow
@pytest.mark.needs("kernel")
@pytest.mark.parametrize("release", RELEASES)
def test_code_interpreter(server: Served, tmp_path: Path, release: str) -> None:
    """runCode: variables kept, a matplotlib PNG, an exception's name, value and traceback, callbacks in
    order, per-run envs; contexts created, listed, restarted and removed."""
    node(server, tmp_path, "interpreter", release=release)


def test_the_compat_table_names_every_js_method(server: Served, tmp_path: Path) -> None:
    """docs/e2b-compat.md's JS table has a row for each public method the latest packages have, and no
    other; the previous release has none the table lacks."""
    rows = dict(JS_ROW.findall(TABLE.read_text()))
    for release in RELEASES:
        out = node(server, tmp_path, "methods", release=release)
        [line] = [line for line in out.splitlines() if line.startswith("methods ")]
        have = set(json.loads(line.removeprefix("methods "))) | PROPERTIES
        if release == "latest":
            assert set(rows) == have, (sorted(have - set(rows)), sorted(set(rows) - have))
        assert have <= set(rows), (release, sorted(have - set(rows)))
