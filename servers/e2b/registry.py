"""The sandboxes a ``jailbox serve`` holds: who owns each, when each expires, and the server's limits.

Runs in the serving host process. A sandbox belongs to the API key that made it and is invisible to
every other key (it answers as not found). Each has a deadline; a reaper thread closes it at the
deadline, whatever its commands are doing, which frees its jail, cgroup and disk, or pauses it if it
was made with ``autoPause``. A paused sandbox keeps its processes, memory and files while the server
lives, or, paused in filesystem mode (``memory`` false), only its files: its processes are ended at
the pause (a new jail over its filesystem, ``Sandbox.checkpoint()`` and ``rollback()``), and so
they are when a resume asks to reboot. Its deadline does not run until it is resumed, and it keeps
its slot. A fork's children are sandboxes of their own (id, token, deadline). Slots are counted
before a jail is built, so concurrent creates and forks cannot pass the limits. Pause, resume,
fork, snapshot and close of one sandbox take its ``gate`` in turn, so none sees another half done.

A key's E2B snapshots are durable jailbox snapshots (``sandbox/snapshots.py``) in the server user's
store, named ``e2b/<key's tenant>/<sandbox id>/<8 hex>[/<E2B name>]``: the name is the only mark of
which key a snapshot is of and which sandbox it was taken of, so another key never sees, starts from
or removes it, and a restarted server with the same key finds it again. The E2B snapshot id is the
jailbox id (``snap-<12 hex>``); an E2B name is kept as given (``_`` stored as ``+``, which a name
may not hold), and several snapshots may carry one name (the newest answers to it).

A sandbox's network is the server's ``--network``, or what its caller asked for within it
(``network.py``): a pooled jail narrowed before it is handed out, or one of another mode built cold.
The ask is kept with the sandbox, for its fork's children and across a stop.

A sandbox paused when the server stops is kept (``dormant.py``): a snapshot named
``e2b/<tenant>/<sandbox id>/resume`` and a record; the next server with the key file starts a jail
from it, paused, under the same id and token, and removes both once that sandbox is closed.
"""

from __future__ import annotations

import builtins
import hmac
import math
import re
import secrets
import sys
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TypedDict

from ...sandbox import Limits, NetworkPolicy, Sandbox, SandboxConfig, SandboxPool, Secret, snapshots
from ...sandbox.errors import (
    BranchError,
    ConfigError,
    PauseFailed,
    SandboxClosed,
    SandboxError,
    SnapshotNotFound,
)
from ...sandbox.serving import Store, check_env
from . import dormant, network
from .errors import ServeError
from .fs import Watchers
from .processes import ProcessTable

TEMPLATE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:+-]{0,127}$")
MAX_METADATA = 64
MAX_ENV = 256
MAX_TEXT = 4096
MAX_POOLS = 4
MAX_FORK = 20
"""Children one fork request may ask for (the E2B SDK's own bound)."""
MAX_KEY_SNAPSHOTS = 64
"""Snapshots one key keeps at once (each holds a copy of what its sandbox wrote, on the server's disk)."""
SNAPSHOT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,63}$")
"""An E2B snapshot name (``my-snapshot``, ``team/my-snapshot:v1``; ``_`` too, checked apart): 64
characters at most, so the jailbox name it goes into stays within its 128."""
SDK_DEFAULT = "base"
E2B_TEMPLATE = "e2b-base"
"""The stored tree (``rootfs/e2b-base.yaml``) that E2B's ``base`` template means where the server has it."""
E2B_USER = "user"
"""Whom a sandbox of ``E2B_TEMPLATE`` runs commands as by default, as E2B's base template (uid 1000)."""


@dataclass(frozen=True)
class Kept:
    """One of a key's snapshots, as the E2B API shows it."""

    id: str  # the jailbox snapshot id, which is the E2B snapshot id
    name: str | None  # the E2B name it was given
    sandbox_id: str  # the served sandbox it was taken of


@dataclass
class Served:
    id: str
    owner: str
    template: str
    metadata: dict[str, str]
    access_token: str
    sandbox: Sandbox
    started: datetime
    deadline: float  # time.monotonic() at which the reaper closes (or pauses) it; inf while paused
    end_at: datetime  # the deadline on the wall clock, to the second, as reported: stable between reports
    procs: ProcessTable
    envs: dict[str, str]
    auto_pause: bool = False  # at the deadline: paused, not closed
    auto_pause_memory: bool = True  # that pause keeps the processes (False: filesystem mode)
    pause_mode: str = "full"  # of its last pause: "full" (processes kept) or "filesystem"
    auto_resume: bool = False  # a daemon request to it while paused resumes it
    left: float | None = None  # seconds of its lifetime left when it was paused; None while it runs
    restored: str | None = None  # the snapshot a restarted server started it from (removed with it)
    kept: bool = False  # its record now names a newer snapshot, taken as the server stopped
    gate: threading.Lock = field(default_factory=threading.Lock)
    watchers: Watchers = field(default_factory=Watchers)
    user: str = "root"  # whom its commands run as when a request names nobody
    users_seen: set[str] = field(default_factory=set)  # other users of its tree a request has named
    metadata_used: bool = False  # an upload has set file metadata in it: entries show theirs
    network: dict[str, object] | None = None  # its caller's network ask (``network.Ask.record``); None: --network's
    public_traffic: bool = True  # its ports take requests without its traffic access token (``ports.py``)
    mask_host: str | None = None  # the Host its ports' requests carry instead of the one sent (``${PORT}``)

    def __post_init__(self) -> None:
        self.user = self.sandbox.config.user or "root"

    @property
    def paused(self) -> bool:
        return self.left is not None

    def expire_in(self, seconds: float) -> None:
        """Set the deadline ``seconds`` from now (the caller holds the registry's lock)."""
        self.deadline = time.monotonic() + seconds
        self.end_at = _wall(seconds)


def _wall(seconds: float) -> datetime:
    return datetime.now(timezone.utc).replace(microsecond=0) + timedelta(seconds=round(seconds))


def _strings(value: object, what: str, limit: int) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > limit:
        raise ServeError(400, f'{what} must be an object of at most {limit} strings, e.g. {{"team": "a"}}')
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str) or len(k) > MAX_TEXT or len(v) > MAX_TEXT:
            raise ServeError(400, f"{what} keys and values must be strings of at most {MAX_TEXT} characters")
    return dict(value)


class Shape(TypedDict):
    """What every sandbox a server makes gets from its flags (``SandboxConfig`` fields)."""

    limits: Limits
    network: NetworkPolicy
    secrets: list[Secret]


class Registry:
    """Every served sandbox, with the limits: ``max_total`` in all, ``max_per_key`` per key; ``warm``
    jails kept ready for each template in use (0: none), which do not count against the limits. Each
    sandbox gets the fields of ``shape`` (``jailbox serve``'s flags: its bounds, network and secrets,
    which the E2B API has no way to ask for)."""

    def __init__(
        self,
        max_total: int,
        max_per_key: int,
        default_timeout: int,
        max_timeout: int,
        warm: int,
        shape: Shape,
        paused: Path | None = None,
        owners: Collection[str] = (),
    ) -> None:
        """``paused``: where paused sandboxes are kept across a stop (``dormant.py``; None: they are
        not), of which those of ``owners`` (the keys' tenants) are served again now."""
        self.max_total = max_total
        self.shape = shape
        self.warm = warm
        self.pools: dict[tuple[str, bool], SandboxPool] = {}  # by template, and whether they run a kernel
        self.max_per_key = max_per_key
        self.default_timeout = default_timeout
        self.max_timeout = max_timeout
        self.lock = threading.Condition()
        self.served: dict[str, Served] = {}
        self.reserved: dict[str, int] = {}
        self.snapshot_lock = threading.Lock()
        self.taking: dict[str, int] = {}  # snapshots under way, per key (under snapshot_lock)
        self.paused_dir = paused
        if paused is not None:
            self._restore(paused, set(owners))
        self.closed = False
        self.hinted = False  # the one line on how to get E2B's user model is printed
        self.reaper = threading.Thread(target=self._reap, name="jailbox-serve-reaper", daemon=True)
        self.reaper.start()

    def _timeout(self, value: object, least: int = 1) -> int:
        """A lifetime in seconds from a request; ``least`` 0 lets ``timeout`` 0 mean "expire now"."""
        if value is None:
            return self.default_timeout
        if not isinstance(value, int) or isinstance(value, bool) or not least <= value <= self.max_timeout:
            raise ServeError(400, f"timeout must be whole seconds in {least}..{self.max_timeout}, e.g. 300")
        return value

    def _reserve(self, owner: str, wanted: int) -> int:
        """Take up to ``wanted`` slots for ``owner`` (at least one, else 429 naming the flag); the caller
        gives back with ``_unreserve`` what it did not turn into sandboxes."""
        with self.lock:
            if self.closed:
                raise ServeError(503, "the server is shutting down")
            mine = sum(1 for s in self.served.values() if s.owner == owner) + self.reserved.get(owner, 0)
            total = len(self.served) + sum(self.reserved.values())
            if total >= self.max_total:
                raise ServeError(429, f"the server holds its maximum of {self.max_total} sandboxes (--max-sandboxes)")
            if mine >= self.max_per_key:
                raise ServeError(429, f"this API key holds its maximum of {self.max_per_key} sandboxes (--max-per-key)")
            got = min(wanted, self.max_total - total, self.max_per_key - mine)
            self.reserved[owner] = self.reserved.get(owner, 0) + got
            return got

    def _unreserve(self, owner: str, count: int) -> None:
        with self.lock:
            self.reserved[owner] -= count
            if not self.reserved[owner]:
                del self.reserved[owner]

    def _register(
        self, owner: str, template: str, sandbox: Sandbox, metadata: dict[str, str], envs: dict[str, str], timeout: int
    ) -> Served:
        served = Served(
            id="jb" + secrets.token_hex(10),
            owner=owner,
            template=template,
            metadata=metadata,
            access_token=secrets.token_urlsafe(32),
            sandbox=sandbox,
            started=datetime.now(timezone.utc),
            deadline=time.monotonic() + timeout,
            end_at=_wall(timeout),
            procs=ProcessTable(sandbox, envs),
            envs=envs,
        )
        with self.lock:
            if not self.closed:
                self.served[served.id] = served
                self.lock.notify_all()
                return served
        sandbox.close()
        raise ServeError(503, "the server is shutting down")

    def create(
        self,
        owner: str,
        body: dict,
        network: NetworkPolicy | None = None,
        ask: dict[str, object] | None = None,
        interpreter: bool = False,
    ) -> Served:
        """A sandbox of ``body`` (E2B's create request); ``network`` (None: the server's) is what
        its caller asked for (``ask``, kept for a restart), already held within the server's
        (``network.py``). ``interpreter``: the code-interpreter SDK asked for it, so its code
        interpreter is started at once (warm from a pool of such sandboxes)."""
        template = body.get("templateID")
        kept = None
        if not isinstance(template, str) or not (TEMPLATE_NAME.match(template) or SNAPSHOT_NAME.match(template)):
            raise ServeError(
                400, "templateID must name a stored root filesystem, 'host' or a snapshot (e.g. 'default'), not a path"
            )
        if template == SDK_DEFAULT:  # what the SDK asks for when its caller names no template
            template = next((t for t in (E2B_TEMPLATE, "default") if Store().resolve(t) is not None), "host")
            if template != E2B_TEMPLATE and not self.hinted:
                self.hinted = True
                print(
                    f"jailbox serve: E2B's base template runs as user '{E2B_USER}' in /home/{E2B_USER}; for that, "
                    f"build its tree: jailbox rootfs build {E2B_TEMPLATE} (now base is {template!r}, as root)",
                    file=sys.stderr,
                )
        if template != "host" and (not TEMPLATE_NAME.match(template) or Store().resolve(template) is None):
            # a stored root filesystem's name wins over a snapshot's; a name neither has would be
            # tried as a directory relative to the server's cwd
            kept = self.find_snapshot(owner, template)
            if kept is None:
                raise ServeError(
                    400,
                    f"templateID {template!r} is neither a stored root filesystem (jailbox rootfs list; or use "
                    "'host') nor a snapshot of this key",
                )
        timeout = self._timeout(body.get("timeout"))
        metadata = _strings(body.get("metadata"), "metadata", MAX_METADATA)
        envs = _strings(body.get("envVars"), "envVars", MAX_ENV)
        try:
            check_env(envs)
        except ValueError as exc:
            raise ServeError(400, f'envVars: {exc} (e.g. {{"DEBUG": "1"}})') from None
        auto_pause, auto_pause_memory, auto_resume = _lifecycle(body)
        self._reserve(owner, 1)
        try:
            try:
                if kept is not None:
                    sandbox, template = Sandbox(snapshot=kept.id, **self._shaped(network)), kept.id
                else:
                    sandbox = self._sandbox(template, network, interpreter)
            except (SandboxError, ValueError) as exc:
                raise ServeError(400, f"cannot create a sandbox from templateID {template!r}: {exc}") from None
            served = self._register(owner, template, sandbox, metadata, envs, timeout)
            served.auto_pause, served.auto_pause_memory, served.auto_resume = auto_pause, auto_pause_memory, auto_resume
            served.network = ask
            return served
        finally:
            self._unreserve(owner, 1)

    def _snapshot_prefix(self, owner: str) -> str:
        return f"e2b/{owner[:16]}/"

    def snapshots(self, owner: str) -> list[Kept]:
        """The key's snapshots, newest first."""
        prefix = self._snapshot_prefix(owner)
        kept = []
        for snap in snapshots.list():
            if snap.name is None or not snap.name.startswith(prefix):
                continue
            parts = snap.name[len(prefix) :].split("/", 2)  # sandbox id, random, E2B name
            if len(parts) >= 2 and parts[1] != "resume":  # not one kept of a paused sandbox at a stop
                kept.append(Kept(snap.id, parts[2].replace("+", "_") if len(parts) == 3 else None, parts[0]))
        return kept

    def find_snapshot(self, owner: str, ref: str) -> Kept | None:
        """The key's newest snapshot whose id or E2B name is ``ref``."""
        return next((k for k in self.snapshots(owner) if ref in (k.id, k.name)), None)

    def snapshot(self, owner: str, sandbox_id: str, name: object) -> Kept:
        """Keep a sandbox's filesystem as a durable snapshot of the key (its processes are not kept)."""
        if name is not None and (
            not isinstance(name, str) or not SNAPSHOT_NAME.match(name.replace("_", "-")) or snapshots.ID.fullmatch(name)
        ):
            raise ServeError(
                400, "name must be up to 64 letters, digits and ._:/- (not a snap- id), e.g. 'repo-ready:v1'"
            )
        served = self.get(owner, sandbox_id)
        with self.snapshot_lock:  # not the registry's lock: the count reads the store
            taking = self.taking.get(owner, 0)
            if taking + len(self.snapshots(owner)) >= MAX_KEY_SNAPSHOTS:
                raise ServeError(
                    429, f"this API key keeps its maximum of {MAX_KEY_SNAPSHOTS} snapshots: delete_snapshot one first"
                )
            self.taking[owner] = taking + 1
        try:
            tag = f"{self._snapshot_prefix(owner)}{served.id}/{secrets.token_hex(4)}"
            with served.gate:
                with self.lock:
                    if self.served.get(served.id) is not served:
                        raise ServeError(404, f"sandbox {served.id} was not found")
                try:
                    snap = served.sandbox.snapshot(tag + (f"/{name.replace('_', '+')}" if name else ""))
                except (SandboxError, OSError) as exc:
                    raise ServeError(500, f"sandbox {served.id} could not be snapshotted: {exc}") from None
            return Kept(snap.id, name if isinstance(name, str) else None, served.id)
        finally:  # once it is in the store, where the next count sees it
            with self.snapshot_lock:
                self.taking[owner] -= 1
                if not self.taking[owner]:
                    del self.taking[owner]

    def delete_snapshot(self, owner: str, ref: str) -> None:
        """Remove the key's snapshots that ``ref`` names (an id: one; an E2B name: every one of it)."""
        gone = [k for k in self.snapshots(owner) if ref in (k.id, k.name)]
        if not gone:
            raise ServeError(404, f"snapshot {ref} was not found")
        busy = []
        for kept in gone:
            try:
                snapshots.remove(kept.id)
            except SnapshotNotFound:  # removed meanwhile
                pass
            except BranchError:
                busy.append(kept.id)
        if busy:
            raise ServeError(409, f"snapshot {', '.join(busy)} is in use by a running sandbox: kill it first")

    def _sandbox(self, template: str, network: NetworkPolicy | None = None, interpreter: bool = False) -> Sandbox:
        """A jail of ``template``: from its warm pool if it has one. A template gets a pool (up to
        ``MAX_POOLS`` of them) once a sandbox of it has been built, so a name that builds nothing
        never holds jails; with ``interpreter``, a pool of its own whose sandboxes have their code
        interpreter started (a kernel each, so only for the code-interpreter SDK's creates), and a
        sandbox built cold starts its interpreter at once, while the create is answered. ``network``
        of the server's mode narrows a pooled jail's rules before anything of the caller runs in it
        (the pool's kernel uses unix sockets only); of another mode (``none``, or ``allow`` under
        ``full``) it is built cold, and starts no pool."""
        ceiling = self.shape["network"]
        key = (template, interpreter)
        if network is not None and network.mode != ceiling.mode:
            sandbox = Sandbox(self._config(template, self._shaped(network)))
            return self._started(sandbox) if interpreter else sandbox
        with self.lock:
            pool = self.pools.get(key)
        sandbox = pool.acquire() if pool is not None else Sandbox(self._config(template, self.shape))
        if network is not None and network != ceiling:
            try:
                sandbox.set_network(network)
            except BaseException:
                sandbox.close()
                raise
        if interpreter:
            self._started(sandbox)  # a pool's runs already (unless the pool was empty): then this starts it
        if pool is not None:
            return sandbox
        config = self._config(template, self.shape)
        if self.warm:
            with self.lock:
                if key not in self.pools and len(self.pools) < MAX_POOLS and not self.closed:
                    self.pools[key] = SandboxPool(self.warm, config, interpreter=interpreter)
        return sandbox

    @staticmethod
    def _started(sandbox: Sandbox) -> Sandbox:
        try:
            sandbox.start_interpreter()
        except BaseException:
            sandbox.close()
            raise
        return sandbox

    def _shaped(self, network: NetworkPolicy | None) -> Shape:
        """The server's shape with ``network`` (None: the server's own)."""
        return Shape(
            limits=self.shape["limits"], network=network or self.shape["network"], secrets=self.shape["secrets"]
        )

    @staticmethod
    def _config(template: str, shape: Shape) -> SandboxConfig:
        if template == E2B_TEMPLATE:  # as E2B's base template: its user, starting in its home
            return SandboxConfig(rootfs=template, **shape, user=E2B_USER, workdir=f"/home/{E2B_USER}")
        return SandboxConfig(rootfs=template, **shape)

    def set_network(self, owner: str, sandbox_id: str, network: NetworkPolicy, ask: dict[str, object]) -> None:
        """What a running (or paused) sandbox may reach from now on (``network``, held within the
        server's by ``network.py``); ``ask`` is kept for a restart. 409 if its mode would change."""
        served = self.get(owner, sandbox_id)
        with served.gate:
            with self.lock:
                if self.served.get(served.id) is not served:
                    raise ServeError(404, f"sandbox {served.id} was not found")
            try:
                served.sandbox.set_network(network)
            except ConfigError as exc:
                raise ServeError(409, str(exc)) from None
            except SandboxClosed:
                raise ServeError(404, f"sandbox {served.id} was not found") from None
            served.network = ask

    def get(self, owner: str, sandbox_id: str) -> Served:
        with self.lock:
            served = self.served.get(sandbox_id)
        if served is None or served.owner != owner:
            raise ServeError(404, f"sandbox {sandbox_id} was not found")
        return served

    def by_token(self, sandbox_id: str, token: str | None, wake: bool = False) -> Served | None:
        """The sandbox an envd request names, if its access token matches. A paused one is None (as
        missing) unless it resumes on traffic (``autoResume``): then ``wake`` resumes it."""
        with self.lock:
            served = self.served.get(sandbox_id)
        if served is None or token is None or not hmac.compare_digest(served.access_token.encode(), token.encode()):
            return None
        if served.paused:
            if not served.auto_resume:
                return None
            if wake:
                try:
                    self._resume(served, None)
                except ServeError:  # closed meanwhile
                    return None
        return served

    def list(self, owner: str) -> list[Served]:
        with self.lock:
            return [s for s in self.served.values() if s.owner == owner]

    def set_timeout(self, owner: str, sandbox_id: str, value: object, extend_only: bool = False) -> Served:
        """A new lifetime from now (``extend_only``: only if later than the one it has). 0 expires it
        at once. A paused sandbox gets it as what is left once it resumes."""
        timeout = self._timeout(value, least=1 if extend_only else 0)
        served = self.get(owner, sandbox_id)
        with self.lock:
            if served.left is not None:
                served.left = max(served.left, timeout) if extend_only else timeout
                served.end_at = _wall(served.left)
            elif not extend_only or time.monotonic() + timeout > served.deadline:
                served.expire_in(timeout)
            self.lock.notify_all()
        return served

    def pause(self, owner: str, sandbox_id: str, memory: bool) -> bool:
        """Pause a sandbox, its processes kept or (``memory`` False) ended; False if it was paused already."""
        return self._pause(self.get(owner, sandbox_id), memory)

    def _fresh(self, served: Served) -> None:
        """End every process of a sandbox, its files kept: a new jail over its filesystem now (the
        caller holds its gate). Its commands' numbers start again."""
        served.procs.kill_all()
        cut = served.sandbox.checkpoint()
        try:
            served.sandbox.rollback(cut)
        finally:
            cut.drop()
        served.procs = ProcessTable(served.sandbox, served.envs)

    def _pause(self, served: Served, memory: bool) -> bool:
        with served.gate:
            with self.lock:
                if self.served.get(served.id) is not served:
                    raise ServeError(404, f"sandbox {served.id} was not found")
                if served.paused:
                    return False
            try:
                if not memory:
                    self._fresh(served)
                served.sandbox.pause()
            except PauseFailed as exc:
                raise ServeError(500, f"sandbox {served.id} could not be paused, it runs on: {exc}") from None
            except SandboxClosed as exc:
                raise ServeError(409, f"sandbox {served.id} cannot be paused: {exc}") from None
            except SandboxError as exc:  # the filesystem could not be cut
                raise ServeError(500, f"sandbox {served.id} could not be paused in filesystem mode: {exc}") from None
            with self.lock:
                served.left = max(0.0, served.deadline - time.monotonic())
                served.deadline = math.inf
                served.pause_mode = "full" if memory else "filesystem"
            return True

    def connect(self, owner: str, sandbox_id: str, timeout: object, reboot: bool = False) -> tuple[Served, bool]:
        """A sandbox connected to, resumed if it was paused (then True): its id and token stay;
        ``reboot`` resumes it with fresh processes. ``timeout`` only ever extends its lifetime."""
        served = self.get(owner, sandbox_id)
        seconds = None if timeout is None else self._timeout(timeout)
        if self._resume(served, seconds, reboot):
            return served, True
        if seconds is not None:
            self.set_timeout(owner, sandbox_id, seconds, extend_only=True)
        return served, False

    def _resume(self, served: Served, seconds: int | None, reboot: bool = False) -> bool:
        """Resume a paused sandbox (``reboot``: with fresh processes); False if it was running. Its
        lifetime goes on from what was left, or ``seconds`` if longer; one paused at its deadline
        gets ``seconds`` or the default."""
        with served.gate:
            with self.lock:
                if self.served.get(served.id) is not served:
                    raise ServeError(404, f"sandbox {served.id} was not found")
                if served.left is None:
                    return False
            if reboot and served.pause_mode == "full":
                try:
                    self._fresh(served)  # the new jail runs: the paused one is retired
                except SandboxError as exc:
                    raise ServeError(500, f"sandbox {served.id} could not be rebooted: {exc}") from None
            else:
                served.sandbox.resume()
            with self.lock:
                left = served.left or float(seconds or self.default_timeout)
                served.left = None
                served.expire_in(max(left, seconds or 0))
                self.lock.notify_all()
            return True

    def fork(self, owner: str, sandbox_id: str, count: object, timeout: object) -> builtins.list[Served | ServeError]:
        """``count`` new sandboxes from ``sandbox_id``'s filesystem now, each with its own id, token and
        lifetime (``timeout``), its metadata and variables; the source keeps its id and lifetime. A
        child past the server's or the key's limit is an error in its place."""
        if count is None:
            count = 1
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_FORK:
            raise ServeError(400, f"count must be a whole number in 1..{MAX_FORK}, e.g. 2")
        seconds = self._timeout(timeout)
        served = self.get(owner, sandbox_id)
        got = self._reserve(owner, count)
        try:
            with served.gate:
                with self.lock:
                    if self.served.get(served.id) is not served:
                        raise ServeError(404, f"sandbox {served.id} was not found")
                if served.paused:
                    raise ServeError(409, f"sandbox {served.id} is paused and cannot be forked; resume it first")
                try:
                    children = served.sandbox.fork(got)
                except (SandboxError, OSError) as exc:
                    raise ServeError(500, f"sandbox {served.id} could not be forked: {exc}") from None
            made: builtins.list[Served | ServeError] = [
                self._register(owner, served.template, child, dict(served.metadata), dict(served.envs), seconds)
                for child in children
            ]
            for child_served in made:  # a child has its source's network (``fork`` gives it the config)
                if isinstance(child_served, Served):
                    child_served.network = served.network
        finally:
            self._unreserve(owner, got)
        limit = ServeError(
            429, "the server or this API key holds its maximum of sandboxes (--max-sandboxes, --max-per-key)"
        )
        return made + [limit] * (count - got)

    def kill(self, owner: str, sandbox_id: str) -> None:
        served = self.get(owner, sandbox_id)
        self._close(served)

    def _close(self, served: Served) -> None:
        with self.lock:
            if self.served.get(served.id) is not served:
                return
            del self.served[served.id]
        with served.gate:  # a pause or fork under way ends first
            pass
        try:
            served.watchers.close()
            served.procs.kill_all(f"sandbox {served.id} was killed")
        finally:  # closing the jail kills whatever is left in it
            served.sandbox.close()
            if served.restored is not None:
                try:
                    snapshots.remove(served.restored)
                except SandboxError:  # gone already, or another jail of this user holds it
                    pass
            if self.paused_dir is not None and not served.kept:
                dormant.forget(self.paused_dir, served.id)

    def _keep(self, paused: Path, served: Served) -> None:
        """Keep a paused sandbox for the next server: its filesystem, then its record."""
        with served.gate:
            snap = served.sandbox.snapshot(f"{self._snapshot_prefix(served.owner)}{served.id}/resume")
        record = dormant.Record(
            id=served.id,
            owner=served.owner,
            access_token=served.access_token,
            template=served.template,
            metadata=served.metadata,
            envs=served.envs,
            auto_pause=served.auto_pause,
            auto_pause_memory=served.auto_pause_memory,
            auto_resume=served.auto_resume,
            left=served.left or 0.0,
            started=served.started.isoformat(),
            snapshot=snap.id,
            network=served.network,
        )
        try:
            dormant.keep(paused, record)
        except OSError:
            snapshots.remove(snap.id)
            raise
        served.kept = True

    def _restore(self, paused: Path, owners: set[str]) -> None:
        """Serve again, paused, the sandboxes a stopped server kept, within the limits; a record of
        another key file, past the limits, or whose jail cannot be started stays on disk."""
        for record in dormant.load(paused):
            mine = sum(1 for s in self.served.values() if s.owner == record.owner)
            if record.owner not in owners or len(self.served) >= self.max_total or mine >= self.max_per_key:
                continue
            try:
                metadata = _strings(record.metadata, "metadata", MAX_METADATA)
                envs = _strings(record.envs, "envVars", MAX_ENV)
                started = datetime.fromisoformat(record.started)
                sandbox = Sandbox(snapshot=record.snapshot, **self._shaped(self._restored_network(record.network)))
            except SnapshotNotFound:  # its filesystem is gone: nothing left to resume
                dormant.forget(paused, record.id)
                continue
            except (ServeError, SandboxError, ValueError):
                continue
            try:
                sandbox.pause()
            except SandboxError:
                sandbox.close()
                continue
            self.served[record.id] = Served(
                id=record.id,
                owner=record.owner,
                template=record.template,
                metadata=metadata,
                access_token=record.access_token,
                sandbox=sandbox,
                started=started,
                deadline=math.inf,
                end_at=_wall(record.left),
                procs=ProcessTable(sandbox, envs),
                envs=envs,
                auto_pause=record.auto_pause,
                auto_pause_memory=record.auto_pause_memory,
                pause_mode="filesystem",  # its processes ended with the server that kept it
                auto_resume=record.auto_resume,
                left=record.left,
                restored=record.snapshot,
                network=record.network,
            )

    def _restored_network(self, ask: dict[str, object] | None) -> NetworkPolicy:
        """A kept sandbox's network, asked again under this server's ``--network`` (which may be
        narrower now: then ``ServeError``, and the record stays on disk)."""
        if ask is None:
            return self.shape["network"]
        wanted = network.ask(ask.get("allow_internet_access"), ask.get("allowOut"), ask.get("denyOut"), "")
        return network.policy(wanted, self.shape["network"])

    def _reap(self) -> None:
        while True:
            with self.lock:
                if self.closed:
                    return
                now = time.monotonic()
                due = [s for s in self.served.values() if s.deadline <= now]
                if not due:
                    nxt = min((s.deadline for s in self.served.values() if not s.paused), default=now + 60)
                    self.lock.wait(max(0.05, nxt - now))
                    continue
            for served in due:
                try:
                    if served.auto_pause:
                        try:
                            self._pause(served, served.auto_pause_memory)
                            continue
                        except Exception:  # it could not be paused: closed, as without autoPause
                            pass
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
                if served.paused and self.paused_dir is not None:
                    self._keep(self.paused_dir, served)
            except Exception:  # not kept: it is closed as a running one is
                pass
            try:
                self._close(served)
            except Exception:  # one that fails to close must not keep the others open
                pass
        for pool in self.pools.values():
            pool.close()


def _lifecycle(body: dict) -> tuple[bool, bool, bool]:
    """``autoPause``, ``autoPauseMemory`` and ``autoResume`` of a create request (``lifecycle=`` in the SDK)."""
    auto_pause = body.get("autoPause")
    if auto_pause is None:
        auto_pause = False
    if not isinstance(auto_pause, bool):
        raise ServeError(400, 'autoPause must be true or false, e.g. {"autoPause": true}')
    memory = body.get("autoPauseMemory")
    if memory is not None and not isinstance(memory, bool):
        raise ServeError(400, 'autoPauseMemory must be true or false, e.g. {"autoPauseMemory": true}')
    if memory is not None and not auto_pause:
        raise ServeError(400, 'autoPauseMemory needs autoPause: true (lifecycle on_timeout="pause")')
    memory = True if memory is None else memory
    resume = body.get("autoResume")
    if resume is None:
        return auto_pause, memory, False
    if not isinstance(resume, dict) or set(resume) - {"enabled"} or not isinstance(resume.get("enabled"), bool):
        raise ServeError(400, 'autoResume must be an object with a boolean "enabled", e.g. {"enabled": true}')
    if resume["enabled"] and not auto_pause:
        raise ServeError(400, 'autoResume needs autoPause: true (lifecycle on_timeout="pause")')
    return auto_pause, memory, resume["enabled"]
