"""The E2B control plane over HTTP: create, list, get, kill, set the timeout of, connect to (resuming),
pause, fork and snapshot sandboxes; list and delete snapshots.

Runs in the serving host process, on a request's thread. Every request needs an API key
(``X-API-Key``); a missing or unknown one is 401 before anything else is looked at, and a sandbox of
another key answers 404 like one that never existed. A request that carries a sandbox id header (or
the ``<port>-<id>.<domain>`` host the SDK builds without ``E2B_SANDBOX_URL``) goes to the sandbox's own
daemon protocol instead (``envd``), which is authorised by that sandbox's access token, or, for port
49999, to its code interpreter (``interpreter``), authorised by that token or its traffic access token.
So does a ``/files`` request with no token but a signature (``download_url``, ``upload_url``: the
sandbox whose token signed it). A host naming any other port (``get_host``) is a sandbox's own port:
the HTTP server hands such a connection to the relay (``ports``) before its body is read, and what
reaches this plane of one is the refusal (no such sandbox, or no traffic token for a private one).
The domain reported at create is ``localhost:<the server's port>``.
"""

from __future__ import annotations

import json
import re
import time
import urllib.parse
from datetime import datetime
from email.message import Message

from ...sandbox.errors import SandboxError
from ..keys import Keys
from . import envd, interpreter, network, ports
from .httpd import Request, Response
from .registry import Kept, Registry, Served, ServeError

CLIENT_ID = "jailbox"
SANDBOX_PATH = re.compile(r"^/(?:v2/)?sandboxes/([A-Za-z0-9_-]{1,64})(/[a-z]+)?$")
ENVD_HOST = re.compile(r"^\d{1,5}-([a-z0-9]{1,64})\.")
MAX_LIST = 1000
NOT_SERVED = {  # why a sandbox's call is answered 501: what the SDK's exception then says
    "/logs": "logs are not kept: a command's output goes to its caller",
}
NOT_SERVED_AT_CREATE = {  # a create's field that asks for what jailbox does not do: refused, never dropped quietly
    "volumeMounts": "volumes are not served by jailbox (mount nothing, or copy files in with files.write)",
    "iam": "IAM tokens are not served by jailbox",
}
MAX_SNAPSHOT_PAGE = 100
"""Snapshots one list page holds at most (E2B's own cap)."""
MAX_REF = 256
"""Characters of a snapshot id or name in a path or query, checked before it is looked up."""
MAX_JSON = 1 << 20
METRICS_INTERVAL = 5
"""Seconds between two of E2B's metric samples: a window ending this recently still holds the latest."""


def _json(status: int, obj: object, headers: dict[str, str] | None = None) -> Response:
    return Response(status, json.dumps(obj).encode(), "application/json", headers or {})


def error(status: int, message: str) -> Response:
    return _json(status, {"code": status, "message": message})


def _time(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def created(served: Served, domain: str | None = None) -> dict:
    """A sandbox as create, connect and fork answer it; ``domain`` is what ``get_host`` names hosts under."""
    return ({"domain": domain} if domain else {}) | {
        "templateID": served.template,
        "sandboxID": served.id,
        "clientID": CLIENT_ID,
        "envdVersion": envd.ENVD_VERSION,
        "envdAccessToken": served.access_token,
        "trafficAccessToken": interpreter.traffic_token(served),
        "alias": served.template,
    }


def detail(served: Served) -> dict:
    """``GET /sandboxes/{id}`` and a list's entries: ``state`` paused or running, and how it was paused
    (``pauseMode``: full, its processes kept, or filesystem)."""
    extra: dict[str, object] = {"pauseMode": served.pause_mode} if served.paused else {}
    return extra | {
        "templateID": served.template,
        "alias": served.template,
        "sandboxID": served.id,
        "clientID": CLIENT_ID,
        "startedAt": _time(served.started),
        "endAt": _time(served.end_at),
        "envdVersion": envd.ENVD_VERSION,
        "cpuCount": int(served.sandbox.config.limits.cpus or 1),
        "memoryMB": (served.sandbox.config.limits.memory or 0) >> 20,
        "diskSizeMB": (served.sandbox.config.limits.disk or 0) >> 20,
        "state": "paused" if served.paused else "running",
        "metadata": served.metadata,
        "lifecycle": {"autoResume": served.auto_resume, "onTimeout": "pause" if served.auto_pause else "kill"},
    }


def _sandbox_id(headers: Message) -> str | None:
    """The sandbox a request names for its daemon (header, or the host the SDK builds), or None."""
    sandbox_id = headers.get("E2b-Sandbox-Id")
    if sandbox_id is None:
        host = ENVD_HOST.match(headers.get("Host") or "")
        sandbox_id = host.group(1) if host else None
    return sandbox_id


class ControlPlane:
    """The application ``jailbox serve`` hands its HTTP server: routes each request to a plane."""

    def __init__(self, keys: Keys, registry: Registry) -> None:
        self.keys = keys
        self.registry = registry
        self.domain: str | None = None
        """What the SDK's ``get_host`` names a sandbox's ports under (``localhost:PORT``): set once bound."""

    def __call__(self, request: Request) -> Response:
        port = ports.addressed(request.headers)
        if port is not None:  # not taken over by the relay: no such sandbox, or its token missing
            return error(502, ports.NOT_FOUND.format(port[1]))
        sandbox_id = _sandbox_id(request.headers)
        if sandbox_id is None and envd.signed(request.path, request.query):
            return envd.handle(self.registry, None, request)
        if sandbox_id is not None:
            if interpreter.addressed(request.headers):
                return interpreter.handle(self.registry, sandbox_id, request)
            return envd.handle(self.registry, sandbox_id, request)
        owner = self.keys.owner(request.header("X-API-Key"))
        if owner is None:
            return error(401, "missing or invalid API key: send it as the X-API-Key header (E2B_API_KEY)")
        try:
            return self._route(owner, request)
        except ServeError as exc:
            return error(exc.status, exc.message)

    def tenant(self, headers: Message, method: str, target: str) -> str | None:
        """The key a request's headers, ``method`` and ``target`` (path and query) prove, as its owner:
        the API key's; for a sandbox's daemon, the owner of the sandbox whose token it carries or whose
        token signed its ``/files`` URL; for a sandbox's port, the owner of a sandbox that takes it. The
        HTTP server asks before it reads a body; the planes check the same again when they handle it."""
        port = ports.addressed(headers)
        if port is not None:
            served = ports.admitted(self.registry, port[1], headers)
            return served.owner if served is not None else None
        sandbox_id = _sandbox_id(headers)
        url = urllib.parse.urlsplit(target)
        try:
            query = urllib.parse.parse_qs(url.query, max_num_fields=64)
        except ValueError:
            query = {}
        if headers.get("X-Access-Token") is None and envd.signed(url.path, query):
            request = Request(method, url.path, query, headers, b"")
            opened = envd.by_signature(self.registry, sandbox_id, request)
            return None if isinstance(opened, str) else opened.owner
        if sandbox_id is not None:
            if interpreter.addressed(headers):
                served = interpreter.find(self.registry, sandbox_id, headers)
            else:
                served = self.registry.by_token(sandbox_id, headers.get("X-Access-Token"))
            return served.owner if served is not None else None
        return self.keys.owner(headers.get("X-API-Key"))

    def _body(self, request: Request) -> dict:
        if not request.body:
            return {}
        if len(request.body) > MAX_JSON:
            raise ServeError(413, f"a control-plane request body is at most {MAX_JSON} bytes")
        try:
            body = json.loads(request.body)
        except (ValueError, RecursionError):
            raise ServeError(400, 'the request body must be JSON, e.g. {"templateID": "default"}') from None
        if not isinstance(body, dict):
            raise ServeError(400, 'the request body must be a JSON object, e.g. {"templateID": "default"}')
        return body

    def _route(self, owner: str, request: Request) -> Response:
        method, path = request.method, request.path
        if path == "/snapshots" and method == "GET":
            return self._snapshots(owner, request)
        if path.startswith("/templates/") and method == "DELETE":
            try:
                ref = urllib.parse.unquote(path[len("/templates/") :], errors="strict")
            except UnicodeDecodeError:
                ref = ""
            if not ref or len(ref) > MAX_REF or "\0" in ref:
                raise ServeError(400, f"the snapshot id must be 1 to {MAX_REF} characters, e.g. snap-0123456789ab")
            self.registry.delete_snapshot(owner, ref)
            return Response(204)
        if path in ("/sandboxes", "/v2/sandboxes"):
            if method == "POST":
                body = self._body(request)
                for name, why in NOT_SERVED_AT_CREATE.items():
                    if body.get(name) not in (None, [], {}):
                        raise ServeError(400, f"{name}: {why}")
                wanted = network.from_create(body)
                made = None if wanted.empty else network.policy(wanted, self.registry.shape["network"])
                ask = None if wanted.empty else wanted.record()
                public, mask = ports.ingress(body)
                body, coded = interpreter.template(body)
                served = self.registry.create(owner, body, made, ask, coded)
                served.public_traffic, served.mask_host = public, mask
                return _json(201, created(served, self.domain))
            if method == "GET":
                return self._list(owner, request)
        m = SANDBOX_PATH.match(path)
        if m is None:
            return error(404, f"{method} {path} is not served by jailbox")
        sandbox_id, action = m.group(1), m.group(2)
        if action is None and method == "GET":
            return _json(200, detail(self.registry.get(owner, sandbox_id)))
        if action is None and method == "DELETE":
            self.registry.kill(owner, sandbox_id)
            return Response(204)
        if action == "/network" and method == "PUT":
            wanted = network.from_update(self._body(request))
            served = self.registry.get(owner, sandbox_id)
            made = network.policy(wanted, self.registry.shape["network"], served.sandbox.config.network.mode)
            self.registry.set_network(owner, sandbox_id, made, wanted.record())
            return Response(204)
        if action == "/metrics" and method == "GET":
            return _json(200, _metrics(self.registry.get(owner, sandbox_id), request))
        if action == "/timeout" and method == "POST":
            self.registry.set_timeout(owner, sandbox_id, self._body(request).get("timeout"))
            return Response(204)
        if action == "/refreshes" and method == "POST":
            self.registry.set_timeout(owner, sandbox_id, self._body(request).get("duration"), extend_only=True)
            return Response(204)
        if action in ("/connect", "/resume") and method == "POST":
            body = self._body(request)
            _flag(body, "memory", None, "")
            served, resumed = self.registry.connect(owner, sandbox_id, body.get("timeout"), body.get("memory") is False)
            return _json(201 if resumed else 200, created(served, self.domain))
        if action == "/pause" and method == "POST":
            body = self._body(request)
            _flag(body, "memory", None, "")
            _flag(body, "requireHealthyGuest", None, "")
            if self.registry.pause(owner, sandbox_id, body.get("memory") is not False):
                return Response(204)
            return error(409, f"sandbox {sandbox_id} is already paused")
        if action == "/snapshots" and method == "POST":
            body = self._body(request)
            _flag(body, "memory", False, "a snapshot keeps the filesystem, not processes (mode='filesystem')")
            kept = self.registry.snapshot(owner, sandbox_id, body.get("name"))
            return _json(201, _snapshot_info(kept))
        if action == "/fork" and method == "POST":
            body = self._body(request)
            children = self.registry.fork(owner, sandbox_id, body.get("count"), body.get("timeout"))
            source = self.registry.get(owner, sandbox_id)
            for child in children:
                if not isinstance(child, ServeError):  # as reachable as its source, no more
                    child.public_traffic, child.mask_host = source.public_traffic, source.mask_host
            return _json(
                201,
                [
                    {"error": {"code": c.status, "message": c.message}}
                    if isinstance(c, ServeError)
                    else {"sandbox": created(c, self.domain)}
                    for c in children
                ],
            )
        self.registry.get(owner, sandbox_id)  # another key's sandbox stays not found
        return error(
            501, f"{method} {path} is not served by jailbox ({NOT_SERVED.get(action or '', 'see docs/e2b-compat.md')})"
        )

    def _snapshots(self, owner: str, request: Request) -> Response:
        """``GET /snapshots``: the key's snapshots, newest first, by ``sandboxID`` and ``name``, paged."""
        sandbox_id, name = request.arg("sandboxID"), request.arg("name")
        for field, value in (("sandboxID", sandbox_id), ("name", name)):
            if value is not None and not 1 <= len(value) <= MAX_REF:
                raise ServeError(400, f"{field} must be 1 to {MAX_REF} characters, e.g. {field}=jb0123")
        try:
            limit = int(request.arg("limit") or MAX_SNAPSHOT_PAGE)
            start = int(request.arg("nextToken") or 0)
        except ValueError:
            raise ServeError(400, "limit and nextToken must be whole numbers, e.g. limit=100") from None
        if not 1 <= limit <= MAX_SNAPSHOT_PAGE or start < 0:
            raise ServeError(
                400, f"limit must be 1..{MAX_SNAPSHOT_PAGE} and nextToken what a page gave, e.g. limit=100"
            )
        kept = [
            k
            for k in self.registry.snapshots(owner)
            if (sandbox_id is None or k.sandbox_id == sandbox_id) and (name is None or name in (k.id, k.name))
        ]
        page = kept[start : start + limit]
        headers = {"x-next-token": str(start + limit)} if start + limit < len(kept) else {}
        return _json(200, [_snapshot_info(k) for k in page], headers)

    def _list(self, owner: str, request: Request) -> Response:
        wanted: dict[str, str] = {}
        if request.arg("metadata"):
            wanted = dict(urllib.parse.parse_qsl(request.arg("metadata") or "", max_num_fields=64))
        states = set((request.arg("state") or "running,paused").split(","))
        if not states <= {"running", "paused"}:
            raise ServeError(400, "state must be running, paused or both, e.g. state=running,paused")
        order = request.arg("order") or "desc"
        if order not in ("asc", "desc"):
            raise ServeError(400, "order must be asc or desc (by start time), e.g. order=desc")
        after = None
        if request.arg("startedAfter"):
            try:
                after = datetime.fromisoformat(request.arg("startedAfter") or "")
            except ValueError:
                raise ServeError(400, "startedAfter must be an ISO 8601 time, e.g. 2026-01-31T12:00:00Z") from None
            if after.tzinfo is None:
                raise ServeError(400, "startedAfter must name its time zone, e.g. 2026-01-31T12:00:00Z")
        template = request.arg("template")
        everyone = sorted(self.registry.list(owner), key=lambda s: (s.started, s.id), reverse=order == "desc")
        everyone = [
            s
            for s in everyone
            if ("paused" if s.paused else "running") in states
            and (after is None or s.started >= after)
            and (template is None or s.template == template)
        ]
        everyone = [s for s in everyone if all(s.metadata.get(k) == v for k, v in wanted.items())]
        try:
            limit = min(MAX_LIST, max(1, int(request.arg("limit") or 100)))
            start = int(request.arg("nextToken") or 0)
        except ValueError:
            raise ServeError(400, "limit and nextToken must be whole numbers, e.g. limit=100") from None
        page = everyone[start : start + limit]
        headers = {"x-next-token": str(start + limit)} if start + limit < len(everyone) else {}
        return _json(200, [detail(s) for s in page], headers)


def _flag(body: dict, name: str, only: bool | None, why: str) -> None:
    """A boolean field of a request: absent, or a bool (equal to ``only`` when that is given)."""
    value = body.get(name)
    if value is None:
        return
    if not isinstance(value, bool):
        raise ServeError(400, f'{name} must be true or false, e.g. {{"{name}": true}}')
    if only is not None and value != only:
        raise ServeError(400, f"{name}: {value} is not served by jailbox: {why}")


def _metrics(served: Served, request: Request) -> list[dict]:
    """``GET /sandboxes/{id}/metrics``: the sandbox's use now (``Sandbox.usage()``) as E2B's one
    sample, if the ``start``..``end`` window (Unix seconds) holds now; no history is kept."""
    window = []
    for name in ("start", "end"):
        value = request.arg(name)
        if value is not None and not re.fullmatch(r"-?[0-9]{1,12}", value):
            raise ServeError(400, f"{name} must be Unix seconds, e.g. {name}=1767225600")
        window.append(None if value is None else int(value))
    now = time.time()
    start, end = window
    if (start is not None and start > now) or (end is not None and end < now - METRICS_INTERVAL):
        return []
    try:
        used = served.sandbox.usage()
    except SandboxError:  # killed meanwhile
        raise ServeError(404, f"sandbox {served.id} was not found") from None
    return [
        {
            "timestamp": _time(used.timestamp),
            "timestampUnix": int(used.timestamp.timestamp()),
            "cpuCount": used.cpu_count,
            "cpuUsedPct": used.cpu_used_pct,
            "memUsed": used.memory_used,
            "memTotal": used.memory_total,
            "memCache": used.memory_cache,
            "diskUsed": used.disk_used or 0,
            "diskTotal": used.disk_total or 0,
        }
    ]


def _snapshot_info(kept: Kept) -> dict:
    return {"snapshotID": kept.id, "names": [kept.name] if kept.name else []}
