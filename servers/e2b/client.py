"""``jailbox ps --server URL`` and ``jailbox stop --server URL``: list and kill a running server's sandboxes.

Runs in the CLI's host process. It makes the E2B control-plane calls the SDK makes (list, kill) with
the standard library's HTTP client, so it works against ``jailbox serve`` and anything else that
speaks that API. The server is a network peer: every reply is read up to ``MAX_REPLY`` bytes, at most
``MAX_PAGES`` pages are followed, and what it names is escaped as it is read (``escapes.printable``).
The API key is sent only where the user pointed it: the key file a local server made is used by
default only for a loopback URL.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import os
import re
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import click

from ...sandbox import printable
from ...sandbox.errors import ServerError
from .. import keys

MAX_REPLY = 16 << 20
PAGE = 100
MAX_PAGES = 1000
TIMEOUT = 30.0
SANDBOX_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # what the control plane routes (and the SDK makes)
MAX_NAME = 128
EXAMPLE = "--server http://127.0.0.1:49982"


class ClientError(ServerError):
    """A one-line error for the user that starts with the flag at fault; ``code`` is the exit status
    (2 for a malformed flag, as click's usage errors; 1 for what the server or the key file said)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Listed:
    """One sandbox as the server described it."""

    id: str
    template: str
    created: float
    expires: float | None
    metadata: dict[str, str] = field(default_factory=dict)

    def as_json(self) -> dict[str, object]:
        """The keys ``jailbox ps --json`` has for the local service's sandboxes, then the server's own."""
        return {
            "id": self.id,
            "name": None,
            "rootfs": self.template,
            "created": self.created,
            "state": "running",
            "expires": self.expires,
            "metadata": self.metadata,
        }


def server_url(value: str) -> str:
    """``value`` as a base URL (scheme, host, optional port), or a ClientError naming ``--server``."""
    try:
        parts = urllib.parse.urlsplit(value)
        parts.port  # noqa: B018 - a port that is not a number raises here
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
        raise ClientError(f"--server {value!r}: expected http(s)://HOST[:PORT], e.g. {EXAMPLE}", 2)
    if parts.query or parts.fragment or parts.username or parts.password:
        raise ClientError(f"--server {value!r}: a base URL only (no query, fragment or credentials), e.g. {EXAMPLE}", 2)
    return f"{parts.scheme}://{parts.netloc}"


def _loopback(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def api_key(url: str, key_file: Path | None) -> str:
    """The key to send: ``--api-key-file``'s first key, else ``$E2B_API_KEY``, else (for a loopback server
    only) the first key of the file ``jailbox serve`` makes by default."""
    if key_file is not None:
        return _first_key(key_file)
    env = os.environ.get("E2B_API_KEY")
    if env:
        if not re.fullmatch(r"[\x21-\x7e]{1,4096}", env):  # it goes into a header line as it is
            raise ClientError("E2B_API_KEY: a key is printable ASCII without spaces, e.g. the line jailbox serve made")
        return env
    default = keys.default_path(keys.SERVE_KEYS)
    if _loopback(url) and default.exists():
        return _first_key(default)
    where = f" ({default} is used only for a loopback --server)" if not _loopback(url) else ""
    raise ClientError(
        f"--api-key-file: no API key for {url}{where}; give the server's key file, e.g. "
        f"--api-key-file ~/.config/jailbox/serve-api-keys, or set E2B_API_KEY"
    )


def _first_key(path: Path) -> str:
    try:
        return keys.load(path)[0]
    except keys.KeyFileError as exc:
        raise ClientError(str(exc)) from None


def _text(value: object, fallback: str = "?") -> str:
    """What the server named, if it is a short string, escaped as one line (a terminal must not receive
    escape sequences from a peer, nor a consumer of ``--json`` that prints it); ``fallback`` for anything else."""
    return printable(value, line=True) if isinstance(value, str) and 0 < len(value) <= MAX_NAME else fallback


def _when(value: object) -> float | None:
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _listed(item: object) -> Listed | None:
    """A sandbox from a list reply, or None for an entry that is not one (skipped, not trusted)."""
    if not isinstance(item, dict) or not isinstance(item.get("sandboxID"), str):
        return None
    if not SANDBOX_ID.match(item["sandboxID"]):
        return None
    raw = item.get("metadata")
    metadata = (
        {_text(k): _text(v, "") for k, v in list(raw.items())[:64] if isinstance(k, str) and isinstance(v, str)}
        if isinstance(raw, dict)
        else {}
    )
    return Listed(
        id=item["sandboxID"],
        template=_text(item.get("templateID")),
        created=_when(item.get("startedAt")) or 0.0,
        expires=_when(item.get("endAt")),
        metadata=metadata,
    )


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is answered as the 3xx it is: following it would carry the key to wherever it points."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


class Client:
    """The control plane of the server at ``url``, as the holder of ``key``."""

    def __init__(self, url: str, key: str, timeout: float = TIMEOUT) -> None:
        self.url = url
        self.key = key
        self.timeout = timeout
        handlers: list[urllib.request.BaseHandler] = [_NoRedirect()]
        if _loopback(url):  # a proxy from the environment has no business with a server on this machine
            handlers.append(urllib.request.ProxyHandler({}))
        self.opener = urllib.request.build_opener(*handlers)

    def _call(self, method: str, path: str) -> tuple[int, dict[str, str], bytes]:
        request = urllib.request.Request(self.url + path, method=method, headers={"X-API-Key": self.key})
        try:
            with self.opener.open(request, timeout=self.timeout) as reply:
                return reply.status, dict(reply.headers.items()), self._read(reply)
        except urllib.error.HTTPError as exc:
            with exc:
                body = self._read(exc)
            return exc.code, dict(exc.headers.items()), body
        except TimeoutError:
            raise ClientError(f"--server {self.url}: no answer within {self.timeout:g} s") from None
        except urllib.error.URLError as exc:
            raise ClientError(self._unreachable(exc.reason)) from None
        except (OSError, ValueError, http.client.HTTPException) as exc:  # a reset connection, a malformed status line
            raise ClientError(f"--server {self.url}: {exc} (is it a jailbox serve URL? e.g. {EXAMPLE})") from None

    def _unreachable(self, reason: object) -> str:
        if isinstance(reason, ConnectionRefusedError):
            port = urllib.parse.urlsplit(self.url).port
            hint = f"jailbox serve --port {port}" if port else "jailbox serve"
            return f"--server {self.url}: nothing is listening there (start one: {hint})"
        if isinstance(reason, (TimeoutError, socket.timeout)):
            return f"--server {self.url}: no answer within {self.timeout:g} s"
        if isinstance(reason, socket.gaierror):
            return f"--server {self.url}: unknown host ({reason.strerror}), e.g. {EXAMPLE}"
        return f"--server {self.url}: cannot connect ({reason})"

    def _read(self, reply: http.client.HTTPResponse | urllib.error.HTTPError) -> bytes:
        data = reply.read(MAX_REPLY + 1)
        if len(data) > MAX_REPLY:
            raise ClientError(f"--server {self.url}: a reply over {MAX_REPLY} bytes (is it a jailbox serve URL?)")
        return data

    def _refused(self, status: int, body: bytes, what: str) -> ClientError:
        if status == 401:
            return ClientError(
                f"--api-key-file: {self.url} refused the API key (401); give the key the server was started "
                "with, e.g. --api-key-file ~/.config/jailbox/serve-api-keys, or set E2B_API_KEY"
            )
        try:
            message = _text(json.loads(body).get("message"), "")
        except (ValueError, AttributeError, RecursionError):
            message = ""
        detail = f": {message}" if message else ""
        if status == 404 and what == "list":
            detail = f" (is it a jailbox serve URL? e.g. {EXAMPLE})"
        return ClientError(f"--server {self.url}: {what} answered {status}{detail}")

    def list(self) -> list[Listed]:
        """Every sandbox of this key, page by page."""
        found: list[Listed] = []
        token: str | None = None
        for _ in range(MAX_PAGES):
            query = {"limit": str(PAGE), **({"nextToken": token} if token else {})}
            status, headers, body = self._call("GET", "/v2/sandboxes?" + urllib.parse.urlencode(query))
            if status != 200:
                raise self._refused(status, body, "list")
            try:
                items = json.loads(body)
            except (ValueError, RecursionError):
                items = None
            if not isinstance(items, list):
                raise ClientError(f"--server {self.url}: the reply is not a JSON list (is it a jailbox serve URL?)")
            found += [s for s in map(_listed, items) if s is not None]
            token = {k.lower(): v for k, v in headers.items()}.get("x-next-token")
            if not token or not items:
                return found
        raise ClientError(f"--server {self.url}: more than {MAX_PAGES} pages of sandboxes")

    def kill(self, sandbox_id: str) -> bool:
        """Kill one sandbox: True, or False if this key has none of that id (any more)."""
        status, _, body = self._call("DELETE", f"/sandboxes/{urllib.parse.quote(sandbox_id, safe='')}")
        if status in (200, 204):
            return True
        if status == 404:
            return False
        raise self._refused(status, body, f"kill {sandbox_id}")


def connect(server: str, key_file: str | None) -> Client:
    url = server_url(server)
    return Client(url, api_key(url, Path(key_file) if key_file is not None else None))


def ps(server: str, key_file: str | None, as_json: bool) -> None:
    """Print the server's sandboxes of this key: the local ``ps`` columns, then when each expires."""
    boxes = sorted(connect(server, key_file).list(), key=lambda s: (s.created, s.id))
    if as_json:
        click.echo(json.dumps([b.as_json() for b in boxes], indent=2))
        return
    click.echo(f"{'ID':22}  {'NAME':20}  {'ROOTFS':24}  {'CREATED':19}  {'STATE':7}  EXPIRES")
    for b in boxes:
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(b.created))
        expires = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(b.expires)) if b.expires is not None else "-"
        click.echo(f"{b.id:22}  {'-':20}  {b.template:24}  {created:19}  {'running':7}  {expires}")


def _resolve(refs: tuple[str, ...], boxes: list[Listed], url: str) -> list[str]:
    """Each ref as a sandbox id: an id, or a unique prefix of one (as ``jailbox stop`` takes them)."""
    ids = [b.id for b in boxes]
    chosen: list[str] = []
    for ref in refs:
        matches = [ref] if ref in ids else [i for i in ids if i.startswith(ref)]
        shown = _text(ref, "(not an id)")
        if not matches:
            raise ClientError(f"--server {url}: no sandbox {shown} for this key; jailbox ps --server {url} lists them")
        if len(matches) > 1:
            raise ClientError(f"--server {url}: {shown} is a prefix of {len(matches)} sandboxes; give more of the id")
        chosen += [m for m in matches if m not in chosen]
    return chosen


def stop(server: str, key_file: str | None, refs: tuple[str, ...], stop_all: bool) -> None:
    """Kill the named sandboxes (or all of this key's) on the server and print each id killed. Every
    ref is checked before any is killed, so a typo kills nothing."""
    client = connect(server, key_file)
    boxes = client.list()
    chosen = [b.id for b in boxes] if stop_all else _resolve(refs, boxes, client.url)
    for sandbox_id in chosen:
        if client.kill(sandbox_id):  # one that expired meanwhile is gone already: nothing to print
            click.echo(sandbox_id)
