"""The sandboxes a ``jailbox serve`` holds: who owns each, when each expires, and the server's limits.

Runs in the serving host process. A sandbox belongs to the API key that made it and is invisible to
every other key (it answers as not found). Each has a deadline; a reaper thread closes it at the
deadline, whatever its commands are doing, which frees its jail, cgroup and disk. Slots are counted
before a jail is built, so concurrent creates cannot pass the limits.
"""

from __future__ import annotations

import hmac
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from ...sandbox import Limits, Sandbox, SandboxPool
from ...sandbox.errors import SandboxError
from ...sandbox.serving import Store, check_env
from .fs import Watchers
from .processes import ProcessTable

TEMPLATE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:+-]{0,127}$")
MAX_METADATA = 64
MAX_ENV = 256
MAX_TEXT = 4096
MAX_POOLS = 4
SDK_DEFAULT = "base"


class ServeError(Exception):
    """A control-plane request that cannot be met: ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Served:
    id: str
    owner: str
    template: str
    metadata: dict[str, str]
    access_token: str
    sandbox: Sandbox
    started: datetime
    deadline: float  # time.monotonic() at which the reaper closes it
    procs: ProcessTable
    watchers: Watchers = field(default_factory=Watchers)

    @property
    def end_at(self) -> datetime:
        return datetime.now(timezone.utc).replace(microsecond=0) + timedelta(
            seconds=max(0.0, self.deadline - time.monotonic())
        )


def _strings(value: object, what: str, limit: int) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > limit:
        raise ServeError(400, f'{what} must be an object of at most {limit} strings, e.g. {{"team": "a"}}')
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str) or len(k) > MAX_TEXT or len(v) > MAX_TEXT:
            raise ServeError(400, f"{what} keys and values must be strings of at most {MAX_TEXT} characters")
    return dict(value)


class Registry:
    """Every served sandbox, with the limits: ``max_total`` in all, ``max_per_key`` per key; ``warm``
    jails kept ready for each template in use (0: none), which do not count against the limits. Each
    sandbox is bounded by ``bounds`` (``jailbox serve``'s flags: the E2B API has no way to ask)."""

    def __init__(
        self, max_total: int, max_per_key: int, default_timeout: int, max_timeout: int, warm: int, bounds: Limits
    ) -> None:
        self.max_total = max_total
        self.bounds = bounds
        self.warm = warm
        self.pools: dict[str, SandboxPool] = {}
        self.max_per_key = max_per_key
        self.default_timeout = default_timeout
        self.max_timeout = max_timeout
        self.lock = threading.Condition()
        self.served: dict[str, Served] = {}
        self.reserved: dict[str, int] = {}
        self.closed = False
        self.reaper = threading.Thread(target=self._reap, name="jailbox-serve-reaper", daemon=True)
        self.reaper.start()

    def _timeout(self, value: object) -> int:
        if value is None:
            return self.default_timeout
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= self.max_timeout:
            raise ServeError(400, f"timeout must be whole seconds in 1..{self.max_timeout}, e.g. 300")
        return value

    def create(self, owner: str, body: dict) -> Served:
        template = body.get("templateID")
        if not isinstance(template, str) or not TEMPLATE_NAME.match(template):
            raise ServeError(
                400, "templateID must name a stored root filesystem or 'host' (e.g. 'default'), not a path"
            )
        if template == SDK_DEFAULT:  # what the SDK asks for when its caller names no template
            template = "default" if Store().resolve("default") is not None else "host"
        if template != "host" and Store().resolve(template) is None:
            # a name the store lacks would be tried as a directory relative to the server's cwd
            raise ServeError(
                400, f"templateID {template!r} is not a stored root filesystem (jailbox rootfs list; or use 'host')"
            )
        timeout = self._timeout(body.get("timeout"))
        metadata = _strings(body.get("metadata"), "metadata", MAX_METADATA)
        envs = _strings(body.get("envVars"), "envVars", MAX_ENV)
        try:
            check_env(envs)
        except ValueError as exc:
            raise ServeError(400, f'envVars: {exc} (e.g. {{"DEBUG": "1"}})') from None
        with self.lock:
            if self.closed:
                raise ServeError(503, "the server is shutting down")
            mine = sum(1 for s in self.served.values() if s.owner == owner) + self.reserved.get(owner, 0)
            total = len(self.served) + sum(self.reserved.values())
            if total >= self.max_total:
                raise ServeError(429, f"the server holds its maximum of {self.max_total} sandboxes (--max-sandboxes)")
            if mine >= self.max_per_key:
                raise ServeError(429, f"this API key holds its maximum of {self.max_per_key} sandboxes (--max-per-key)")
            self.reserved[owner] = self.reserved.get(owner, 0) + 1
        try:
            try:
                sandbox = self._sandbox(template)
            except (SandboxError, ValueError) as exc:
                raise ServeError(400, f"cannot create a sandbox from template {template!r}: {exc}") from None
            served = Served(
                id="jb" + secrets.token_hex(10),
                owner=owner,
                template=template,
                metadata=metadata,
                access_token=secrets.token_urlsafe(32),
                sandbox=sandbox,
                started=datetime.now(timezone.utc),
                deadline=time.monotonic() + timeout,
                procs=ProcessTable(sandbox, envs),
            )
            with self.lock:
                self.served[served.id] = served
                self.lock.notify_all()
            return served
        finally:
            with self.lock:
                self.reserved[owner] -= 1
                if not self.reserved[owner]:
                    del self.reserved[owner]

    def _sandbox(self, template: str) -> Sandbox:
        """A jail of ``template``: from its warm pool if it has one. A template gets a pool (up to
        ``MAX_POOLS`` of them) once a sandbox of it has been built, so a name that builds nothing
        never holds jails."""
        with self.lock:
            pool = self.pools.get(template)
        if pool is not None:
            return pool.acquire()
        sandbox = Sandbox(rootfs=template, limits=self.bounds)
        if self.warm:
            with self.lock:
                if template not in self.pools and len(self.pools) < MAX_POOLS and not self.closed:
                    self.pools[template] = SandboxPool(self.warm, rootfs=template, limits=self.bounds)
        return sandbox

    def get(self, owner: str, sandbox_id: str) -> Served:
        with self.lock:
            served = self.served.get(sandbox_id)
        if served is None or served.owner != owner:
            raise ServeError(404, f"sandbox {sandbox_id} was not found")
        return served

    def by_token(self, sandbox_id: str, token: str | None) -> Served | None:
        """The sandbox an envd request names, if its access token matches."""
        with self.lock:
            served = self.served.get(sandbox_id)
        if served is None or token is None or not hmac.compare_digest(served.access_token.encode(), token.encode()):
            return None
        return served

    def list(self, owner: str) -> list[Served]:
        with self.lock:
            return [s for s in self.served.values() if s.owner == owner]

    def set_timeout(self, owner: str, sandbox_id: str, value: object, extend_only: bool = False) -> Served:
        timeout = self._timeout(value)
        served = self.get(owner, sandbox_id)
        with self.lock:
            deadline = time.monotonic() + timeout
            served.deadline = max(served.deadline, deadline) if extend_only else deadline
            self.lock.notify_all()
        return served

    def kill(self, owner: str, sandbox_id: str) -> None:
        served = self.get(owner, sandbox_id)
        self._close(served)

    def _close(self, served: Served) -> None:
        with self.lock:
            if self.served.get(served.id) is not served:
                return
            del self.served[served.id]
        try:
            served.procs.kill_all()
        finally:  # closing the jail kills whatever is left in it
            served.sandbox.close()

    def _reap(self) -> None:
        while True:
            with self.lock:
                if self.closed:
                    return
                now = time.monotonic()
                due = [s for s in self.served.values() if s.deadline <= now]
                if not due:
                    nxt = min((s.deadline for s in self.served.values()), default=now + 60)
                    self.lock.wait(max(0.05, nxt - now))
                    continue
            for served in due:
                try:
                    self._close(served)
                except Exception:  # one sandbox that fails to close must not stop the others' expiry
                    pass

    def close(self) -> None:
        with self.lock:
            self.closed = True
            everyone = list(self.served.values())
            self.lock.notify_all()
        for served in everyone:
            try:
                self._close(served)
            except Exception:  # one that fails to close must not keep the others open
                pass
        for pool in self.pools.values():
            pool.close()
