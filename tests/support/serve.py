"""Driving ``jailbox serve`` from tests: a server on loopback as a subprocess, API keys, the unmodified
E2B SDK run in a fresh interpreter pointed at it by environment variables alone (the latest release,
the venv's, or the previous minor release of each SDK, installed apart), and raw API calls."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Generator
from pathlib import Path

from conftest import require

from support.cli import JAILBOX

KEY_A = "jbx_" + "a" * 40
KEY_B = "jbx_" + "b" * 40
ROOT = Path(__file__).resolve().parent.parent.parent
PREVIOUS_INSTALL = re.search(r'^PREVIOUS_SDK_INSTALL="(.*)"$', (ROOT / ".ci" / "run").read_text(), re.MULTILINE)
"""``.ci/run``'s command that installs the previous minor release of each SDK into ``.venv/sdk-previous``
(``pip install --target``, apart from the venv's latest; ``--no-deps``: their requirements are the
latest's, which the venv holds). Its pins are the one place that names those releases."""
PREVIOUS_DIR = Path(sys.prefix) / "sdk-previous"


def previous_sdk() -> dict[str, str]:
    """The previous releases' pins (``{"e2b": "2.61.0", ...}``) once they are installed where CI puts
    them; skip (or, strict, fail) naming the command that installs them."""
    assert PREVIOUS_INSTALL, ".ci/run no longer sets PREVIOUS_SDK_INSTALL"
    pins = dict(re.findall(r"'([a-z0-9-]+)==([0-9.]+)'", PREVIOUS_INSTALL.group(1)))
    assert set(pins) == {"e2b", "e2b-code-interpreter"}, PREVIOUS_INSTALL.group(1)
    fix = PREVIOUS_INSTALL.group(1).replace(".venv/bin/pip", f"{sys.executable} -m pip")
    fix = fix.replace(".venv/sdk-previous", str(PREVIOUS_DIR))
    present = all((PREVIOUS_DIR / f"{name.replace('-', '_')}-{v}.dist-info").is_dir() for name, v in pins.items())
    named = ", ".join(f"{n} {v}" for n, v in pins.items())
    require(present, f"the previous SDK releases ({named}) in {PREVIOUS_DIR}", fix)
    return pins


def need_sdk() -> None:
    """Skip (or, strict, fail) unless the e2b SDK is installed."""
    require(
        importlib.util.find_spec("e2b") is not None,
        "the e2b SDK (Python 3.11+)",
        "pip install -e '.[test]' with Python 3.11 or newer",
    )


class Served:
    def __init__(self, proc: subprocess.Popen[str], url: str, log: list[str], cwd: Path) -> None:
        self.proc, self.url, self.log, self.cwd = proc, url, log, cwd

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_server(tmp: Path, *args: str, env: dict[str, str] | None = None) -> Served:
    proc = subprocess.Popen(
        [*JAILBOX, "serve", "--port", "0", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=tmp,
    )
    assert proc.stderr is not None
    log: list[str] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        log.append(line)
        m = re.search(r"listening on (http://\S+)", line)
        if m:
            threading.Thread(target=lambda: log.extend(proc.stderr), daemon=True).start()  # type: ignore[arg-type]
            return Served(proc, m.group(1), log, tmp)
    proc.kill()
    raise AssertionError("jailbox serve did not start: " + "".join(log))


def serving(
    tmp: Path, *args: str, keys: tuple[str, ...] = (KEY_A, KEY_B), env: dict[str, str] | None = None
) -> Generator[Served, None, Served]:
    """A module's server (its fixture yields from this): ``keys`` in a key file in ``tmp``, stopped when
    the module is done; returns it, stopped, for what the fixture checks after."""
    served = start_server(tmp, "--api-key-file", str(key_file(tmp, *keys)), *args, env=env)
    try:
        yield served
    finally:
        served.stop()
    return served


def key_file(tmp: Path, *keys: str) -> Path:
    path = tmp / "keys"
    path.write_text("".join(k + "\n" for k in keys))
    path.chmod(0o600)
    return path


def sdk(server: Served, tmp: Path, code: str, key: str = KEY_A, release: str = "latest") -> str:
    """Run ``code`` with the SDK in a fresh interpreter pointed at ``server`` by environment variables
    alone (its asserts are the test); returns what it printed. ``release="previous"``: with the previous
    minor release of each SDK (``previous_sdk``) ahead of the venv's, checked to be the one imported."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    env.update(E2B_API_URL=server.url, E2B_SANDBOX_URL=server.url, E2B_HTTP_VERSION="1.1", E2B_API_KEY=key)
    code = textwrap.dedent(code)
    if release == "previous":
        pins = previous_sdk()
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PREVIOUS_DIR), env.get("PYTHONPATH")) if p)
        code = (
            "import importlib.metadata, e2b, e2b_code_interpreter\n"
            f"assert {{n: importlib.metadata.version(n) for n in {sorted(pins)!r}}} == {pins!r}\n"
            f"assert all(m.__file__.startswith({str(PREVIOUS_DIR) + os.sep!r}) for m in (e2b, e2b_code_interpreter))\n"
        ) + code
    else:
        assert release == "latest", release
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def api(server: Served, method: str, path: str, key: str | None, body: object = None) -> tuple[int, object]:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["X-API-Key"] = key
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(server.url + path, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        return exc.code, json.loads(raw) if raw else None
